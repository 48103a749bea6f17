"""End-to-end ``agentflow train`` on each pool backend, side by side in one run, and a worker SIGKILL mid-train.

Every side is the product's own command in its own process, on the shipped ``params.yaml`` with
only ``pool.backend`` changed (and ``--total-steps`` to bound the benchmark's time): the same
catalogue, the same exploration dataset for the BC warm start, the same PPO settings. A side's
env-steps/s is its ``global_step`` over the command's whole wall time (Ray start-up, BC, PPO,
held-out evaluations and the final evaluation included); ``loop_sps`` is the median of the
per-update rollout+update throughput. The kill run SIGKILLs one active env worker of a ``ray``
run after its first checkpoint and reads the pool's recovery record from ``train_summary.json``.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

TARGETS = {"train_sps_ratio_ray_vs_inprocess": 1.5, "kill_recovery_s": 2.0, "post_kill_sps_ratio": 0.9}
HIGHER_IS_BETTER = {"train_sps_ratio_ray_vs_inprocess": True, "kill_recovery_s": False, "post_kill_sps_ratio": True}


def _params_with(params: Path, work: Path, backend: str) -> Path:
    data = yaml.safe_load(params.read_text(encoding="utf-8"))
    data.setdefault("pool", {})["backend"] = backend
    # the benchmark's metrics, MLflow runs and checkpoints stay in its own folder, never the project's
    data.setdefault("base", {}).update(data_dir=str(work / "data"), state_dir=str(work / ".agentflow"))
    out = work / f"params-{backend}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


def _agentflow() -> list[str]:
    return [sys.executable, "-m", "flows.cli"]


def _train(params: Path, data: Path, out: Path, total_steps: int, kill_after_checkpoint: bool) -> dict[str, Any]:
    cmd = [
        *_agentflow(),
        "train",
        "--params",
        str(params),
        "--catalogue",
        str(data / "variants"),
        "--trajectories",
        str(data / "trajectories"),
        "--out",
        str(out),
        "--total-steps",
        str(total_steps),
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_at_update = None
    if kill_after_checkpoint:
        ckpts = out / "checkpoints"
        while proc.poll() is None and not any(ckpts.glob("update_*")):
            time.sleep(0.1)
        killed_at_update = len(list(ckpts.glob("update_*")))
        victim = busy_env_worker(proc.pid, deadline=time.monotonic() + 30)
        if victim is not None:
            os.kill(victim, signal.SIGKILL)
    output, _ = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
    summary = json.loads((out / "train_summary.json").read_text(encoding="utf-8"))
    return {"wall_s": wall, "summary": summary, "sps": summary["update_sps"], "killed_at": killed_at_update}


def busy_env_worker(pid: int, deadline: float) -> int | None:
    """The pid of an env worker in the middle of a rollout or a step (Ray titles a busy actor
    ``ray::RayEnvWorker.rollout`` / ``ray::RayEnvWorker.step``)."""
    while time.monotonic() < deadline:
        for child in psutil.Process(pid).children(recursive=True):
            try:
                title = " ".join(child.cmdline())
                if "RayEnvWorker.rollout" in title or "RayEnvWorker.step" in title:
                    return int(child.pid)
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.005)
    return None


def run_train_bench(params: Path, work: Path, total_steps: int) -> dict[str, Any]:
    """Prepare the catalogue and exploration dataset once, then train on each backend and once with a kill."""
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data"
    inprocess_params = _params_with(params, work, "inprocess")
    ray_params = _params_with(params, work, "ray")
    for cmd in (
        ["variants", "--params", str(inprocess_params), "--out", str(data / "variants")],
        [
            "explore",
            "--params",
            str(inprocess_params),
            "--catalogue",
            str(data / "variants"),
            "--out",
            str(data / "trajectories"),
        ],
    ):
        subprocess.run([*_agentflow(), *cmd], check=True, capture_output=True, text=True)
    sides = {
        "inprocess": _train(inprocess_params, data, work / "inprocess", total_steps, False),
        "ray": _train(ray_params, data, work / "ray", total_steps, False),
    }
    # the kill run measures recovery, not throughput: a quarter of the steps is enough
    kill = _train(ray_params, data, work / "ray-kill", max(total_steps // 4, 24 * 512), True)
    out: dict[str, Any] = {"total_steps": total_steps, "machine_cpus": os.cpu_count()}
    for name, side in sides.items():
        out[f"{name}_env_steps_per_s"] = side["summary"]["global_step"] / side["wall_s"]
        out[f"{name}_loop_sps"] = statistics.median(side["sps"])
        out[f"{name}_wall_s"] = side["wall_s"]
        out[f"{name}_policy_hash"] = side["summary"]["policy_hash"]
    out["train_sps_ratio_ray_vs_inprocess"] = out["ray_env_steps_per_s"] / out["inprocess_env_steps_per_s"]
    out["loop_sps_ratio_ray_vs_inprocess"] = out["ray_loop_sps"] / out["inprocess_loop_sps"]
    out["same_policy_on_both_backends"] = out["ray_policy_hash"] == out["inprocess_policy_hash"]
    pool = kill["summary"]["pool"]
    k = kill["killed_at"] or 1
    before, after = kill["sps"][:k], kill["sps"][k + 1 :]
    out["kill_worker_restarts"] = pool["worker_restarts"]
    out["kill_recovery_s"] = max((r["recovery_s"] for r in pool["recoveries"]), default=float("nan"))
    out["kill_episodes_lost"] = pool["episodes_lost"]
    out["kill_steps_lost"] = pool["steps_lost"]
    out["kill_update_sps_ratio"] = kill["sps"][k] / statistics.median(before) if k < len(kill["sps"]) else float("nan")
    out["post_kill_sps_ratio"] = statistics.median(after) / statistics.median(before) if after else float("nan")
    out["targets"] = TARGETS
    out["targets_met"] = {
        key: bool(out[key] >= bound if HIGHER_IS_BETTER[key] else out[key] <= bound) for key, bound in TARGETS.items()
    }
    out["notes"] = [
        "train_sps_ratio_ray_vs_inprocess: end-to-end `agentflow train` (shipped params.yaml, pool.backend the only "
        "difference, train.total_steps unless --total-steps says otherwise) env-steps/s over the command's wall time, "
        "Ray start-up included.",
        "kill_*: one active env worker SIGKILLed after the first checkpoint of a ray run (a quarter of the steps); "
        "kill_recovery_s is the "
        "pool's loss detection to replacement answering; post_kill_sps_ratio compares the median per-update "
        "throughput after the kill's update with before it; steps lost are the steps of the episodes the dead "
        "worker held.",
    ]
    return out
