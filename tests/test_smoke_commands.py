"""Every documented command, run as a user types it: ``bin/agentflow …`` in a subprocess, on the tiny config.

Each command runs in a fresh shell environment (no PYTHONPATH, no tracking or Prefect URL) from a
temporary folder that stands in for the checkout: ``configs/`` (the relative defaults such as
``configs/envs`` and ``configs/real_envs``), a tiny ``params.yaml`` (tests/tiny.py) whose ``data/``
and ``.agentflow/`` live in that folder, so nothing is written into the repository. Each test
checks the exit code (0, or the documented one for a documented error) and the outputs the docs
name (``data/bench/<name>.json``, the regenerated ``BENCHMARKS.md``, the files a command writes).
Benchmarks run at their smallest documented sizes; those that need Ray, PostgreSQL, Chromium or a
Prefect server are ``slow`` (they still run in CI, ``make test``).

Where this module does not run a command itself, ``ELSEWHERE`` names the test that runs it as
typed, and :func:`test_every_command_is_run_here_or_by_a_named_test` checks that the named test
still contains the invocation, so the set of commands run in CI is checked against
``agentflow --help`` mechanically:

- ``run`` and ``reproduce`` (beyond the unknown-run error here): tests/test_dvc.py runs
  ``bin/agentflow run`` on the tiny cycle (killed, then ``--resume``) and ``bin/agentflow reproduce``
  on its run; a second tiny cycle here would add ~80 s.
- the phase commands (``calibrate`` … ``report``): tests/test_dvc.py's ``dvc repro --force`` runs
  each as ``bin/agentflow <phase> --params params.yaml`` (dvc.yaml's ``cmd``) and checks every
  phase's metrics; ``variants`` and ``explore`` also run here (a few seconds each).
- ``deploy``: tests/test_deploy.py, against a real ``prefect server start`` and worker.
- ``bench learning`` and ``bench forgetting``: tests/test_bench_learning.py and
  tests/test_bench_forgetting.py invoke the command on the tiny config.
- ``bench train``, ``bench tune`` and ``bench all`` run here at their smallest documented sizes
  (``--quick``, ``--no-cluster``), on the tiny config with two env workers (the Ray side needs one):
  ``bench all --quick`` runs every part once more, so its own test checks only what it adds.

Make targets (:func:`test_make_targets`): ``clean`` and ``install`` run for real in a temporary
copy (``install`` with its stamp up to date, so nothing is reinstalled); ``test``, ``test-fast``,
``test-timing`` and ``lint`` are shown with ``make -n`` (``make test`` inside the suite would run
the suite again; .ci/run runs ``make lint`` and ``make test`` themselves); ``run``, ``bench`` and
``lock`` are whole-pipeline commands (``agentflow run``, ``agentflow bench all --repeat 3``,
``dvc repro``) whose ``make -n`` must be exactly those commands, run above or by tests/test_dvc.py.
``clean-state`` deletes the project's history and is not run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from tests.test_cli_docs import cli_commands
from tests.tiny import REPO, tiny_params

AGENTFLOW = str(REPO / "bin" / "agentflow")
# command -> (test file, text of the invocation it must contain) for commands run by other tests
ELSEWHERE: dict[tuple[str, ...], tuple[str, str]] = {
    ("run",): ("tests/test_dvc.py", '["bin/agentflow", "run", "--params", "params.yaml"]'),
    ("deploy",): ("tests/test_deploy.py", '"agentflow"), "deploy"'),
    **{
        (phase,): ("dvc.yaml", f"cmd: bin/agentflow {phase} --params params.yaml")
        for phase in ("calibrate", "offline", "export-minari", "validator", "tune", "train", "stress", "report")
    },
    ("bench", "learning"): ("tests/test_bench_learning.py", 'bench_app, ["learning", "--params"'),
    ("bench", "forgetting"): ("tests/test_bench_forgetting.py", 'bench_app, ["forgetting", "--params"'),
    ("process", "new"): ("tests/test_process_new.py", 'app, ["process", "new", NAME]'),
    ("process", "forms"): ("tests/test_machine_forms.py", 'app, ["process", "forms", "formless"]'),
}
# command -> the test of this module that runs it
HERE: dict[tuple[str, ...], str] = {
    ("validate",): "test_validate",
    ("variants",): "test_variants_and_explore",
    ("explore",): "test_variants_and_explore",
    ("reproduce",): "test_reproduce_names_an_unknown_run",
    ("serve",): "test_serve",
    ("profile-envs",): "test_profile_envs",
    ("envs", "list"): "test_envs",
    ("envs", "check"): "test_envs",
    ("envs", "from-openapi"): "test_envs",
    ("bench", "scheduler"): "test_bench_scheduler",
    ("bench", "pool"): "test_bench_pool",
    ("bench", "ppo"): "test_bench_ppo",
    ("bench", "sql"): "test_bench_sql",
    ("bench", "browser"): "test_bench_browser",
    ("bench", "oscar"): "test_bench_oscar",
    ("bench", "offline"): "test_bench_offline",
    ("bench", "onboarding"): "test_bench_onboarding",
    ("bench", "soak"): "test_bench_soak",
    ("bench", "validator"): "test_bench_validator",
    ("bench", "train"): "test_bench_train",
    ("bench", "tune"): "test_bench_tune",
    ("bench", "all"): "test_bench_all",
    ("bench", "transfer"): "test_bench_transfer",
}


def shell_env() -> dict[str, str]:
    """A fresh shell's environment: no PYTHONPATH, no virtualenv, tracking URI or Prefect API."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "MLFLOW_TRACKING_URI", "PREFECT_API_URL", "PREFECT_HOME"):
        env.pop(key, None)
    return env


