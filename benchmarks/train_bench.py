"""End-to-end ``agentflow train`` on each pool backend, side by side in one run, and a worker SIGKILL mid-train.

Every side is the product's own command in its own process, on the shipped ``params.yaml`` with
only ``pool.backend`` changed (and ``--total-steps`` to bound the benchmark's time): the same
catalogue, the same exploration dataset for the BC warm start, the same PPO settings. A side's
env-steps/s is its ``global_step`` over the command's whole wall time (Ray start-up, BC, PPO,
held-out evaluations and the final evaluation included); ``loop_sps`` is the median of the
per-update throughput (an update's steps over the time since the previous one ended). Each backend runs twice, in the order in-process, ray, ray,
in-process, and its env-steps/s is its steps over its runs' time: the machine's speed drifts over
minutes here (other tenants), and that order weighs a linear drift on both alike. The kill run
SIGKILLs one active env worker of a ``ray`` run after the checkpoint of update ``KILL_AFTER_UPDATE``
and reads the pool's recovery record from ``train_summary.json``.

More env workers divide only the rollouts; start-up, behaviour cloning, the PPO updates,
evaluations and tracking take as long on either backend. :func:`split_ceiling` turns the in-process
runs' own record (their slices' seconds) into the best end-to-end ratio the Ray side's workers
could give over them, so each run says how much of what was attainable Ray delivered.
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

from benchmarks.machine import MachineLoad

SIDE_ORDER = ("inprocess", "ray", "ray", "inprocess")
KILL_AFTER_UPDATE = 20
# ``--quick`` (a smoke run of the command, not a measurement for BENCHMARKS.md): one run per backend, and
# the kill after update 2, the earliest with an update before it that is past the actors' start-up
QUICK_SIDE_ORDER = ("inprocess", "ray")
QUICK_KILL_AFTER_UPDATE = 2
TARGETS = {"train_sps_ratio_ray_vs_inprocess": 1.5, "kill_recovery_s": 2.0, "post_kill_worker_speed_ratio": 0.9}
HIGHER_IS_BETTER = {
    "train_sps_ratio_ray_vs_inprocess": True,
    "kill_recovery_s": False,
    "post_kill_worker_speed_ratio": True,
}


def _params_with(
    params: Path, work: Path, backend: str, name: str | None = None, stop_on_convergence: bool = True
) -> Path:
    data = yaml.safe_load(params.read_text(encoding="utf-8"))
    data.setdefault("pool", {})["backend"] = backend
    if not stop_on_convergence:
        data.setdefault("train", {}).setdefault("gate", {})["stop_on_convergence"] = False
    # the benchmark's metrics, MLflow runs and checkpoints stay in its own folder, never the project's
    data.setdefault("base", {}).update(data_dir=str(work / "data"), state_dir=str(work / ".agentflow"))
    out = work / f"params-{name or backend}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


def _agentflow() -> list[str]:
    return [sys.executable, "-m", "flows.cli"]


def _train(params: Path, data: Path, out: Path, total_steps: int, kill_after_update: int | None) -> dict[str, Any]:
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
    machine = MachineLoad()
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    killed_at_update = None
    if kill_after_update is not None:
        ckpts = out / "checkpoints"
        while proc.poll() is None and (killed_at_update or 0) < kill_after_update:
            time.sleep(0.1)
            # the update the newest checkpoint holds: the kill lands in one of the rollouts after it
            saved = [int(p.name[7:]) for p in ckpts.glob("update_*") if p.name[7:].isdigit()]
            killed_at_update = max(saved, default=None)
        if proc.poll() is not None:
            output, _ = proc.communicate()
            raise RuntimeError(
                f"{' '.join(cmd)} ended ({proc.returncode}) at update {killed_at_update}, before the kill "
                f"after update {kill_after_update}:\n{output[-3000:]}"
            )
        victim = busy_env_worker(proc.pid, deadline=time.monotonic() + 30)
        if victim is not None:
            os.kill(victim, signal.SIGKILL)
    output, _ = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[-3000:]}")
    summary = json.loads((out / "train_summary.json").read_text(encoding="utf-8"))
    return {
        "wall_s": wall,
        "summary": summary,
        "sps": summary["update_sps"],
        "killed_at": killed_at_update,
        "steal": machine.result()["cpu_steal_share"],
    }


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


def post_kill_ratios(kill_sps: list[float], control_sps: list[list[float]], k: int) -> tuple[float, float]:
    """Median per-update throughput after the kill over before it, in the kill run and in the control runs.

    ``kill_sps[i]`` is update ``i + 1``'s; the first holds the actors' start-up (not steady state),
    the ``k + 1``-th the kill and the recovery. The uninterrupted runs (same seed, same updates) over
    the same updates are the control: a policy that ends episodes sooner later in training, or an
    evaluation landing on one side, changes per-update throughput with no kill at all.
    """
    n = min([len(kill_sps), *(len(s) for s in control_sps)])

    def ratio(after: list[float], before: list[float]) -> float:
        return statistics.median(after) / statistics.median(before) if after and before else float("nan")

    raw = ratio(kill_sps[k + 1 : n], kill_sps[1:k])
    control = ratio([x for s in control_sps for x in s[k + 1 : n]], [x for s in control_sps for x in s[1:k]])
    return raw, control


def replacement_speed(pool: dict[str, Any]) -> tuple[float, float]:
    """How fast the replacement of the first lost worker steps its slice, against the other workers in the same rollouts.

    ``pool`` is ``train_summary.json``'s (``tasks.compose.recovery_summary``): each rollout's seconds
    per worker and the rollouts in which a worker was lost. A worker's *relative time* in a rollout
    is its seconds over the median of the other workers'. Returns (the lost worker's median relative
    time before the loss over its replacement's after it, the replacement's relative time in the
    rollout it redid over that median before). The first rollout holds the actors' start-up and is
    left out; the redone one is reported apart. A drift of the machine's speed moves every worker of
    a rollout alike, so it cancels here, where a before/after throughput ratio of one run takes it in.
    NaN where no rollout lost a worker or none came between the start-up and the loss.
    """
    if not pool["lost_in_rollouts"] or pool["lost_in_rollouts"][0] < 2:
        return float("nan"), float("nan")
    seconds, lost_at = pool["worker_rollout_s"], pool["lost_in_rollouts"][0]
    col = pool["rollout_workers"].index(pool["recoveries"][0]["worker"])

    def relative(row: list[float]) -> float:
        return row[col] / statistics.median(x for j, x in enumerate(row) if j != col)

    before = statistics.median(relative(row) for row in seconds[1:lost_at])
    after = [relative(row) for row in seconds[lost_at + 1 :]]
    return (before / statistics.median(after) if after else float("nan")), relative(seconds[lost_at]) / before


def split_ceiling(walls: list[float], rollout_s: list[float], workers: int) -> float:
    """The end-to-end ratio ``workers`` env workers could give over these in-process runs, at best.

    Each in-process run's rollouts (``rollout_s``: the seconds its workers' slices took, one after
    the other) divided perfectly among ``workers`` processes, and nothing else changed: no Ray
    start-up, transfer or slice imbalance, the same imports, behaviour cloning, PPO updates,
    evaluations and tracking. Over the runs as the benchmark weighs them (their steps over their
    time). Only the rollouts are what more env workers divide; the rest bounds the ratio.
    """
    if not walls or len(walls) != len(rollout_s) or workers < 1:
        return float("nan")
    ideal = [wall - r * (1.0 - 1.0 / workers) for wall, r in zip(walls, rollout_s, strict=True)]
    return sum(walls) / sum(ideal) if min(ideal) > 0 else float("nan")


def _rollout_seconds(summary: dict[str, Any]) -> float:
    """Every worker's seconds stepping its slices over the run (``train_summary.json``'s ``pool``)."""
    return float(sum(sum(row) for row in summary["pool"].get("worker_rollout_s", [])))


def kill_run_steps(total_steps: int, rollout_steps: int, kill_after_update: int) -> int:
    """Steps of the kill run: half the steps, and at least ``2 * kill_after_update + 8`` updates of ``rollout_steps``.

    So the per-update throughput before and after the kill is a median over some ``kill_after_update``
    updates each (with the shipped rollout of 2048 steps and the kill after update 20: 98,304 steps).
    """
    return max(total_steps // 2, (2 * kill_after_update + 8) * rollout_steps)


def run_train_bench(
    params: Path,
    work: Path,
    total_steps: int,
    rollout_steps: int = 2048,
    side_order: tuple[str, ...] = SIDE_ORDER,
    kill_after_update: int = KILL_AFTER_UPDATE,
) -> dict[str, Any]:
    """Prepare the catalogue and exploration dataset once, then train on each backend and once with a kill.

    ``rollout_steps`` is the params' rollout (``train.num_envs * train.n_steps``), which sizes the kill run
    (:func:`kill_run_steps`); ``side_order`` and ``kill_after_update`` shrink the benchmark (``--quick``).
    """
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
    # in-process, ray, ray, in-process: the machine's speed drifts over minutes (other tenants), and
    # this order puts each backend's runs at the same mean time, so a linear drift cancels in the ratio
    params_of = {"inprocess": inprocess_params, "ray": ray_params}
    machine = MachineLoad()
    ordered = [
        (name, _train(params_of[name], data, work / f"{name}-{i}", total_steps, None))
        for i, name in enumerate(side_order)
    ]
    runs = {backend: [run for name, run in ordered if name == backend] for backend in params_of}
    # the kill run: the kill after the checkpoint of update kill_after_update (see kill_run_steps)
    # no convergence stop: the run must reach the kill and the updates after it (a small config converges early)
    kill_params = _params_with(params, work, "ray", "ray-kill", stop_on_convergence=False)
    kill_steps = kill_run_steps(total_steps, rollout_steps, kill_after_update)
    kill = _train(kill_params, data, work / "ray-kill", kill_steps, kill_after_update)
    out: dict[str, Any] = {"total_steps": total_steps, "machine_cpus": os.cpu_count(), "machine_load": machine.result()}
    out["side_order"] = list(side_order)
    out["kill_after_update"], out["kill_run_steps"] = kill_after_update, kill_steps
    for name, sides in runs.items():
        steps, wall = sum(r["summary"]["global_step"] for r in sides), sum(r["wall_s"] for r in sides)
        out[f"{name}_env_steps_per_s"] = steps / wall  # over both runs of the backend
        out[f"{name}_runs_env_steps_per_s"] = [r["summary"]["global_step"] / r["wall_s"] for r in sides]
        out[f"{name}_loop_sps"] = statistics.median([x for r in sides for x in r["sps"]])
        out[f"{name}_wall_s"] = [r["wall_s"] for r in sides]
        out[f"{name}_policy_hash"] = sorted({r["summary"]["policy_hash"] for r in sides})
    out["train_sps_ratio_ray_vs_inprocess"] = out["ray_env_steps_per_s"] / out["inprocess_env_steps_per_s"]
    out["loop_sps_ratio_ray_vs_inprocess"] = out["ray_loop_sps"] / out["inprocess_loop_sps"]
    workers = len(runs["ray"][0]["summary"]["pool"].get("rollout_workers", [])) or 1
    out["inprocess_rollout_s"] = [_rollout_seconds(r["summary"]) for r in runs["inprocess"]]
    out["train_sps_ratio_ceiling"] = split_ceiling(out["inprocess_wall_s"], out["inprocess_rollout_s"], workers)
    out["ray_share_of_ceiling"] = out["train_sps_ratio_ray_vs_inprocess"] / out["train_sps_ratio_ceiling"]
    hashes = out["ray_policy_hash"] + out["inprocess_policy_hash"]
    out["same_policy_on_both_backends"] = len(set(hashes)) == 1
    pool = kill["summary"]["pool"]
    k = kill["killed_at"] or 1
    before = kill["sps"][1:k]
    out["kill_worker_restarts"] = pool["worker_restarts"]
    out["kill_recovery_s"] = max((r["recovery_s"] for r in pool["recoveries"]), default=float("nan"))
    out["kill_episodes_lost"] = pool["episodes_lost"]
    out["kill_steps_lost"] = pool["steps_lost"]
    out["kill_update_sps_ratio"] = kill["sps"][k] / statistics.median(before) if k < len(kill["sps"]) else float("nan")
    raw, control = post_kill_ratios(kill["sps"], [r["sps"] for r in runs["ray"]], k)
    out["post_kill_sps_ratio_raw"] = raw
    out["uninterrupted_sps_ratio_same_updates"] = control
    out["post_kill_sps_ratio"] = raw / control
    out["post_kill_worker_speed_ratio"], out["kill_redone_rollout_relative_time"] = replacement_speed(pool)
    out["runs_in_order"] = "; ".join(
        f"{name} {run['summary']['global_step'] / run['wall_s']:,.0f} env-steps/s ({run['wall_s']:.1f} s, "
        f"{run['steal']:.1%} steal)"
        for name, run in ordered
    )
    out["repeat_keys"] = [
        "train_sps_ratio_ceiling",
        "ray_share_of_ceiling",
        "loop_sps_ratio_ray_vs_inprocess",
        "runs_in_order",
    ]
    out["targets"] = TARGETS
    out["targets_met"] = {
        key: bool(out[key] >= bound if HIGHER_IS_BETTER[key] else out[key] <= bound) for key, bound in TARGETS.items()
    }
    out["notes"] = [
        "train_sps_ratio_ray_vs_inprocess: end-to-end `agentflow train` (shipped params.yaml, pool.backend the only "
        "difference, train.total_steps unless --total-steps says otherwise) env-steps/s over the command's wall time, "
        f"Ray start-up included; runs in the order {', '.join(side_order)} (with two per backend, a drift of the "
        "machine's speed over the minutes weighs on both backends alike), each backend's steps over its runs' time.",
        f"kill_*: one active env worker SIGKILLed after the checkpoint of update {kill_after_update} of a ray run "
        f"({kill_steps} steps); kill_recovery_s is the pool's loss detection to replacement answering; "
        "post_kill_sps_ratio_raw compares the median per-update throughput (steps over the time since the previous "
        "update ended) after the kill's update with the one before it, from the second update on (the first holds "
        "the actors' start-up); uninterrupted_sps_ratio_same_updates is the same ratio over the same updates of the "
        "two ray runs without a kill, and post_kill_sps_ratio the first over the second (1.0: the kill left no lasting "
        "slowdown); steps lost are the redone slice's rollout steps. post_kill_worker_speed_ratio (the target): the "
        "killed worker's rollout seconds over the other worker's in the same rollouts, median before the kill, over "
        "its replacement's after the redone rollout (1.0: the replacement steps its slice as fast as the worker it "
        "replaced; a drift of the machine's speed moves both workers of a rollout alike and cancels, where it enters "
        "the throughput ratios above); kill_redone_rollout_relative_time is the replacement's relative time in the "
        "rollout it redid over the killed worker's before.",
        "train_sps_ratio_ceiling: the end-to-end ratio the ray side's env workers could give at best over the two "
        "in-process runs: each run's rollouts (inprocess_rollout_s, its workers' slices one after the other) divided "
        "perfectly among them and nothing else changed (no Ray start-up, transfer or slice imbalance; the same imports, "
        "behaviour cloning, PPO updates, evaluations, checkpoints and tracking, which no number of env workers "
        "divides); ray_share_of_ceiling is the measured ratio over it.",
        machine.note(),
    ]
    return out
