"""A private local Ray leaves no session folder behind (``tasks/ray_runtime.py``, ``stop_ray``).

Run in a child process: the suite's own Ray (``ray_session``) would make the start a no-op.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks.ray_runtime import remove_session_dir
from tests.tiny import tiny_params

REPO = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys
import ray
from agentflow_core.config import AgentFlowConfig
from tasks.ray_runtime import start_ray, stop_ray

cfg = AgentFlowConfig.model_validate(json.loads(sys.argv[1]))
start_ray(cfg)

@ray.remote(num_cpus=0)
def answer():
    return 42

assert ray.get(answer.remote(), timeout=120) == 42
from ray._private import worker
session = worker._global_node.get_session_dir_path()
logs = sorted(p.name for p in __import__("pathlib").Path(session, "logs").iterdir())
stop_ray()
print(json.dumps({"session": session, "logs": len(logs)}))
"""


@pytest.mark.slow
def test_a_private_local_ray_removes_its_session_folder_at_shutdown(tmp_path: Path) -> None:
    params = tiny_params(tmp_path, pool={"num_workers": 1, "backend": "ray"})
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_ADDRESS": ""}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(params)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    session = Path(out["session"])
    assert session.name.startswith("session_") and out["logs"] > 0  # it was there, with Ray's logs in it
    assert not session.exists()
    latest = session.parent / "session_latest"
    assert not (latest.is_symlink() and Path(os.readlink(latest)) == session)


def test_removing_a_session_folder_leaves_a_newer_sessions_link(tmp_path: Path) -> None:
    old, new = tmp_path / "session_old", tmp_path / "session_new"
    for session in (old, new):
        (session / "logs").mkdir(parents=True)
        (session / "logs" / "raylet.out").write_text("x")
    latest = tmp_path / "session_latest"
    latest.symlink_to(new)
    remove_session_dir(old)
    assert not old.exists() and new.exists() and latest.is_symlink()
    remove_session_dir(new)
    assert not new.exists() and not latest.is_symlink()