def agentflow(cwd: Path, *args: str, expect: int = 0, timeout: float = 600) -> str:
    """Run ``bin/agentflow ARGS`` in ``cwd``; assert its exit code; return stdout and stderr."""
    proc = subprocess.run([AGENTFLOW, *args], cwd=cwd, env=shell_env(), capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    assert proc.returncode == expect, f"agentflow {' '.join(args)} exited {proc.returncode}:\n{output[-4000:]}"
    assert "Traceback (most recent call last)" not in output, output[-4000:]
    return output


def bench_json(root: Path, name: str) -> dict:
    """``data/bench/<name>.json`` as the command wrote it, after checking BENCHMARKS.md was regenerated."""
    assert (root / "BENCHMARKS.md").is_file()
    return json.loads((root / "data" / "bench" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the commands run in: configs/ of the repository, a tiny params.yaml, its own data/; the
    channel benchmarks' reference workload (params-checkout.yaml) is the same tiny checkout cycle."""
    root = tmp_path_factory.mktemp("smoke")
    (root / "configs").symlink_to(REPO / "configs")
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(root)))
    (root / "params-checkout.yaml").write_text(yaml.safe_dump(tiny_params(root)))
    return root


@pytest.fixture(scope="module")
def two_workers(checkout: Path) -> str:
    """A params file in the checkout like its params.yaml, with two env workers (the Ray backend needs one)."""
    (checkout / "params-workers.yaml").write_text(yaml.safe_dump(tiny_params(checkout, pool={"num_workers": 2})))
    return "params-workers.yaml"


def test_every_command_is_run_here_or_by_a_named_test() -> None:
    assert set(HERE) | set(ELSEWHERE) == cli_commands()
    assert not set(HERE) & set(ELSEWHERE)
    for command, test_name in HERE.items():
        assert callable(globals().get(test_name)), f"{command}: no test {test_name} in this module"
    for command, (path, invocation) in ELSEWHERE.items():
        assert invocation in (REPO / path).read_text(encoding="utf-8"), f"{command}: {path} no longer runs it"


def test_validate(checkout: Path) -> None:
    output = agentflow(checkout, "validate")
    assert "AgentFlow cycle run=tiny" in output and "gate:" in output


def test_reproduce_names_an_unknown_run(checkout: Path) -> None:
    """The documented error path (the full reproduction: tests/test_dvc.py): exit 2, one line naming the run."""
    output = agentflow(checkout, "reproduce", "0" * 32, expect=2)
    assert f"no run {'0' * 32}" in output


def test_envs(checkout: Path, tmp_path: Path) -> None:
    assert "web_checkout_v2" in agentflow(checkout, "envs", "list")
    agentflow(checkout, "envs", "check")
    for command in ("list", "check"):  # a missing config dir: one line, exit 2 (a registry error)
        missing = agentflow(checkout, "envs", command, "--config-dir", str(tmp_path / "nope"), expect=2)
        assert "config directory does not exist" in missing
    out_dir = tmp_path / "envs"
    spec = REPO / "tests" / "data" / "shop_openapi.yaml"
    agentflow(checkout, "envs", "from-openapi", str(spec), "--family", "shop_api", "--out-dir", str(out_dir))
    assert any(out_dir.glob("*.yaml"))
    assert "shop_api" in agentflow(checkout, "envs", "list", "--config-dir", str(out_dir))


def test_profile_envs(checkout: Path) -> None:
    agentflow(checkout, "profile-envs", "--per-family", "1", "--steps", "10", "--mem-envs", "2")
    records = json.loads((checkout / "data" / "bench" / "env_profile.json").read_text())
    assert records and {"family", "env_id", "step_p50_ms"} <= set(records[0])
    assert (checkout / "data" / "bench" / "env_profile.csv").is_file()


def test_bench_scheduler(checkout: Path) -> None:
    output = agentflow(checkout, "bench", "scheduler", "--n-variants", "50", "--draws", "2000")
    result = bench_json(checkout, "scheduler")
    assert {"round_robin", "plr_coverage"} <= set(result["strategies"])
    assert "Scheduler strategies" in output and "Scheduler strategies" in (checkout / "BENCHMARKS.md").read_text()


@pytest.mark.slow
@pytest.mark.bench
def test_bench_pool(checkout: Path) -> None:
    """All variants live at once (not extrapolated), every target judged; the Ray side on 2 workers."""
    agentflow(checkout, "bench", "pool", "--num-envs", "8", "--steps", "5")
    result = bench_json(checkout, "pool")
    assert result["all_live_7200_extrapolated"] is False
    assert result["all_live_7200_envs"] == result["n_variants"] > 0
    assert set(result["targets_met"]) == set(result["targets"])
    assert result["overhead_trajectory_match"] == 1.0 and result["recovery_steps_lost"] >= 0


@pytest.mark.slow
def test_bench_ppo(checkout: Path) -> None:
    agentflow(checkout, "bench", "ppo", "--quick")
    result = bench_json(checkout, "ppo")
    assert result["ours_sps"] > 0 and result["sb3_sps"] > 0 and result["update_s_2048"] > 0


@pytest.mark.slow
def test_bench_sql(checkout: Path) -> None:
    agentflow(checkout, "bench", "sql", "--episodes", "10")
    result = bench_json(checkout, "sql")
    assert result["episodes"] == 10
    assert result["sqlite_process_success"] == result["postgresql_process_success"] > 0


@pytest.mark.slow
def test_bench_browser(checkout: Path) -> None:
    args = ("--episodes", "1", "--live-envs", "1", "--gap-episodes", "1", "--checkpoint", "expert")
    agentflow(checkout, "bench", "browser", *args)
    result = bench_json(checkout, "browser")
    assert result["policy"].startswith("expert") and result["live_envs_stepped"] == 1
    assert result["browser_step_p50_ms"] > 0


@pytest.mark.slow
def test_bench_oscar(checkout: Path) -> None:
    agentflow(checkout, "bench", "oscar", "--episodes", "1")
    result = bench_json(checkout, "oscar")
    assert result["episodes"] == 1 and result["steps"] == 6  # the expert's six actions place the order
    assert result["oscar_step_p50_ms"] > 0 and result["oscar_reset_p50_ms"] > 0


@pytest.mark.slow
def test_bench_offline(checkout: Path) -> None:
    agentflow(checkout, "bench", "offline", "--steps", "1024", "--settings", "expert:64")
    result = bench_json(checkout, "offline")
    assert list(result["settings"]) == ["expert_64"]
    assert 0.0 <= result["expert_64/bc/start_test_process_success"] <= 1.0


@pytest.mark.slow
def test_bench_onboarding(checkout: Path) -> None:
    agentflow(checkout, "bench", "onboarding", "--repeat", "1", "--seeds", "1")
    result = bench_json(checkout, "onboarding")
    assert result["onboarded_env_first_episode_succeeds"] is True
    assert result["spec_to_trainable_env_p50_s"] > 0


@pytest.mark.slow
def test_bench_soak(checkout: Path) -> None:
    agentflow(checkout, "bench", "soak", "--seconds", "1", "--num-envs", "8", "--n-variants", "8")
    result = bench_json(checkout, "soak")
    assert result["num_envs"] == 8 and result["clean_env_steps_per_s"] > 0 and result["faulty_variants"]


@pytest.mark.slow
def test_bench_validator(checkout: Path) -> None:
    agentflow(checkout, "bench", "validator", "--episodes", "8", "--train-steps", "0")
    result = bench_json(checkout, "validator")
    assert result["episodes_per_policy"] == 8 and result["train_steps"] == 0
    assert result["planted_episodes"] > 0 and result["honest_episodes"] > 0


def test_variants_and_explore(checkout: Path) -> None:
    agentflow(checkout, "variants")
    assert any((checkout / "data" / "variants").iterdir())
    agentflow(checkout, "explore")
    assert json.loads((checkout / "data" / "metrics" / "explore.json").read_text())
    assert any((checkout / "data" / "trajectories").iterdir())


def test_bench_tune_names_its_prerequisites(tmp_path: Path) -> None:
    """Without `agentflow variants` and `agentflow explore` first: one line saying so, exit 1 (not a traceback)."""
    (tmp_path / "configs").symlink_to(REPO / "configs")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(tmp_path, pool={"num_workers": 2})))
    output = agentflow(tmp_path, "bench", "tune", "--total-steps", "1024", expect=1)
    assert "run `agentflow variants` and `agentflow explore` first" in output


