"""Records survive a kill: SIGKILL of `agentflow run` mid-training, then `agentflow run --resume`.

Afterwards no MLflow run is left RUNNING, the resumed cycle continued the same parent and train
runs, the train run holds one point per PPO update (nothing lost, nothing duplicated), and the
killed run's Prefect temporary server did not outlive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tasks.lifetime import SERVER_MARKER
from tests.tiny import REPO, write_tiny_params

pytestmark = pytest.mark.slow
UPDATES = 4


def agentflow(params: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "PREFECT_HOME")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "run", "--params", str(params), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def kl_history(client: MlflowClient) -> list[int]:
    experiment = client.get_experiment_by_name("agentflow")
    if experiment is None:
        return []
    train = client.search_runs([experiment.experiment_id], "tags.`agentflow.phase` = 'train'")
    return [m.step for m in client.get_metric_history(train[0].info.run_id, "train/losses/approx_kl")] if train else []


def test_sigkill_then_resume_continues_the_same_runs(tmp_path: Path) -> None:
    params = write_tiny_params(tmp_path, train={"total_steps": 512 * UPDATES})
    client = MlflowClient(f"sqlite:///{tmp_path / '.agentflow' / 'mlflow.db'}")
    first = agentflow(params)
    deadline = time.monotonic() + 400
    while len(kl_history(client)) < 2:
        assert first.poll() is None, first.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "training never logged two updates"
        time.sleep(0.3)
    servers = [c for c in psutil.Process(first.pid).children() if SERVER_MARKER in " ".join(c.cmdline())]
    assert servers, "the run has no Prefect temporary server to check"
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    logged_before_kill = kl_history(client)
    _, alive = psutil.wait_procs(servers, timeout=30)
    assert not alive, "the killed run's Prefect server outlived it"

    second = agentflow(params, "--resume")
    output = second.communicate(timeout=600)[0]
    assert second.returncode == 0, output[-3000:]
    experiment = client.get_experiment_by_name("agentflow")
    runs = client.search_runs([experiment.experiment_id])
    assert not [r.info.run_name for r in runs if r.info.status == "RUNNING"]
    cycles = [r for r in runs if r.data.tags.get("agentflow.kind") == "cycle"]
    assert len(cycles) == 1 and cycles[0].info.status == "FINISHED"
    trains = [r for r in runs if r.data.tags.get("agentflow.phase") == "train"]
    assert len(trains) == 1 and trains[0].data.tags["mlflow.parentRunId"] == cycles[0].info.run_id
    steps = kl_history(client)
    assert steps == [512 * (u + 1) for u in range(UPDATES)]  # every update once, in order
    assert steps[: len(logged_before_kill)] == logged_before_kill
