"""A cycle that cannot finish on this machine says so in seconds, with one line per missing thing.

The external requirements (``tasks.preflight``): a missing or broken browser stops ``agentflow validate``
and ``agentflow run`` with exit 2 before anything is written; the install script refuses the same way
when it cannot install; and a phase that fails for a reason a rerun would meet again is not retried.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from agentflow_core.errors import (
    ConfigError,
    EnvCrashError,
    NonFiniteError,
    RequirementError,
    is_transient,
)
from tasks.config_io import load_config
from tasks.preflight import (
    check_listening,
    check_port_free,
    check_writable,
    preflight,
    require,
)
from tests.tiny import REPO, write_tiny_params

MAX_REFUSAL_S = 10.0  # the target: stop within 10 s, never a traceback after minutes


def _params_with_browser(root: Path, chromium: Path) -> Path:
    """The tiny cycle with the sim-to-real check on, its real web channel's browser at ``chromium``."""
    real_envs = root / "real_envs"
    shutil.copytree(REPO / "configs" / "real_envs", real_envs)
    entry = real_envs / "web_browser_v1.yaml"
    config = yaml.safe_load(entry.read_text())
    config["kwargs"]["chromium_path"] = str(chromium)
    entry.write_text(yaml.safe_dump(config, sort_keys=False))
    return write_tiny_params(root, stress={"sim_to_real": {"enabled": True, "env_config_dir": str(real_envs)}})


def _agentflow(*args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [str(REPO / "bin" / "agentflow"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=120,
        check=False,
    )
    return proc, time.perf_counter() - started


@pytest.mark.parametrize("command", ["validate", "run", "stress"])
def test_a_missing_browser_stops_validate_and_run_with_one_line(tmp_path: Path, command: str) -> None:
    missing = tmp_path / "no-such-chromium"
    params = _params_with_browser(tmp_path, missing)
    proc, elapsed = _agentflow(command, "-p", str(params))
    assert proc.returncode == 2, proc.stderr
    assert elapsed < MAX_REFUSAL_S
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"missing requirement: Chromium not found at {missing}")
    assert "apt-get install -y chromium" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / ".agentflow").exists()  # no Prefect home, MLflow store or Ray: nothing started
    if command == "validate":  # the plan tree lists it too
        assert f"missing Chromium not found at {missing}" in proc.stdout


@pytest.mark.parametrize(
    ("program", "mode", "expected"),
    [
        ("#!/bin/sh\necho 'Chromium 1.0'\n", 0o644, "is not an executable file"),
        (
            "#!/bin/sh\necho 'cannot open display' >&2\nexit 126\n",
            0o755,
            "does not run (cannot open display; exit 126)",
        ),
    ],
)
def test_a_browser_that_does_not_run_is_refused(tmp_path: Path, program: str, mode: int, expected: str) -> None:
    chromium = tmp_path / "chromium"
    chromium.write_text(program)
    chromium.chmod(mode)
    proc, _ = _agentflow("validate", "-p", str(_params_with_browser(tmp_path, chromium)))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert f"Chromium at {chromium} {expected}" in proc.stderr


def test_a_working_browser_is_listed_with_its_version(tmp_path: Path) -> None:
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\necho 'Chromium 156.0 test build'\n")
    chromium.chmod(0o755)
    checks = preflight(load_config(_params_with_browser(tmp_path, chromium)))
    assert all(c.ok for c in checks), [c.problem for c in checks]
    browser = next(c for c in checks if c.requirement.startswith("Chromium"))
    assert browser.requirement.endswith("Chromium 156.0 test build")
    assert "web_browser_v1" in browser.requirement
    # the real SQL channel of the sim-to-real check runs pgserver's binaries
    assert any(c.requirement.startswith("PostgreSQL binaries of pgserver") for c in checks)


def test_without_sim_to_real_the_cycle_needs_no_browser(tmp_path: Path) -> None:
    checks = preflight(load_config(write_tiny_params(tmp_path)))
    assert [c.requirement for c in checks] == [
        f"base.state_dir {tmp_path / '.agentflow'} writable",
        f"base.data_dir {tmp_path / 'data'} writable",
    ]


