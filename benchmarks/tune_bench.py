"""End-to-end ``agentflow train`` with the auto-tuner's choice vs the static settings, here and on a simulated larger cluster.

Every side is the product's own commands in their own processes over the same catalogue and
exploration dataset (the project's ``data/variants`` and ``data/trajectories``, read only):

- ``static``: the params as given with ``tune.enabled: false`` -> ``agentflow train``;
- ``tuned``: ``tune.enabled: true`` -> ``agentflow tune`` then ``agentflow train`` (which reads the choice).

A side's env-steps/s is train's ``global_step`` over the train command's wall time (Ray start-up,
BC, PPO, evaluations and the final test evaluation included); the probe's time is reported apart
and also folded in (``*_with_probe``). The simulated cluster is a local Ray advertising
``cluster_cpus`` logical CPUs on this machine's cores, its static side running ``cluster_workers``
env workers (one per advertised CPU): the same code as on a real cluster, more workers than cores.
Each side also reports the train gate and the test-split process success, since the cadence the
tuner picks changes learning.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agentflow_core.errors import AgentFlowError
from benchmarks.machine import MachineLoad

TARGETS = {"sps_ratio_2_workers": 1.2, "sps_ratio_cluster": 1.2}


def _params(source: Path, work: Path, name: str, tune: bool, ray_cpus: int | None, workers: int | None) -> Path:
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    data.setdefault("tune", {})["enabled"] = tune
    base = data.setdefault("base", {})
    base.update(data_dir=str(work / name / "data"), state_dir=str(work / name / ".agentflow"))
    if ray_cpus is not None:
        base.setdefault("ray", {})["num_cpus"] = ray_cpus
    if workers is not None:
        data.setdefault("pool", {})["num_workers"] = workers
    path = work / f"params-{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _run(args: list[str]) -> float:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(
            f"agentflow {' '.join(args)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}"
        )
    return wall


def run_side(
    params: Path, catalogue: Path, trajectories: Path, total_steps: int, tune: bool, work: Path
) -> dict[str, Any]:
    """``agentflow tune`` (tuned side) then ``agentflow train``; the side's rates, settings and learning."""
    data = yaml.safe_load(params.read_text(encoding="utf-8"))["base"]["data_dir"]
    data_dir = Path(data)
    common = ["--catalogue", str(catalogue), "--trajectories", str(trajectories)]
    probe_s = 0.0
    if tune:
        probe_s = _run(["tune", "--params", str(params), *common])
    out = data_dir / "checkpoints"
    wall = _run(["train", "--params", str(params), *common, "--out", str(out), "--total-steps", str(total_steps)])
    summary = json.loads((out / "train_summary.json").read_text(encoding="utf-8"))
    side: dict[str, Any] = {
        "train_wall_s": wall,
        "probe_s": probe_s,
        "global_step": summary["global_step"],
        "env_steps_per_s": summary["global_step"] / wall,
        "env_steps_per_s_with_probe": summary["global_step"] / (wall + probe_s),
        "stop_reason": summary["stop_reason"],
        "gate_passed": summary["passed"],
        "test_process_success": summary["test_process_success"],
        "validation_process_success": summary["validation_process_success"],
        "tuning": summary.get("tuning", {}),
        "impedance": summary.get("impedance", {}),
    }
    if tune:
        choice = json.loads((data_dir / "tuning" / "choice.json").read_text(encoding="utf-8"))
        side["choice"] = choice["settings"]
        side["decisions"] = [f"{d['knob']} {d['shipped']} -> {d['value']}: {d['reason']}" for d in choice["decisions"]]
    return side


def run_tune_bench(
    params: Path,
    work: Path,
    total_steps: int,
    cluster_cpus: int,
    cluster_workers: int,
    rounds: int = 1,
    catalogue: Path = Path("data/variants"),
    trajectories: Path = Path("data/trajectories"),
    log: Callable[[str], object] = print,
    cluster: bool = True,
) -> dict[str, Any]:
    """Static vs tuned on the params' own cluster, then on a local Ray advertising ``cluster_cpus`` CPUs.

    ``rounds`` > 1 runs every side again, static and tuned alternating, so a drift in the machine's load
    reaches both sides; a setup's ratio is the mean tuned env-steps/s over the mean static one, and
    each round's own ratio is listed. Without ``cluster`` only the params' own setup runs (half the
    commands), and only its target is judged.
    """
    for needed in (catalogue, trajectories):
        if not needed.exists():
            raise AgentFlowError(f"{needed} is missing: run `agentflow variants` and `agentflow explore` first")
    work.mkdir(parents=True, exist_ok=True)
    machine = MachineLoad()
    setups = {"2_workers": (None, None), "cluster": (cluster_cpus, cluster_workers)}
    if not cluster:
        del setups["cluster"]
    out: dict[str, Any] = {
        "total_steps": total_steps,
        "rounds": rounds,
        "machine_cores": len(os.sched_getaffinity(0)),
        "cluster_cpus": cluster_cpus,
        "cluster_static_workers": cluster_workers,
    }
    sides: dict[str, list[dict[str, Any]]] = {}
    for r in range(rounds):
        for setup, (cpus, workers) in setups.items():
            for name, tune in (("static", False), ("tuned", True)):
                log(f"bench tune: round {r + 1}/{rounds}, {setup} {name}")
                p = _params(params, work / f"round{r}", f"{setup}-{name}", tune, cpus, workers)
                sides.setdefault(f"{setup}_{name}", []).append(
                    run_side(p, catalogue, trajectories, total_steps, tune, work)
                )
    for setup in setups:
        static, tuned = sides[f"{setup}_static"], sides[f"{setup}_tuned"]
        for name, runs in (("static", static), ("tuned", tuned)):
            out[f"{setup}_{name}"] = runs[-1]
            out[f"{setup}_{name}_env_steps_per_s"] = statistics.mean(s["env_steps_per_s"] for s in runs)
            out[f"{setup}_{name}_gate_passed"] = all(s["gate_passed"] for s in runs)
            out[f"{setup}_{name}_test_process_success"] = min(s["test_process_success"] for s in runs)
        out[f"sps_ratio_{setup}"] = out[f"{setup}_tuned_env_steps_per_s"] / out[f"{setup}_static_env_steps_per_s"]
        with_probe = statistics.mean(s["env_steps_per_s_with_probe"] for s in tuned)
        out[f"sps_ratio_{setup}_with_probe"] = with_probe / out[f"{setup}_static_env_steps_per_s"]
        out[f"sps_ratio_{setup}_per_round"] = [
            t["env_steps_per_s"] / s["env_steps_per_s"] for s, t in zip(static, tuned, strict=True)
        ]
    out["targets"] = {key: bound for key, bound in TARGETS.items() if key in out}
    out["targets_met"] = {key: bool(out[key] >= bound) for key, bound in out["targets"].items()}
    out["machine_load"] = machine.result()
    out["notes"] = [
        "env-steps/s: train's global_step over the `agentflow train` command's wall time (mean over rounds); "
        "*_with_probe adds the `agentflow tune` command's wall time (its process start-up included) to the tuned side.",
        f"cluster: a local Ray advertising {cluster_cpus} logical CPUs on {out['machine_cores']} cores; its static "
        f"side runs {cluster_workers} env workers, one per advertised CPU.",
        "test_process_success: the lowest over the rounds (the cadence the tuner picks changes learning).",
        machine.note(),
    ]
    for setup in setups:
        out["notes"] += [f"{setup} tuned: {line}" for line in sides[f"{setup}_tuned"][-1].get("decisions", [])]
    return out
