"""`dvc repro` in a temporary clone, as the README writes it (`.venv/bin/dvc repro` in a shell whose PATH
holds no virtualenv). One scenario first: `agentflow run` is SIGKILLed mid-training and continued with
`--resume` (records survive: no RUNNING run, one continuous metric history, no orphaned Prefect
server; pickles planted in the state dir's result storage run nothing); `agentflow reproduce` on that
run reports every metric identical; `dvc repro --force` gives the same metrics and checkpoints, and
dvc.lock records the md5s the MLflow run names. Then: a second repro runs nothing, a changed parameter
re-runs only the stages that use it, push/pull go through the local remote, and a failed stress gate
fails the pipeline."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml
from mlflow.tracking import MlflowClient

from tasks.config_io import parse_config
from tasks.lifetime import SERVER_MARKER
from tasks.stages import dvc_md5
from tests.tiny import REPO, tiny_params

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent
DVC = ".venv/bin/dvc"  # as the README writes it, relative to the checkout
UPDATES = 4  # PPO updates of the clone's cycle: killed after the second
PLAIN_PATH = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if Path(p).resolve() != BIN.resolve())
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def shell_env() -> dict[str, str]:
    """A fresh shell's environment: no virtualenv on PATH, no PYTHONPATH, no tracking URI."""
    env = {**os.environ, **GIT_IDENTITY, "PATH": PLAIN_PATH, "DVC_NO_ANALYTICS": "1", "PYTHONUNBUFFERED": "1"}
    for key in ("MLFLOW_TRACKING_URI", "PYTHONPATH", "VIRTUAL_ENV", "PREFECT_API_URL", "PREFECT_HOME"):
        env.pop(key, None)
    return env