@pytest.mark.slow
@pytest.mark.bench
def test_bench_train(checkout: Path, two_workers: str) -> None:
    """One `agentflow train` per backend and the kill run, the kill after update 2 (`--quick`)."""
    agentflow(checkout, "bench", "train", "--quick", "--params", two_workers)
    result = bench_json(checkout, "train")
    assert result["side_order"] == ["inprocess", "ray"] and result["kill_after_update"] == 2
    assert result["kill_worker_restarts"] >= 1 and result["same_policy_on_both_backends"] is True
    assert set(result["targets_met"]) == set(result["targets"])
    assert "`agentflow bench train --total-steps 1024 --quick`" in (checkout / "BENCHMARKS.md").read_text()


@pytest.mark.slow
@pytest.mark.bench
def test_bench_tune(checkout: Path, two_workers: str) -> None:
    """Static vs tuned on the params' own two workers only (`--no-cluster`), after its prerequisites."""
    if not (checkout / "data" / "trajectories").is_dir():  # test_variants_and_explore made them, unless deselected
        agentflow(checkout, "variants", "--params", two_workers)
        agentflow(checkout, "explore", "--params", two_workers)
    agentflow(checkout, "bench", "tune", "--no-cluster", "--total-steps", "1024", "--params", two_workers)
    result = bench_json(checkout, "tune")
    assert result["2_workers_static_env_steps_per_s"] > 0 and result["2_workers_tuned"]["choice"]
    assert "cluster_static" not in result and set(result["targets"]) == {"sps_ratio_2_workers"}
    assert "--no-cluster" in (checkout / "BENCHMARKS.md").read_text()


