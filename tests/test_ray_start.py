"""A private local Ray starts on a helper thread while the command goes on; the first pool waits for it.

Run in a child process: the suite's own Ray (``ray_session``) would make the start a no-op.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pool_fixtures import may_leave_ray_nice

from tests.tiny import tiny_params

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys, time
import psutil
import ray
from agentflow_core.config import AgentFlowConfig
from tasks.backend import backend_of
from tasks.ray_runtime import LOCAL_RAY, start_ray, stop_ray

cfg = AgentFlowConfig.model_validate(json.loads(sys.argv[1]))
began = time.monotonic()
where = backend_of(cfg).place()
returned_s = time.monotonic() - began
up_at_return = ray.is_initialized()
start_ray(cfg)  # what every pool builder calls first: waits for the start under way
time.sleep(2.0)  # Ray's node processes die with the thread that started them: that thread must outlive the start

@ray.remote(num_cpus=0)
def pid():
    import os
    return os.getpid()

answer = ray.get(pid.remote(), timeout=60)
blank = LOCAL_RAY.claim()  # the env workers started with Ray for the command's first pool
located = [] if blank is None else ray.get([a.locate.remote() for a in blank.actors], timeout=120)
nice = [psutil.Process(pid).nice() for _, pid, _, _ in located]
from ray._private import worker
head = sorted(worker._global_node.all_processes)  # what the private Ray's head runs
scripts = sorted({part.rsplit("/", 1)[-1] for c in psutil.Process().children(recursive=True)
                  for part in c.cmdline() if part.endswith(".py")})
stop_ray()
print(json.dumps({"returned_s": returned_s, "up_at_return": up_at_return, "describe": where.describe(8),
                  "answered": answer > 0, "up_after_stop": ray.is_initialized(),
                  "blank_nice": nice, "head": head, "scripts": scripts}))
"""


@pytest.mark.slow
def test_a_local_ray_starts_behind_the_command_and_outlives_its_start(tmp_path: Path) -> None:
    import json

    params = tiny_params(tmp_path, pool={"num_workers": 2, "backend": "ray"})
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(params)], cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not out["up_at_return"] and out["returned_s"] < 2.0  # the command went on while Ray came up
    assert out["describe"] == "ray (local), 2 workers x 4 envs, 1 node(s)"
    assert out["answered"] and not out["up_after_stop"]
    # the 2 workers' blank actors warm up at normal priority, the standby's at Ray's nice 15
    nice = out["blank_nice"]
    assert len(nice) == 3 and nice[2] > 0
    assert nice[:2] == ([0, 0] if may_leave_ray_nice() else [nice[2]] * 2)
    assert "SIGTERM handler is not set" not in proc.stderr
    # a lean head: GCS, raylet and the agents the raylet needs, no autoscaler monitor, log monitor or API server
    assert {"gcs_server", "raylet"} <= set(out["head"]), out["head"]
    assert not {"monitor", "log_monitor", "dashboard"} & set(out["head"]), out["head"]
    assert not {"monitor.py", "log_monitor.py", "dashboard.py"} & set(out["scripts"]), out["scripts"]


@pytest.mark.parametrize(("dashboard", "skipped"), [(False, 3), (True, 2)])
def test_the_lean_head_skips_only_what_a_private_ray_never_uses_and_restores_ray(dashboard: bool, skipped: int) -> None:
    """The autoscaler and log monitors always; the API server only with the dashboard off; Ray's own methods after."""
    from ray._private.node import Node

    from tasks.ray_runtime import _lean_head

    before = {name: Node.__dict__[name] for name in ("start_monitor", "start_log_monitor", "start_api_server")}
    with _lean_head(include_dashboard=dashboard) as names:
        assert len(names) == skipped and ("start_api_server" in names) is not dashboard
        assert all(Node.__dict__[name] is not before[name] for name in names)
        assert all(getattr(Node, name)(object()) is None for name in names)
    assert {name: Node.__dict__[name] for name in before} == before