def run(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, cwd=cwd, env=shell_env(), capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def stages_run(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of the repository at the code under test, committed (a clean tree), with a tiny params.yaml
    and the virtualenv where `make install` puts it (.venv)."""
    root = tmp_path_factory.mktemp("dvc") / "repo"
    run(["git", "clone", "-q", str(REPO), str(root)], cwd=root.parent)
    params = tiny_params(root, train={"total_steps": 512 * UPDATES})
    params["base"].update({"state_dir": ".agentflow", "data_dir": "data", "env_config_dir": "configs/envs"})
    # the working tree's code (the clone holds the last commit; tests run against the code under test)
    for folder in ("agentflow_core", "tasks", "flows", "configs", "bin"):
        shutil.rmtree(root / folder, ignore_errors=True)
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy(REPO / name, root / name)
    # DVC reads the keys each stage names from the file itself, so write every section in full
    full = parse_config(params).model_dump(mode="json")
    (root / "params.yaml").write_text(yaml.safe_dump(full, sort_keys=False))
    run(["git", "add", "-A"], root)
    run(["git", "commit", "-q", "--allow-empty", "-m", "code under test"], root)
    (root / ".venv").symlink_to(BIN.parent)  # after the commit: a link is not matched by `.venv/` in .gitignore
    return root


def checkpoint_hashes(root: Path) -> dict[str, str]:
    """md5 of every checkpoint's tensors (weights, optimizer, generators) and of the final policy."""
    data = root / "data" / "checkpoints"
    files = sorted(data.glob("checkpoints/update_*/*.safetensors")) + [data / "policy.safetensors"]
    return {str(f.relative_to(data)): dvc_md5(f) for f in files}


def metrics(root: Path) -> dict[str, dict]:
    """Every phase's metrics file, less the wall-clock budget use (measured, never reproduced)."""
    from flows.reproduce import is_timing

    files = sorted((root / "data" / "metrics").glob("*.json"))
    return {f.stem: {k: v for k, v in json.loads(f.read_text()).items() if not is_timing(k)} for f in files}


def kill_mid_training(clone: Path) -> list[psutil.Process]:
    """Start `agentflow run`, SIGKILL it once two updates are checkpointed; returns its Prefect server(s)."""
    first = subprocess.Popen(
        ["bin/agentflow", "run", "--params", "params.yaml"],
        cwd=clone,
        env=shell_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    second_update = clone / "data" / "checkpoints" / "checkpoints" / "update_00000002"
    deadline = time.monotonic() + 600
    while not second_update.exists():
        assert first.poll() is None and time.monotonic() < deadline, "the run ended before its second update"
        time.sleep(0.2)
    servers = [c for c in psutil.Process(first.pid).children() if SERVER_MARKER in " ".join(c.cmdline())]
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    return servers


def plant_pickles(state_dir: Path) -> tuple[Path, set[Path]]:
    """Pickle payloads where Prefect keeps persisted results (``<state_dir>/prefect/storage``): as a result
    record naming the pickle serializer (what a cached task would read) and as bare pickles. Unpickling
    any of them creates the returned marker (tests/test_flow.py shows such a record is live)."""
    import base64
    import pickle

    from tests.test_flow import Touch

    marker, storage = state_dir.parent / "pwned", state_dir / "prefect" / "storage"
    storage.mkdir(parents=True)
    payload = pickle.dumps(Touch(marker))
    record = {"serializer": {"type": "pickle"}, "prefect_version": "3"}
    for name in ("planted", "calibrate", "train", "stress"):
        record["storage_key"] = str(storage / name)
        text = {"metadata": record, "result": base64.encodebytes(payload).decode()}
        (storage / name).write_text(json.dumps(text))
        (storage / f"{name}.pickle").write_bytes(payload)
    return marker, set(storage.iterdir())


def test_killed_run_resumes_reproduces_and_agrees_with_dvc_repro(clone: Path) -> None:
    marker, planted = plant_pickles(clone / ".agentflow")
    servers = kill_mid_training(clone)
    assert servers, "the run had no Prefect temporary server to check"
    _, alive = psutil.wait_procs(servers, timeout=30)
    assert not alive, "the killed run's Prefect server outlived it"
    flow = run(["bin/agentflow", "run", "--params", "params.yaml", "--resume"], clone)
    found = re.search(r"MLflow run ([0-9a-f]{32})", flow.stdout)
    assert found, flow.stdout[-2000:]
    run_id = found[1]
    client = MlflowClient(f"sqlite:///{clone / '.agentflow' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("agentflow").experiment_id])
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    assert [r.info.run_id for r in runs if r.data.tags.get("agentflow.kind") == "cycle"] == [run_id]  # continued
    train = [r for r in runs if r.data.tags.get("agentflow.phase") == "train"]
    assert len(train) == 1 and train[0].data.tags["mlflow.parentRunId"] == run_id
    kl = client.get_metric_history(train[0].info.run_id, "train/losses/approx_kl")
    assert [m.step for m in kl] == [512 * (u + 1) for u in range(UPDATES)]  # every update once, none lost
    # every phase ran (twice, with the resume) beside the planted pickles: none was read, nothing was persisted
    assert not marker.exists() and set((clone / ".agentflow" / "prefect" / "storage").iterdir()) == planted

    by_flow, flow_checkpoints = metrics(clone), checkpoint_hashes(clone)
    assert set(by_flow) == {"calibrate", "variants", "explore", "offline", "validator", "tune", "train", "stress"}
    tags = client.get_run(run_id).data.tags
    assert tags["mlflow.source.git.commit"] == run(["git", "rev-parse", "HEAD"], clone).stdout.strip()
    assert tags["agentflow.git.dirty"] == "false"

    again = run(["bin/agentflow", "reproduce", run_id, "--params", "params.yaml"], clone, check=False)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "values identical" in again.stdout and " NO " not in again.stdout
    assert checkpoint_hashes(clone) == flow_checkpoints

    first = run([DVC, "repro", "--force"], clone)
    assert stages_run(first.stdout) == {
        "calibrate",
        "variants",
        "explore",
        "offline",
        "export-minari",
        "validator",
        "tune",
        "train",
        "stress",
        "report",
    }
    by_dvc = metrics(clone)
    assert by_dvc == by_flow
    assert checkpoint_hashes(clone) == flow_checkpoints
    trained = client.search_runs(
        [client.get_experiment_by_name("agentflow").experiment_id], "tags.`agentflow.kind` = 'train'"
    )
    assert len(trained) == 1 and trained[0].info.status == "FINISHED"  # the DVC stage's `agentflow train` is tracked
    assert trained[0].data.tags["agentflow.policy_hash"] == tags["agentflow.policy_hash"]
    assert trained[0].data.metrics["test_process_success"] == by_flow["train"]["test_process_success"]
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    variants_out = next(o for o in lock["stages"]["variants"]["outs"] if o["path"] == "data/variants")
    assert variants_out["md5"] == dvc_md5(clone / "data" / "variants")  # the hash MLflow tags use is DVC's


def test_a_second_repro_runs_nothing(clone: Path) -> None:
    for out in (
        "calibration/report.json",
        "variants/catalogue.parquet",
        "trajectories/_meta.json",
        "checkpoints/train_summary.json",
        "stress/summary.json",
        "reports/report.html",
    ):
        assert (clone / "data" / out).exists(), out
    assert run([DVC, "status", "-q"], clone, check=False).returncode == 0
    second = run([DVC, "repro"], clone)
    assert stages_run(second.stdout) == set()
    assert "didn't change, skipping" in second.stdout


def test_metrics_and_plots_are_declared(clone: Path) -> None:
    metrics = json.loads(run([DVC, "metrics", "show", "--json"], clone).stdout)
    flat = json.dumps(metrics)
    for key in ("env_stability_score", "state_coverage_ratio", "test_process_success", "robustness_score"):
        assert key in flat
    plots = run([DVC, "plots", "show", "--json"], clone).stdout
    assert "validation_curve.csv" in plots


def test_changed_parameter_reruns_only_dependent_stages(clone: Path) -> None:
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["stress"]["episodes"] = 16
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert run([DVC, "status", "-q"], clone, check=False).returncode == 1
    out = run([DVC, "repro"], clone)
    assert stages_run(out.stdout) == {"stress", "report"}
    assert json.loads((clone / "data" / "metrics" / "stress.json").read_text())["episodes"] == 16


def test_push_and_pull_through_the_local_remote(clone: Path) -> None:
    run([DVC, "push"], clone)
    assert any((clone / ".agentflow" / "dvc-remote").rglob("*"))
    shutil.rmtree(clone / "data" / "variants")
    shutil.rmtree(clone / ".dvc" / "cache")
    run([DVC, "pull"], clone)
    assert (clone / "data" / "variants" / "catalogue.parquet").exists()
    assert run([DVC, "status", "-q"], clone, check=False).returncode == 0


def test_a_failed_stress_gate_fails_repro_after_the_report_as_in_the_flow(clone: Path) -> None:
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["stress"]["consistency_target"] = 1.0  # the tiny policy agrees with itself on ~64% of probe states
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    failed = run([DVC, "repro"], clone, check=False)
    assert failed.returncode != 0
    assert "stress gate failed" in failed.stdout + failed.stderr
    report = json.loads((clone / "data" / "reports" / "report.json").read_text())
    assert report["passed"] is False  # written first, as the flow writes it before raising GateFailed
