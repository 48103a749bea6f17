"""Phase 3 step: stress validation of a checkpoint on a stratified sample of the catalogue's test split.

Called by ``agentflow stress`` (and so by the DVC stage) and by the Prefect task. Outputs
(atomically, as one directory, default ``data/stress/``): ``summary.json`` (every measure, see
``agentflow_core.evaluation.robustness``), ``episodes.parquet`` and ``steps.parquet`` (the
records), ``coverage_heatmap.png`` and ``consistency_matrix.png``. The exit metrics
(robustness_score, consistency, success_rate, crash_episodes, ...) also go to
``data/metrics/stress.json``, with process and goal success per family and per dimension value (95%
Wilson bounds), as in ``summary.json``'s ``process_success`` / ``goal_success`` (the goal token reached;
the key is kept for the committed metrics).

The policy is a reference :func:`tasks.rollout.resolve_checkpoint` understands (default: the best
checkpoint under ``data/checkpoints``).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agentflow_core.atomic import atomic_dir, check_output, write_json
from agentflow_core.config import AgentFlowConfig
from agentflow_core.evaluation.channel_consistency import cross_channel_consistency
from agentflow_core.evaluation.proportions import SuccessBreakdown
from agentflow_core.evaluation.records import EpisodeRecord, StepRecord
from agentflow_core.evaluation.robustness import StressAnalysis, analyze_stress
from agentflow_core.evaluation.stress import StressRollout, stratified_sample
from agentflow_core.evaluation.value import ValueBreakdown
from agentflow_core.gates import evaluate_gate, stress_gate
from agentflow_core.variants import VariantSpec
from tasks.budgets import budget_metrics
from tasks.compose import PoolFactory, build_pool, reachable_tokens
from tasks.context import PhaseContext
from tasks.plots import write_plots
from tasks.real_channels import run_sim_to_real, run_sim_to_real_oscar, sim_to_real_by_dimension
from tasks.rollout import LoadedPolicy, cart_scales, load_policy, load_variants, resolve_checkpoint, stress_rollout

METRIC_KEYS = (
    "robustness_score",
    "consistency",
    "success_rate",
    "crash_episodes",
    "crash_rate",
    "matched_state_consistency",
    "consistency_random",
    "cross_channel_consistency",
    "cross_channel_consistency_random",
    "goal_success_rate",
    "state_coverage",
    "mean_evaluated_return",
    "failure_rate",
    "episodes",
)


def _reachable(ctx: PhaseContext, variants: Sequence[VariantSpec]) -> list[str]:
    registry = ctx.registry
    known = [b for b in {v.base_env_id for v in variants} if b in registry]
    return reachable_tokens({registry.get(b).class_path for b in known}, ctx.vocabulary.tokens)


def evaluate_stress(
    ctx: PhaseContext,
    policy: LoadedPolicy,
    variants: Sequence[VariantSpec],
    *,
    episodes: int | None = None,
    pool_factory: PoolFactory = build_pool,
    reachable: Sequence[str] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[StressRollout, StressAnalysis, list[VariantSpec]]:
    """Stratified sample -> rollouts -> analysis (no files written)."""
    cfg = ctx.cfg
    dimensions = [d for d in cfg.variants.dimensions if any(d in v.params for v in variants)]
    sample = stratified_sample(variants, cfg.stress.variants, dimensions, np.random.default_rng(cfg.base.seed))
    rollout = stress_rollout(
        ctx, policy, sample, episodes or cfg.stress.episodes, pool_factory=pool_factory, on_progress=on_progress
    )
    families = sorted({v.family for v in sample})
    analysis = analyze_stress(
        rollout,
        policy.act,
        cfg.stress,
        dimensions,
        [v.env_id for v in sample],
        reachable if reachable is not None else _reachable(ctx, sample),
        cart_scales(ctx, families),
        ctx.process.probes,
        vocabulary=ctx.vocabulary,
    )
    return rollout, analysis, list(sample)


def _params_json(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), default=str)


def write_records(
    out_dir: Path, steps: Sequence[StepRecord], episodes: Sequence[EpisodeRecord], actions: Sequence[str]
) -> None:
    """``steps.parquet`` and ``episodes.parquet``: the records the analysis was computed from."""
    pq.write_table(
        pa.table(
            {
                "episode_id": [s.episode_id for s in steps],
                "env_id": [s.env_id for s in steps],
                "family": [s.family for s in steps],
                "params_json": [_params_json(s.params) for s in steps],
                "step_id": pa.array([s.step_id for s in steps], pa.int32()),
                "state_tokens": [sorted(s.state_tokens) for s in steps],
                "action": pa.array([s.action for s in steps], pa.int16()),
                "action_name": [actions[s.action] for s in steps],
                "tokens": [sorted(s.tokens) for s in steps],
                "reward": pa.array([s.reward for s in steps], pa.float32()),
                "shaped_reward": pa.array([s.shaped_reward for s in steps], pa.float32()),
                "risk": pa.array([s.risk for s in steps], pa.float32()),
                "terminated": [s.terminated for s in steps],
                "truncated": [s.truncated for s in steps],
                "failure_reason": pa.array([s.failure_reason for s in steps], pa.string()),
            }
        ),
        out_dir / "steps.parquet",
    )
    pq.write_table(
        pa.table(
            {
                "episode_id": [e.episode_id for e in episodes],
                "env_id": [e.env_id for e in episodes],
                "family": [e.family for e in episodes],
                "params_json": [_params_json(e.params) for e in episodes],
                "length": [e.length for e in episodes],
                "env_return": [e.env_return for e in episodes],
                "shaped_return": [e.shaped_return for e in episodes],
                "evaluated_return": [e.evaluated_return for e in episodes],
                "reached_goal": [e.reached_goal for e in episodes],
                "success": [e.success for e in episodes],
                "failure_reason": pa.array([e.failure_reason for e in episodes], pa.string()),
                "crashed": [e.crashed for e in episodes],
                "risky_steps": [e.risky_steps for e in episodes],
                "last_tokens": [[sorted(t) for t in e.last_tokens()] for e in episodes],
            }
        ),
        out_dir / "episodes.parquet",
    )


def success_breakdowns(episodes: Sequence[EpisodeRecord], dimensions: Sequence[str]) -> dict[str, SuccessBreakdown]:
    """Process success (``success``) and goal success (``reached_goal``) per family and dimension value."""
    families, params = [e.family for e in episodes], [e.params for e in episodes]
    return {
        "process_success": SuccessBreakdown.of([e.success for e in episodes], families, params, dimensions),
        "goal_success": SuccessBreakdown.of([e.reached_goal for e in episodes], families, params, dimensions),
    }


def stress_summary(
    analysis: StressAnalysis,
    policy: LoadedPolicy,
    sample: Sequence[VariantSpec],
    cfg: AgentFlowConfig,
    episodes: Sequence[EpisodeRecord],
    goal: str,
) -> dict[str, Any]:
    """The JSON written as ``summary.json``: the analysis plus which policy ran on what (``goal``: the goal token)."""
    sample_ids = [v.env_id for v in sample]
    dimensions = sorted(cfg.variants.dimensions)
    breakdowns = success_breakdowns(episodes, dimensions)
    families, params = [e.family for e in episodes], [e.params for e in episodes]
    value = ValueBreakdown.of([e.business_value for e in episodes], families, params, dimensions)
    steps = {"stress_mean_episode_steps": float(np.mean([e.length for e in episodes])) if episodes else 0.0}
    return {
        **analysis.to_dict(),
        **{name: b.to_dict() for name, b in breakdowns.items()},
        **({} if value is None else {"business_value": value.to_dict()}),
        "breakdown_metrics": {k: v for name, b in breakdowns.items() for k, v in b.metrics(name).items()}
        | ({} if value is None else value.metrics("business_value"))
        | steps,
        "policy": policy.name,
        "process": cfg.process,
        "goal": goal,
        "checkpoint": policy.checkpoint,
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": cfg.stress.model_dump(mode="json"),
        "sample": {
            "split": "test",
            "variants": len(sample_ids),
            "sha256": hashlib.sha256("\n".join(sample_ids).encode()).hexdigest()[:16],
            "by_family": {f: sum(v.family == f for v in sample) for f in sorted({v.family for v in sample})},
        },
    }


def run_stress(
    ctx: PhaseContext,
    checkpoint: str | Path | None = None,
    catalogue: Path | None = None,
    out_dir: Path | None = None,
    metrics_path: Path | None = None,
    *,
    episodes: int | None = None,
    pool_factory: PoolFactory = build_pool,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Stress-validate a checkpoint; write the records, summary and plots; return the summary."""
    cfg = ctx.cfg
    started = time.perf_counter()
    paths = ctx.paths
    out_dir = out_dir or paths.stress
    metrics_path = metrics_path or paths.metrics_file("stress")
    check_output(out_dir)  # a read-only or full disk fails here, not after the episodes ran
    policy = load_policy(resolve_checkpoint(ctx, checkpoint), ctx.process)
    variants = load_variants(ctx, catalogue)
    rollout, analysis, sample = evaluate_stress(
        ctx, policy, variants, episodes=episodes, pool_factory=pool_factory, on_progress=on_progress
    )
    summary = stress_summary(analysis, policy, sample, cfg, rollout.episodes, ctx.vocabulary.goal)
    # the same policy on paired states of every channel (expert episodes, same params and seed, faults off)
    paired = cross_channel_consistency(
        ctx.process, ctx.registry, dict(cfg.variants.dimensions), policy.act, cfg.base.seed
    )
    summary["metrics"].update(paired)
    if cfg.stress.sim_to_real.enabled:  # the same policy on the real channels (same variants and seeds)
        real = run_sim_to_real(ctx, policy, sample)
        by_dimension = sim_to_real_by_dimension(real, sample, sorted(cfg.variants.dimensions))
        summary["sim_to_real"] = real.to_dict() | {"per_dimension": by_dimension["per_dimension"]}
        summary["metrics"].update(real.metrics() | by_dimension["metrics"])
    if cfg.stress.sim_to_real.enabled and cfg.stress.sim_to_real.oscar_episodes > 0:  # a store nobody here wrote
        oscar = run_sim_to_real_oscar(ctx, policy, sample)
        summary["sim_to_real_oscar"] = oscar
        summary["metrics"].update(oscar["metrics"])
    summary["reward_validator"] = validator_flags(ctx, rollout)
    if summary["reward_validator"] is not None:
        summary["metrics"]["validator_flagged"] = summary["reward_validator"]["flagged"]
        summary["metrics"]["validator_flagged_rate"] = summary["reward_validator"]["rate"]
    verdict = evaluate_gate(stress_gate(cfg), summary["metrics"])
    summary["passed"] = summary["passed"] and verdict.passed
    summary["gate"] = verdict.message
    summary["budget"] = budget_metrics("stress", time.perf_counter() - started, cfg.stress.budget_s)
    with atomic_dir(Path(out_dir)) as tmp:
        write_records(tmp, rollout.steps, rollout.episodes, ctx.vocabulary.actions)
        summary["plots"] = write_plots(summary, tmp)
        write_json(tmp / "summary.json", summary)
    write_json(
        metrics_path,
        {k: summary["metrics"][k] for k in METRIC_KEYS}
        | {"passed": summary["passed"]}
        | summary["breakdown_metrics"]
        | {k: v for k, v in summary["metrics"].items() if k.startswith(("sim_to_real_", "real_process_success_"))}
        | summary["budget"]
        | {
            k: summary["metrics"][k] for k in ("validator_flagged", "validator_flagged_rate") if k in summary["metrics"]
        },
    )
    return summary


def validator_flags(ctx: PhaseContext, rollout: StressRollout) -> dict[str, Any] | None:
    """The discriminator reward validator's verdict on the stress episodes (None when off or not trained)."""
    from agentflow_core.evaluation.validator import validate_episodes
    from tasks.steps.validator import load_validator

    cfg = ctx.cfg
    model = load_validator(ctx)
    if model is None:
        return None
    vocabulary = ctx.vocabulary
    return validate_episodes(model, rollout.episodes, rollout.steps, cfg.validator.threshold, vocabulary).to_dict()
