"""Phase 3 step: stress validation of a checkpoint on a stratified catalogue sample.

Called by ``agentflow stress`` (and so by the DVC stage) and by the Prefect task. Outputs
(atomically, as one directory, default ``data/stress/``): ``summary.json`` (every measure, see
``agentflow_core.evaluation.robustness``), ``episodes.parquet`` and ``steps.parquet`` (the
records), ``coverage_heatmap.png`` and ``consistency_matrix.png``. The exit metrics
(robustness_score, consistency, success_rate, crash_episodes, ...) also go to
``data/metrics/stress.json``.

The policy is a checkpoint directory (``update_*`` with ``model.safetensors``), a checkpoint
root (its ``best.json`` or ``latest.json``), or ``expert`` for the scripted expert (the
reference of what is achievable). Default: the best checkpoint under ``data/checkpoints``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agentflow_core.config import AgentFlowConfig
from agentflow_core.envs.experts import ScriptedExpert
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.records import EpisodeRecord, PolicyFn, StepRecord
from agentflow_core.evaluation.robustness import StressAnalysis, analyze_stress
from agentflow_core.evaluation.stress import RiskRule, StressRollout, run_stress_episodes, stratified_sample
from agentflow_core.rl.reward import RewardFunction
from agentflow_core.rl.reward_model import RewardModelClient
from agentflow_core.semantics import ACTIONS
from agentflow_core.variants import BaseEnvInfo, VariantSpec, generate_variants, read_catalogue
from tasks.io import atomic_dir, write_json
from tasks.paths import DataPaths
from tasks.plots import plot_consistency_matrix, plot_coverage_heatmap
from tasks.registry_io import load_registry
from tasks.steps.explore import expert_policy_hash, reachable_tokens

EXPERT = "expert"
METRIC_KEYS = (
    "robustness_score",
    "consistency",
    "success_rate",
    "crash_episodes",
    "matched_state_consistency",
    "payment_success_rate",
    "state_coverage",
    "mean_evaluated_return",
    "failure_rate",
    "episodes",
)
PoolFactory = Callable[[Sequence[VariantSpec], AgentFlowConfig, int], Any]


@dataclass(frozen=True)
class LoadedPolicy:
    """A greedy policy ready to act, with the name and checkpoint reports show."""

    name: str
    checkpoint: str
    act: PolicyFn


def resolve_checkpoint(cfg: AgentFlowConfig, checkpoint: str | Path | None) -> str:
    """``expert``, or the checkpoint directory that ``checkpoint`` (default: the best one) points at."""
    from agentflow_core.rl.checkpoint import BEST, STATE_FILE, load_intact

    if checkpoint is not None and str(checkpoint) == EXPERT:
        return EXPERT
    path = Path(checkpoint) if checkpoint is not None else DataPaths.of(cfg).checkpoints
    for root in (path, path / "checkpoints"):  # a checkpoint, a checkpoint root, or a training output dir
        if (root / STATE_FILE).is_file():
            return str(root)
        found = load_intact(root, BEST) if root.is_dir() else None  # a damaged best falls back to the newest intact
        if found is not None:
            return str(found.path)
    raise AgentFlowError(
        f"no checkpoint at {path} (no {STATE_FILE}, best.json or latest.json): train first, "
        f"or pass --checkpoint PATH, or --checkpoint {EXPERT} for the scripted expert"
    )


def load_policy(ref: str) -> LoadedPolicy:
    """The greedy policy of a resolved checkpoint (``resolve_checkpoint``) or the scripted expert."""
    if ref == EXPERT:
        expert = ScriptedExpert()
        return LoadedPolicy(expert_policy_hash(expert), EXPERT, expert.act_batch)
    from agentflow_core.rl.checkpoint import load_checkpoint
    from agentflow_core.rl.policy import ActorCritic, policy_hash

    ckpt = load_checkpoint(Path(ref))
    model = ActorCritic(hidden_sizes=ckpt.state.get("hidden_sizes", [64, 64]))
    model.load_state_dict(ckpt.model)
    model.eval()
    return LoadedPolicy(f"{Path(ref).name}@{policy_hash(model)}", ref, model.act)


def load_variants(cfg: AgentFlowConfig, catalogue: Path | None = None) -> list[VariantSpec]:
    """The catalogue (``data/variants``), or the same generator's output when it was not written yet."""
    path = catalogue or DataPaths.of(cfg).variants
    if path.exists():
        return read_catalogue(path)
    if catalogue is not None:
        raise AgentFlowError(f"catalogue {catalogue} does not exist")
    registry = load_registry(cfg)
    bases = [BaseEnvInfo(e.env_id, e.family, e.version) for e in map(registry.get, cfg.variants.base_envs)]
    v = cfg.variants
    return generate_variants(bases, v.dimensions, v.perturbations, v.samples_per_combination, cfg.base.seed)


def default_pool(variants: Sequence[VariantSpec], cfg: AgentFlowConfig, num_envs: int) -> Any:
    """An in-process pool over ``variants`` with a round-robin scheduler (equal episodes per variant)."""
    from agentflow_core.pool.base import RegistryEnvFactory
    from agentflow_core.pool.inprocess import InProcessPool

    registry = load_registry(cfg)
    entries = {base: registry.get(base) for base in sorted({v.base_env_id for v in variants})}
    pool_cfg = cfg.pool.model_copy(update={"scheduler": "round_robin"})
    return InProcessPool(
        variants, RegistryEnvFactory(entries), min(num_envs, max(len(variants), 1)), pool_cfg, seed=cfg.base.seed
    )


