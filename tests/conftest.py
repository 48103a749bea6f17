"""Shared fixtures. Services are real; each is started once per session where it is slow."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


TEST_ENTRY_POINTS = """\
[agentflow.envs]
toy = test_registry:ToyEnv

[agentflow.adapters]
toy = test_registry:ToyAdapter
"""


@pytest.fixture(scope="session", autouse=True)
def test_entry_points(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Install the test modules' toy env and adapter as entry points, the way a user adds their own classes."""
    import sys

    site = tmp_path_factory.mktemp("site")
    dist = site / "agentflow_test_envs-0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: agentflow-test-envs\nVersion: 0.0\n")
    (dist / "entry_points.txt").write_text(TEST_ENTRY_POINTS)
    sys.path.append(str(site))
    yield
    sys.path.remove(str(site))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture
def tiny_config(tmp_path: Path) -> Callable[..., Any]:
    """``tiny_config(**section_overrides)``: the tiny cycle's configuration with its outputs under ``tmp_path``."""
    from tests.tiny import tiny_config as make

    return partial(make, tmp_path)


@pytest.fixture
def local_config(tmp_path: Path) -> Callable[..., Any]:
    """``local_config(**section_overrides)``: the shipped defaults with the data under ``tmp_path``."""
    from tests.tiny import local_config as make

    return partial(make, tmp_path)


def owned_chromium_pids(owner_pid: int) -> list[int]:
    """Chromium processes launched by ``owner_pid`` (marked with the browser channel's owner switch)."""
    import psutil

    from agentflow_core.envs.web_browser import OWNER_SWITCH

    marker = f"{OWNER_SWITCH}={owner_pid}"
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in (proc.info["cmdline"] or []):
                found.append(proc.info["pid"])
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture(scope="module")
def browser_session() -> Iterator[None]:
    """One headless Chromium per test module (its browser envs share it); none left after.

    Per module, not per session: while Playwright's sync API is running it leaves its asyncio loop
    current in this thread, and Prefect's sync-compatible calls (``Artifact.get`` in tests/test_flow.py)
    then hand back coroutines; closing it after each module restores the plain thread.
    """
    from agentflow_core.envs.web_browser import acquire_browser, close_all_browsers, live_browsers, release_browser

    host = acquire_browser()
    yield
    release_browser(host)
    leaked = live_browsers()
    close_all_browsers()
    deadline = time.monotonic() + 10
    while owned_chromium_pids(os.getpid()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert leaked == 0, f"{leaked} browser(s) still held by envs that were never closed"
    assert owned_chromium_pids(os.getpid()) == [], "Chromium processes outlived the test session"


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole session (~5 s to start); actors must not ask for whole CPUs."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # never join a Ray someone else started on this machine
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=512 * 1024**2,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
        )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect API for the session (~10 s), as Prefect recommends for tests."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real ``mlflow server`` on 127.0.0.1 with its own sqlite backend and artifact root (~10 s).

    Its own session, job workers off (they would outlive it, docs/stack-notes.md "MLflow"); stopped with its group.
    """
    root = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
    command += ["--backend-store-uri", f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "art")]
    with (root / "server.log").open("w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while not _healthy(url):
        if server.poll() is not None or time.monotonic() > deadline:
            os.killpg(server.pid, signal.SIGKILL)
            raise AssertionError(f"mlflow server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield url
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
