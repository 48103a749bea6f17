"""``agentflow deploy`` against a real ``prefect server start`` and a real ``prefect worker start`` (process pool).

The server and the worker run in their own process groups with a private PREFECT_HOME and are
stopped by group id. Runs are created through the server's REST API, as the UI does.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.tiny import REPO, write_tiny_params

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
POOL = "agentflow-test"
DEPLOYMENT = "tiny"
FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=20)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A Prefect server on 127.0.0.1:<free port>; yields its API URL, the env clients use, a scratch dir."""
    root = tmp_path_factory.mktemp("prefect-server")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_TRACKING_URI"))}
    env |= {"PREFECT_HOME": str(root / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    port = _free_port()
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    api = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{api}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc)
            raise AssertionError(f"prefect server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    try:
        yield api, {**env, "PREFECT_API_URL": api}, root
    finally:
        _stop(proc)


@pytest.fixture(scope="module")
def deployed(server: tuple[str, dict[str, str], Path]) -> Iterator[dict[str, Any]]:
    """The tiny cycle deployed on a process pool with `agentflow deploy`, and a worker serving that pool."""
    api, env, root = server
    (root / "work").mkdir()
    params = write_tiny_params(root / "work")
    done = subprocess.run(
        [str(BIN / "agentflow"), "deploy", "-p", str(params), "--pool", POOL, "--name", DEPLOYMENT, "--no-retrain"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    worker_log = (root / "worker.log").open("wb")
    worker = subprocess.Popen(
        [str(BIN / "prefect"), "worker", "start", "--pool", POOL],
        env={**env, "PREFECT_WORKER_QUERY_SECONDS": "2"},
        cwd=root,
        stdout=worker_log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        yield {"api": api, "root": root / "work", "params": params, "deploy_output": done.stdout}
    finally:
        _stop(worker)


def _call(client: httpx.Client, method: str, url: str, **kwargs: Any) -> Any:
    """One REST call, retried on 429/502/503 as Prefect's own client does: the test server's sqlite
    answers 503 while the worker's polls hold it (seen once in CI on create_flow_run)."""
    for attempt in range(6):
        response = client.request(method, url, **kwargs)
        if response.status_code not in (429, 502, 503) or attempt == 5:
            return response.raise_for_status().json()
        time.sleep(0.5 * 2**attempt)
    raise AssertionError("unreachable")


def _run(api: str, parameters: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    """Create a run of the deployment through the REST API and wait for a final state."""
    with httpx.Client(base_url=api, timeout=30) as client:
        deployment = _call(client, "GET", f"/deployments/name/agentflow-training-cycle/{DEPLOYMENT}")
        run = _call(client, "POST", f"/deployments/{deployment['id']}/create_flow_run", json={"parameters": parameters})
        run_id = run["id"]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = _call(client, "GET", f"/flow_runs/{run_id}")
            if state["state_type"] in FINAL:
                return state
            time.sleep(1)
    raise AssertionError(f"flow run {run_id} did not finish in {timeout_s} s: {state['state_type']}")


def test_deploy_registers_a_process_pool_deployment(deployed: dict[str, Any]) -> None:
    with httpx.Client(base_url=deployed["api"], timeout=30) as client:
        pool = _call(client, "GET", f"/work_pools/{POOL}")
        deployment = _call(client, "GET", f"/deployments/name/agentflow-training-cycle/{DEPLOYMENT}")
    assert pool["type"] == "process"
    assert deployment["work_pool_name"] == POOL
    assert deployment["entrypoint"] == "flows/training_cycle.py:training_cycle"
    assert deployment["parameters"]["params_path"] == str(deployed["params"].resolve())
    assert deployment["parameters"]["retrain"] is False
    assert {"overrides", "retrain", "params_path"} <= set(deployment["parameter_openapi_schema"]["properties"])


def test_a_worker_runs_a_deployment_run_and_a_nested_override_takes_effect(deployed: dict[str, Any]) -> None:
    state = _run(deployed["api"], {"overrides": {"train.total_steps": 512, "report.champion_episodes": 4}})
    assert state["state_type"] == "COMPLETED", state["state"]
    summary = json.loads((deployed["root"] / "data" / "checkpoints" / "train_summary.json").read_text())
    assert summary["global_step"] == 512 and summary["updates"] == 1  # the tiny config alone trains 1024 steps
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{deployed['root'] / '.agentflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("agentflow")
    parents = [r for r in client.search_runs([experiment.experiment_id]) if "prefect.flow_run_id" in r.data.tags]
    assert [r.data.tags["prefect.flow_run_id"] for r in parents] == [state["id"]]
    assert (
        parents[0].data.params["train.total_steps"] == "512"
        and parents[0].data.params["report.champion_episodes"] == "4"
    )


def test_a_bad_override_fails_the_run_within_seconds_naming_the_key(deployed: dict[str, Any]) -> None:
    state = _run(deployed["api"], {"overrides": {"train.clip_rnage": 0.1}}, timeout_s=120)
    assert state["state_type"] == "FAILED"
    assert "train.clip_rnage" in state["state"]["message"]
    with httpx.Client(base_url=deployed["api"], timeout=30) as client:
        run = _call(client, "GET", f"/flow_runs/{state['id']}")
    assert run["total_run_time"] < 30  # fails at validation, before any phase ran