@pytest.mark.slow
@pytest.mark.bench
def test_bench_all(checkout: Path, two_workers: str) -> None:
    """Every benchmark at its smallest size (`--quick`); their own tests above check each part's figures."""
    output = agentflow(checkout, "bench", "all", "--quick", "--params", two_workers)
    names = ("scheduler", "learning", "train", "ppo", "pool", "sql", "browser", "onboarding")
    for name in names:
        assert bench_json(checkout, name)
    assert bench_json(checkout, "pool")["all_live_7200_extrapolated"] is True  # --quick extrapolates
    assert bench_json(checkout, "train")["side_order"] == ["inprocess", "ray"]
    assert "Scheduler strategies" in output


@pytest.mark.slow
def test_bench_transfer(checkout: Path) -> None:
    """Leave one channel out at the smallest step count: a training on all channels and one without each."""
    agentflow(checkout, "bench", "transfer", "--steps", "1024")
    result = bench_json(checkout, "transfer")
    assert result["total_steps_cap"] == 1024 and set(result["held_out"]) == set(result["channels"])
    assert set(result["targets_met"]) == set(result["targets"])


@pytest.mark.slow
def test_serve(checkout: Path) -> None:
    """`agentflow serve` serves the cycle until interrupted (without PREFECT_API_URL, on a temporary API)."""
    log = checkout / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [AGENTFLOW, "serve", "--cron", "0 3 * * *"],
            cwd=checkout,
            env=shell_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 240
    try:
        while "is being served" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        served = "is being served" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError("agentflow serve did not stop within 60 s of Ctrl-C") from None
    output = log.read_text()
    assert served, output[-4000:]
    assert "agentflow-training-cycle/agentflow-cycle" in output