def test_every_failure_is_reported_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Missing browser, missing PostgreSQL binary and an unwritable data dir: three lines, one error."""
    monkeypatch.setattr("tasks.preflight.POSTGRES_BINARIES", ("initdb", "pg_ctl", "postgres", "no_such_binary"))
    params = _params_with_browser(tmp_path, tmp_path / "absent")
    config = yaml.safe_load(params.read_text())
    (tmp_path / "a-file").write_text("")
    config["base"]["data_dir"] = str(tmp_path / "a-file" / "data")
    params.write_text(yaml.safe_dump(config))
    with pytest.raises(RequirementError) as raised:
        require(load_config(params))
    problems = raised.value.problems
    assert len(problems) == 3
    assert problems[0].startswith(f"Chromium not found at {tmp_path / 'absent'}")
    assert "no_such_binary are missing or not executable" in problems[1]
    assert problems[2].startswith(f"base.data_dir: {tmp_path / 'a-file'} is not a folder")


def test_services_named_by_address_must_answer_and_fixed_ports_be_free(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert check_listening(f"http://127.0.0.1:{port}/api", ["Prefect API"]).ok
        taken = check_port_free(port, ["some_env_v1"])
        assert taken.problem is not None and f"port 127.0.0.1:{port} is taken" in taken.problem
    assert check_port_free(port, ["some_env_v1"]).ok
    silent = check_listening(f"postgresql+psycopg://user@127.0.0.1:{port}/db", ["order_db_v1 url"])
    assert silent.problem is not None and silent.problem.startswith(f"nothing answers at 127.0.0.1:{port}")
    assert check_writable(tmp_path / "not" / "yet" / "made", "base.state_dir").ok
    assert not (tmp_path / "not").exists()  # checking creates nothing


def test_registry_urls_and_ports_are_checked(tmp_path: Path) -> None:
    """An env's ``url``/``server_url`` must answer and its fixed ``port`` be free: read from the registry."""
    envs = tmp_path / "envs"
    shutil.copytree(REPO / "configs" / "envs", envs)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free_port = closed.getsockname()[1]
    for name, kwargs in [
        ("order_db_v1.yaml", {"url": f"postgresql+psycopg://u@127.0.0.1:{free_port}/shop"}),
        ("payment_api_v1.yaml", {"server_url": f"http://127.0.0.1:{free_port}"}),
    ]:
        entry = yaml.safe_load((envs / name).read_text())
        entry["kwargs"] = kwargs
        (envs / name).write_text(yaml.safe_dump(entry, sort_keys=False))
    params = write_tiny_params(tmp_path)
    config = yaml.safe_load(params.read_text())
    config["base"]["env_config_dir"] = str(envs)
    params.write_text(yaml.safe_dump(config))
    problems = [c.problem for c in preflight(load_config(params)) if c.problem]
    assert len(problems) == 2
    assert "order_db_v1 url" in problems[0] and "payment_api_v1 server_url" in problems[1]


# ----------------------------------------------------------------------------- the install script


