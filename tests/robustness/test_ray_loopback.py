"""A private local Ray started by the pool (``tasks.ray_runtime.start_ray``) listens on loopback only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROBE = """
import json, sys
import psutil
sys.path.insert(0, {repo!r})
from agentflow_core.config import AgentFlowConfig
from tasks.ray_runtime import start_ray
from tests.tiny import tiny_params
from pathlib import Path

start_ray(AgentFlowConfig.model_validate(tiny_params(Path({root!r}), pool={{"num_workers": 1}})))
import ray

ray_pids = {{p.pid for p in psutil.Process().children(recursive=True)}}
found = sorted({{c.laddr.ip for c in psutil.net_connections("inet") if c.status == "LISTEN" and c.pid in ray_pids}})
print(json.dumps({{"node_ip": ray.util.get_node_ip_address(), "listening": found}}))
ray.shutdown()
"""


def test_local_ray_binds_loopback_only(tmp_path: Path) -> None:
    code = PROBE.format(repo=str(REPO), root=str(tmp_path))
    env = {"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path), "RAY_USAGE_STATS_ENABLED": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    assert probe["node_ip"] == "127.0.0.1"
    assert probe["listening"] and set(probe["listening"]) <= {"127.0.0.1", "::ffff:127.0.0.1", "::1"}, probe