# ------------------------------------------------------------------------------------------------ make
def make(cwd: Path, *args: str) -> str:
    """``make ARGS`` in ``cwd``; asserts exit 0."""
    proc = subprocess.run(["make", *args], cwd=cwd, env=shell_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_make_targets(tmp_path: Path) -> None:
    root = tmp_path / "checkout"
    root.mkdir()
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, root / name)
    (root / "bin").mkdir()
    shutil.copy(REPO / "bin" / "ensure-system-deps", root / "bin" / "ensure-system-deps")  # every install runs it first
    for folder in ("agentflow_core", "tasks", "flows", "tests"):  # where `make clean` looks for bytecode
        (root / folder).mkdir()
    # without the stamp, install would create the venv and pip install the project (shown, not run)
    plan = make(root, "-n", "install")
    assert '-m pip install -q -c constraints.txt -e ".[dev]"' in plan and "touch .venv/.installed" in plan
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / ".installed").touch()
    assert "pip" not in make(root, "install")  # the stamp is newer than pyproject.toml: nothing to do
    expected = {
        "test": '.venv/bin/python -m pytest -q -p no:cacheprovider -m "not timing and not bench"',
        "test-bench": ".venv/bin/python -m pytest -q -p no:cacheprovider -m bench",
        "test-fast": '.venv/bin/python -m pytest -q -m "not slow and not timing"',
        "test-timing": ".venv/bin/python -m pytest -q -p no:cacheprovider -m timing",
        "lint": ".venv/bin/lint-imports",
        "run": ".venv/bin/agentflow run",
        "bench": ".venv/bin/agentflow bench all --repeat 3",
        "lock": ".venv/bin/dvc repro",
        "docs": "NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet",
    }
    for target, command in expected.items():
        plan = make(root, "-n", target)
        assert command in plan.splitlines(), f"make -n {target}:\n{plan}"
        assert "pip install" not in plan
    ci = (REPO / ".ci" / "run").read_text()
    assert "make lint\nmake docs\nmake test\nmake test-bench" in ci  # CI runs these four for real
    # clean: what a rebuild recreates goes, the history stays
    for folder in (".pytest_cache", ".mypy_cache", ".agentflow/phase-cache", "tasks/__pycache__", "data/bench"):
        (root / folder).mkdir(parents=True)
    (root / ".agentflow" / "mlflow.db").write_text("")
    make(root, "clean")
    gone = (".venv", ".pytest_cache", ".mypy_cache", ".agentflow/phase-cache", "tasks/__pycache__")
    assert not any((root / folder).exists() for folder in gone)
    assert (root / ".agentflow" / "mlflow.db").is_file() and (root / "data" / "bench").is_dir()