def _ensure(*args: str, **env: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [str(REPO / "bin" / "ensure-system-deps"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=REPO,
        timeout=60,
        check=False,
    )
    return proc, time.perf_counter() - started


def test_the_install_script_refuses_in_one_line_when_it_cannot_install(tmp_path: Path) -> None:
    missing = str(tmp_path / "chromium")
    for proc, elapsed in (
        _ensure("--no-install", CHROMIUM=missing),
        _ensure(CHROMIUM=missing, SYSTEM_DEPS_INSTALL="no"),
    ):
        assert proc.returncode == 2
        assert elapsed < MAX_REFUSAL_S
        assert proc.stdout == ""
        assert proc.stderr.strip().splitlines() == [
            f"ensure-system-deps: Chromium is missing at {missing} (the stress phase and the browser tests drive it): "
            "install it (sudo apt-get install -y chromium) and rerun, or rerun as root"
        ]


def test_the_install_script_passes_silently_when_everything_is_there(tmp_path: Path) -> None:
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\necho 'Chromium 156.0'\n")
    chromium.chmod(0o755)
    proc, _ = _ensure("--no-install", CHROMIUM=str(chromium))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")
    no_python, _ = _ensure("--no-install", CHROMIUM=str(chromium), PY="no-such-python3.11", VENV=str(tmp_path / "v"))
    assert no_python.returncode == 2
    assert no_python.stderr.startswith("ensure-system-deps: no-such-python3.11 is missing: install Python 3.11")


def test_make_run_checks_the_system_before_any_pip_install(tmp_path: Path) -> None:
    """``make run`` on a machine it cannot install Chromium on stops in seconds; no venv is made."""
    venv = tmp_path / "venv"
    started = time.perf_counter()
    proc = subprocess.run(
        ["make", "-s", "run", f"VENV={venv}"],
        capture_output=True,
        text=True,
        env={**os.environ, "CHROMIUM": str(tmp_path / "chromium"), "SYSTEM_DEPS_INSTALL": "no"},
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert time.perf_counter() - started < MAX_REFUSAL_S
    assert proc.stderr.splitlines()[0].startswith("ensure-system-deps: Chromium is missing at")
    assert not venv.exists()


# ----------------------------------------------------------------------------- retries


@pytest.mark.parametrize(
    ("failure", "transient"),
    [
        (FileNotFoundError("Chromium not found at /usr/bin/chromium"), False),
        (ConfigError("params.yaml", "train.n_steps", 0, "> 0"), False),
        (RequirementError(["Chromium not found"]), False),
        (NonFiniteError(3, "loss", "nan"), False),
        (ModuleNotFoundError("playwright"), False),
        (ConnectionResetError("peer reset"), True),
        (TimeoutError("step timed out"), True),
        (EnvCrashError("order_db_v1", 4, "server gone"), True),
        (RuntimeError("worker died"), True),
    ],
)
def test_transient_failures_are_told_apart(failure: BaseException, transient: bool) -> None:
    assert is_transient(failure) is transient


def test_an_explicit_cause_decides() -> None:
    try:
        try:
            raise FileNotFoundError("no binary")
        except FileNotFoundError as missing:
            raise RuntimeError("phase failed") from missing
    except RuntimeError as wrapped:
        assert not is_transient(wrapped)


def test_every_retried_phase_retries_only_transient_failures() -> None:
    from prefect import Task

    import tasks.prefect_tasks as phases
    import tasks.retrain_tasks as retrain
    import tasks.validator_tasks as validator

    retried = [
        t
        for module in (phases, validator, retrain)
        for t in vars(module).values()
        if isinstance(t, Task) and t.retries > 0
    ]
    assert {t.name for t in retried} >= {"calibrate", "variants", "explore", "offline", "validator", "stress"}
    assert all(t.retry_condition_fn is phases.retry_if_transient for t in retried)


def test_a_non_transient_failure_is_not_retried(prefect_harness: None) -> None:
    from prefect import flow, task

    from tasks.prefect_tasks import RETRY_TRANSIENT

    attempts: list[str] = []

    @task(**RETRY_TRANSIENT)
    def phase(failure: str) -> None:
        attempts.append(failure)
        if failure == "missing binary":
            raise FileNotFoundError("Chromium not found at /usr/bin/chromium")
        if len(attempts) == 1:  # a lost connection passes on the second try
            raise ConnectionError("connection reset")

    @flow
    def cycle(failure: str) -> None:
        phase(failure)

    with pytest.raises(FileNotFoundError):
        cycle("missing binary")
    assert attempts == ["missing binary"]
    attempts.clear()
    cycle("lost connection")
    assert attempts == ["lost connection", "lost connection"]


def test_the_flow_itself_refuses_before_any_run_exists(tmp_path: Path, prefect_harness: None) -> None:
    """A deployment starts the flow without the CLI: the flow checks too, before MLflow or a phase."""
    from flows.training_cycle import training_cycle

    params = _params_with_browser(tmp_path, tmp_path / "absent")
    with pytest.raises(RequirementError, match="Chromium not found at"):
        training_cycle(params_path=str(params))
    assert not (tmp_path / ".agentflow" / "mlflow.db").exists()
    assert not (tmp_path / "data" / "calibration").exists()