def cart_scales(cfg: AgentFlowConfig, families: Sequence[str] | None = None) -> dict[str, float]:
    """Per family, the encoded value of one cart item (its mapping's ``cart_items`` scale)."""
    scales = {}
    for entry in load_registry(cfg).entries():
        for rule in entry.mapping.get("feature_rules", []):
            if rule.get("feature") == "cart_items" and (families is None or entry.family in families):
                scales[entry.family] = float(rule.get("scale", 1.0))
    return scales


def _reachable(cfg: AgentFlowConfig, variants: Sequence[VariantSpec]) -> list[str]:
    registry = load_registry(cfg)
    known = [b for b in {v.base_env_id for v in variants} if b in registry]
    return reachable_tokens({registry.get(b).class_path for b in known})


def stress_rollout(
    cfg: AgentFlowConfig,
    policy: LoadedPolicy,
    variants: Sequence[VariantSpec],
    episodes: int,
    *,
    pool_factory: PoolFactory = default_pool,
    seed: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> StressRollout:
    """Run ``episodes`` greedy episodes of ``policy`` over ``variants`` with the configured shaped reward."""
    stress, reward_cfg = cfg.stress, cfg.train.reward
    pool = pool_factory(variants, cfg, stress.num_envs)
    client = (
        RewardModelClient(reward_cfg.model_url, reward_cfg.model_timeout_s)
        if reward_cfg.mode == "model" and reward_cfg.model_url
        else None
    )
    try:
        reward_fn = RewardFunction(reward_cfg, pool.num_envs, client)
        return run_stress_episodes(
            pool,
            policy.act,
            variants,
            episodes,
            seed=cfg.base.seed if seed is None else seed,
            reward_fn=reward_fn,
            risk=RiskRule(stress.risk_threshold, stress.risk_penalty),
            handled_outcomes=frozenset(stress.handled_outcomes),
            on_progress=on_progress,
        )
    finally:
        pool.close()
        if client is not None:
            client.close()


def evaluate_stress(
    cfg: AgentFlowConfig,
    policy: LoadedPolicy,
    variants: Sequence[VariantSpec],
    *,
    episodes: int | None = None,
    pool_factory: PoolFactory = default_pool,
    reachable: Sequence[str] | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> tuple[StressRollout, StressAnalysis, list[VariantSpec]]:
    """Stratified sample -> rollouts -> analysis (no files written)."""
    dimensions = [d for d in cfg.variants.dimensions if any(d in v.params for v in variants)]
    sample = stratified_sample(variants, cfg.stress.variants, dimensions, np.random.default_rng(cfg.base.seed))
    rollout = stress_rollout(
        cfg, policy, sample, episodes or cfg.stress.episodes, pool_factory=pool_factory, on_progress=on_progress
    )
    families = sorted({v.family for v in sample})
    analysis = analyze_stress(
        rollout,
        policy.act,
        cfg.stress,
        dimensions,
        [v.env_id for v in sample],
        reachable if reachable is not None else _reachable(cfg, sample),
        cart_scales(cfg, families),
    )
    return rollout, analysis, list(sample)


def _params_json(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True, separators=(",", ":"), default=str)


def write_records(out_dir: Path, steps: Sequence[StepRecord], episodes: Sequence[EpisodeRecord]) -> None:
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
                "action_name": [ACTIONS[s.action] for s in steps],
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


def stress_summary(
    analysis: StressAnalysis, policy: LoadedPolicy, sample: Sequence[VariantSpec], cfg: AgentFlowConfig
) -> dict[str, Any]:
    """The JSON written as ``summary.json``: the analysis plus which policy ran on what."""
    sample_ids = [v.env_id for v in sample]
    return {
        **analysis.to_dict(),
        "policy": policy.name,
        "checkpoint": policy.checkpoint,
        "created_at": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "config": cfg.stress.model_dump(mode="json"),
        "sample": {
            "variants": len(sample_ids),
            "sha256": hashlib.sha256("\n".join(sample_ids).encode()).hexdigest()[:16],
            "by_family": {f: sum(v.family == f for v in sample) for f in sorted({v.family for v in sample})},
        },
    }


def write_plots(summary: Mapping[str, Any], out_dir: Path) -> dict[str, str]:
    """The coverage heatmap and the consistency matrix as PNGs in ``out_dir``; returns name -> file."""
    plot_coverage_heatmap(summary["coverage"], out_dir / "coverage_heatmap.png")
    cons = summary["consistency"]
    plot_consistency_matrix(cons["canonical"], cons["per_variant"], out_dir / "consistency_matrix.png")
    return {"State coverage": "coverage_heatmap.png", "Policy consistency": "consistency_matrix.png"}


def run_stress(
    cfg: AgentFlowConfig,
    checkpoint: str | Path | None = None,
    catalogue: Path | None = None,
    out_dir: Path | None = None,
    metrics_path: Path | None = None,
    *,
    episodes: int | None = None,
    pool_factory: PoolFactory = default_pool,
    on_progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Stress-validate a checkpoint; write the records, summary and plots; return the summary."""
    paths = DataPaths.of(cfg)
    out_dir = out_dir or paths.stress
    metrics_path = metrics_path or paths.metrics_file("stress")
    policy = load_policy(resolve_checkpoint(cfg, checkpoint))
    variants = load_variants(cfg, catalogue)
    rollout, analysis, sample = evaluate_stress(
        cfg, policy, variants, episodes=episodes, pool_factory=pool_factory, on_progress=on_progress
    )
    summary = stress_summary(analysis, policy, sample, cfg)
    with atomic_dir(Path(out_dir)) as tmp:
        write_records(tmp, rollout.steps, rollout.episodes)
        summary["plots"] = write_plots(summary, tmp)
        write_json(tmp / "summary.json", summary)
    write_json(metrics_path, {k: summary["metrics"][k] for k in METRIC_KEYS} | {"passed": summary["passed"]})
    return summary
