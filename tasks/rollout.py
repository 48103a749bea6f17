"""What the stress phase and the report share: the policy under test, the catalogue, greedy rollouts.

A policy reference is a checkpoint directory (``update_*`` with ``model.safetensors``), a checkpoint
root (its ``best.json`` or ``latest.json``), or ``expert`` for the scripted expert (the reference of
what is achievable). Rollouts run on the pool :mod:`tasks.compose` builds, with a round-robin
scheduler (equal episodes per variant) and the configured shaped reward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentflow_core.contracts import PolicyFn
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.stress import RiskRule, StressRollout, run_stress_episodes
from agentflow_core.process import ProcessSpec
from agentflow_core.splits import assign_splits, read_splits
from agentflow_core.variants import VariantSpec, generate_variants
from tasks.compose import PoolFactory, base_env_infos, build_pool, expert_policy_hash, reward_function
from tasks.context import PhaseContext

EXPERT = "expert"


@dataclass(frozen=True)
class LoadedPolicy:
    """A greedy policy ready to act, with the name and checkpoint reports show."""

    name: str
    checkpoint: str
    act: PolicyFn


def resolve_checkpoint(ctx: PhaseContext, checkpoint: str | Path | None) -> str:
    """``expert``, or the checkpoint directory that ``checkpoint`` (default: the best one) points at."""
    from agentflow_core.rl.checkpoint import BEST, STATE_FILE, load_intact

    if checkpoint is not None and str(checkpoint) == EXPERT:
        return EXPERT
    path = Path(checkpoint) if checkpoint is not None else ctx.paths.checkpoints
    for root in (path, path / "checkpoints"):  # a checkpoint, a checkpoint root, or a training output dir
        if (root / STATE_FILE).is_file():
            return str(root)
        found = (
            load_intact(root, BEST, vocabulary=ctx.vocabulary) if root.is_dir() else None
        )  # a damaged best falls back to the newest intact
        if found is not None:
            return str(found.path)
    raise AgentFlowError(
        f"no checkpoint at {path} (no {STATE_FILE}, best.json or latest.json): train first, "
        f"or pass --checkpoint PATH, or --checkpoint {EXPERT} for the scripted expert"
    )


def load_policy(ref: str, process: ProcessSpec) -> LoadedPolicy:
    """The greedy policy of a resolved checkpoint (``resolve_checkpoint``) or the scripted expert.

    ``process`` is the business process the policy acts in: its expert and widths.
    """
    if ref == EXPERT:
        expert = process.expert()
        return LoadedPolicy(expert_policy_hash(expert), EXPERT, expert.act_batch)
    from agentflow_core.rl.checkpoint import load_checkpoint
    from agentflow_core.rl.policy import ActorCritic, policy_hash

    vocab = process.vocabulary
    ckpt = load_checkpoint(Path(ref), vocabulary=vocab)
    model = ActorCritic(vocab.obs_dim, vocab.n_actions, ckpt.state.get("hidden_sizes", [64, 64]))
    model.load_state_dict(ckpt.model)
    model.eval()
    return LoadedPolicy(f"{Path(ref).name}@{policy_hash(model)}", ref, model.act)


def load_variants(ctx: PhaseContext, catalogue: Path | None = None, split: str = "test") -> list[VariantSpec]:
    """One split of the catalogue (``data/variants``; stress and report read ``test``), or of the same
    generator's output and split when the catalogue was not written yet."""
    cfg = ctx.cfg
    path = catalogue or ctx.paths.variants
    if path.exists():
        return read_splits(path)[split]
    if catalogue is not None:
        raise AgentFlowError(f"catalogue {catalogue} does not exist")
    v = cfg.variants
    variants = generate_variants(
        base_env_infos(ctx),
        v.dimensions,
        v.perturbations,
        v.samples_per_combination,
        cfg.base.seed,
        scenario=ctx.vocabulary.scenario,
    )
    hashes = set(assign_splits(variants, v.split.validation, v.split.test, sorted(v.dimensions), cfg.base.seed)[split])
    return [variant for variant in variants if variant.content_hash in hashes]


def cart_scales(ctx: PhaseContext, families: Sequence[str] | None = None) -> dict[str, float]:
    """Per family, the encoded value of one cart item (its mapping's ``cart_items`` scale)."""
    scales = {}
    for entry in ctx.registry.entries():
        for rule in entry.mapping.get("feature_rules", []):
            if rule.get("feature") == "cart_items" and (families is None or entry.family in families):
                scales[entry.family] = float(rule.get("scale", 1.0))
    return scales


def stress_rollout(
    ctx: PhaseContext,
    policy: LoadedPolicy,
    variants: Sequence[VariantSpec],
    episodes: int,
    *,
    pool_factory: PoolFactory = build_pool,
    seed: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> StressRollout:
    """Run ``episodes`` greedy episodes of ``policy`` over ``variants`` with the configured shaped reward."""
    cfg = ctx.cfg
    stress = cfg.stress
    pool = pool_factory(ctx, variants, stress.num_envs, seed=cfg.base.seed, scheduler="round_robin", standby=False)
    try:
        with reward_function(ctx, pool.num_envs) as reward_fn:
            return run_stress_episodes(
                pool,
                policy.act,
                variants,
                episodes,
                seed=cfg.base.seed if seed is None else seed,
                reward_fn=reward_fn,
                risk=RiskRule(stress.risk_threshold, stress.risk_penalty),
                on_progress=on_progress,
            )
    finally:
        pool.close()
