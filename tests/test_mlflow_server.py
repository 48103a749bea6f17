"""The tiny cycle against a real ``mlflow server`` (own sqlite backend and artifact root on 127.0.0.1).

Every MLflow feature the cycle uses goes over REST here: nested runs, per-update metric batches,
artifacts (proxied by the server), the model registry and its alias, search (what Compare uses),
and loading the champion model back.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from mlflow.tracking import MlflowClient

from tests.tiny import write_tiny_params

pytestmark = pytest.mark.slow
PHASES = {"calibrate", "variants", "explore", "train", "stress", "report"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlflow server`` in its own session (job workers off: they would outlive it, STACK-NOTES)."""
    root = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    log = (root / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]
        + [
            "--backend-store-uri",
            f"sqlite:///{root / 'server.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"mlflow server did not start:\n{(root / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)
    yield url
    os.killpg(server.pid, signal.SIGTERM)
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
    log.close()


@pytest.fixture(scope="module")
def server_cycle(
    tmp_path_factory: pytest.TempPathFactory, prefect_harness: None, mlflow_server: str
) -> tuple[str, dict]:
    from flows.training_cycle import training_cycle

    root = tmp_path_factory.mktemp("server-cycle")
    params = write_tiny_params(root)
    params.write_text(
        params.read_text().replace("base:\n", f"base:\n  tracking:\n    mlflow_uri: {mlflow_server}\n", 1)
    )
    return mlflow_server, training_cycle(params_path=str(params), run_name="server-cycle")


def test_tiny_cycle_against_a_tracking_server(server_cycle: tuple[str, dict]) -> None:
    import mlflow

    from agentflow_core.semantics import OBS_DIM
    from tasks.policy_model import policy_frame, tracking_uri_set

    url, results = server_cycle
    client = MlflowClient(url)
    parent = client.get_run(results["mlflow_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.metrics["heldout_success"] == pytest.approx(
        results["train"]["heldout_success"]
    )
    experiment = client.get_experiment_by_name("agentflow")
    children = client.search_runs([experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    assert {r.info.run_name for r in children} == PHASES
    assert all(r.info.status == "FINISHED" for r in children)
    train = next(r for r in children if r.info.run_name == "train")
    history = client.get_metric_history(train.info.run_id, "train/losses/approx_kl")
    assert len(history) == len({m.step for m in history}) == results["train"]["updates"]  # one batch per update
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "config")] == ["config/params.yaml"]
    assert {a.path for a in client.list_artifacts(train.info.run_id)} >= {"plots", "curves"}
    champion = client.get_model_version_by_alias("agentflow-policy", "champion")
    assert champion.run_id == train.info.run_id
    compared = client.search_runs([experiment.experiment_id], "tags.`agentflow.kind` = 'cycle'")
    assert [r.info.run_id for r in compared] == [parent.info.run_id]
    with tracking_uri_set(url):
        model = mlflow.pyfunc.load_model("models:/agentflow-policy@champion")
    import numpy as np

    assert model.predict(policy_frame(np.zeros((2, OBS_DIM)))).shape == (2,)
