"""What a training run writes besides its checkpoints: the policy card, curves, plots and DVC metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.atomic import atomic_file, write_json, write_text
from agentflow_core.pool.scheduler import cold_share
from agentflow_core.rl.policy import policy_hash
from tasks.steps.evaluation import test_summary
from tasks.steps.train_state import FinalPolicy, TrainingRun, TrainingState

METRIC_KEYS = (
    "test_process_success",
    "test_goal_success",
    "test_return",
    "test_process_success_vs_exploration",
    "test_process_success_vs_rules",
    "test_goal_success_vs_exploration",
    "test_goal_success_vs_rules",
    "validation_process_success",
    "policy_convergence_flag",
    "stopped_on_convergence",
    "global_step",
    "updates",
    "scheduler_cold_share",
)


def train_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """``data/metrics/train.json`` (and the MLflow run's summary): headline numbers, then the test split's
    payment and process success per family and dimension value with their 95% Wilson bounds."""
    budget = {k: float(v) for k, v in summary.items() if k.startswith("budget/")}
    impedance = {k: float(v) for k, v in summary.get("impedance", {}).items()}
    headline = {k: float(summary[k]) for k in METRIC_KEYS if summary.get(k) is not None}
    return headline | summary["test_metrics"] | budget | impedance


def write_curve_csv(evals: list[dict[str, float]], path: Path) -> None:
    """Validation success/return per evaluation, the training curve ``dvc plots show`` draws."""
    lines = ["step,validation_process_success,validation_goal_success,validation_return"]
    lines += [
        f"{int(e['global_step'])},{e['validation/process_success_rate']:.6f},"
        f"{e['validation/success_rate']:.6f},{e['validation/mean_return']:.6f}"
        for e in evals
    ]
    write_text(path, "\n".join(lines) + "\n")


def write_outputs(
    out_dir: Path,
    summary: dict[str, Any],
    card: dict[str, Any],
    curve: list[dict[str, float]],
    evals: list[dict[str, float]],
) -> None:
    """``policy.json`` (the policy card), ``curve.json``, ``train_summary.json`` and the validation CSV."""
    write_json(out_dir / "policy.json", card)
    write_json(out_dir / "curve.json", {"curve": curve, "evals": evals})
    write_json(out_dir / "train_summary.json", summary)
    write_curve_csv(evals, out_dir / "validation_curve.csv")


def plot_curves(curve: list[dict[str, float]], evals: list[dict[str, float]], path: Path) -> None:
    """The training curves as a PNG (a bare ``Figure``, no pyplot: drawn on a helper thread)."""
    from matplotlib.figure import Figure

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 4))
    ax_s, ax_r = fig.subplots(1, 2)
    steps = [c["global_step"] for c in curve]
    ax_s.plot(steps, [c.get("rollout/success_rate", np.nan) for c in curve], label="training rollouts")
    ax_r.plot(steps, [c.get("rollout/episode_return", np.nan) for c in curve], label="training rollouts")
    if evals:
        ax_s.plot(
            [e["global_step"] for e in evals],
            [e["validation/process_success_rate"] for e in evals],
            "o-",
            label="validation process success (greedy)",
        )
        ax_r.plot(
            [e["global_step"] for e in evals], [e["validation/mean_return"] for e in evals], "o-", label="validation"
        )
    ax_s.set(xlabel="environment steps", ylabel="success rate", title="success rate")
    ax_r.set(xlabel="environment steps", ylabel="episode return (env reward)", title="reward")
    for ax in (ax_s, ax_r):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def best_validation(state: TrainingState) -> dict[str, float]:
    """The best checkpoint's validation figures: process success, and business value where it was measured."""
    best = next((e for e in state.evals if int(e["update"]) == state.tracker.best_step), None)
    if best is None:
        return {"validation_process_success": state.tracker.best_metric}
    out = {"validation_process_success": best["validation/process_success_rate"]}
    if "validation/business_value" in best:
        out["validation_business_value"] = best["validation/business_value"]
    return out


def train_summary(
    run: TrainingRun,
    state: TrainingState,
    best: FinalPolicy,
    wall_s: float,
    warm_start: Path | None,
    ewc: Path | None,
    tuning: dict[str, Any] | None,
) -> dict[str, Any]:
    """``train_summary.json`` before the gate's verdict: the best policy, the test split, how training went."""
    recovery, penalty, offline = best.recovery, run.penalty, run.offline
    return {
        "policy_hash": policy_hash(best.policy),
        "best_checkpoint": best.checkpoint.path.name,
        "updates": run.ppo.update,
        "global_step": run.ppo.global_step,
        "scheduler_cold_share": cold_share(run.ppo.rollouts.scheduler.state_dict()),  # draws on cold variants
        "train_variants": len(run.splits["train"]),
        "validation_variants": len(run.splits["validation"]),
        "test_variants": len(run.splits["test"]),
        **best_validation(state),
        **test_summary(best.final),
        "policy_convergence_flag": state.tracker.converged,
        "stop_reason": state.stop_reason,
        "stopped_on_convergence": state.stop_reason == "converged",
        "evaluations": len(state.evals),
        "bc": state.bc_summary,
        "pool": recovery,
        "worker_restarts": recovery["worker_restarts"],
        "steps_lost": recovery["steps_lost"],
        "worker_recovery_s": max((r["recovery_s"] for r in recovery["recoveries"]), default=0.0),
        "seed": run.seed,
        "offline": None if offline is None else {"actor": str(offline.path), **offline.settings},
        "warm_start": None
        if warm_start is None
        else {"checkpoint": str(warm_start), "policy_hash": policy_hash(run.untrained)},
        "wall_s": wall_s,
        "update_sps": state.update_sps,
        "ewc": {"used": False} if penalty is None else {"used": True, "file": str(ewc), **penalty.summary()},
        "reward_validator": run.validator is not None,
        "impedance": run.impedance.summary(),
        "tuning": tuning or {"applied": False, "reason": "run without the auto-tuner"},
    }
