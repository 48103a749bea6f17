"""``agentflow bench transfer``: a policy carries to a channel it never trained on (leave one channel out).

1. One catalogue of the process's variants (``agentflow variants`` as the product runs it).
2. **All channels**: explore + train (BC + PPO) on the whole catalogue's train split.
3. For each channel in turn, **held out**: the same explore + train on the catalogue without that
   channel (:func:`~agentflow_core.splits.channel_catalogue`: the other channels' variants, each in
   the split it had), then played greedily on the held-out channel's test variants next to the
   rules (the process's scripted expert) and the all-channel policy.
4. **Cross-channel action consistency on paired states**: the expert's episodes on paired scenarios
   (the same variant parameters and seed on every channel, faults off) give one state per step
   and channel; the share of paired states, over every pair of channels, on which a policy picks
   the same action. Shown for the all-channel policy and, for scale, a uniformly random legal policy.

Targets: on every held-out channel, test process success >= 0.95 of the rules'; consistency >= 0.95.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agentflow_core.config import AgentFlowConfig
from agentflow_core.contracts import PolicyFn
from agentflow_core.evaluation.channel_consistency import cross_channel_consistency
from agentflow_core.evaluation.policy_eval import (
    EvalResult,
    evaluate_policy,
    expert_policy,
    greedy_policy,
    stratified_eval_variants,
)
from agentflow_core.process import ProcessSpec
from agentflow_core.rl.checkpoint import load_checkpoint
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.splits import channel_catalogue, read_splits
from tasks.compose import build_pool
from tasks.config_io import parse_config
from tasks.context import PhaseContext
from tasks.overrides import apply_overrides
from tasks.rollout import resolve_checkpoint
from tasks.steps.explore import run_explore
from tasks.steps.train import run_train
from tasks.steps.variants import run_variants

DEFAULT_STEPS = 40_960
TEST_EPISODES = 128
SUCCESS_RATIO_TARGET = 0.95
CONSISTENCY_TARGET = 0.95


def _with(ctx: PhaseContext, data_dir: Path, overrides: Mapping[str, Any]) -> PhaseContext:
    data = apply_overrides(ctx.cfg.model_dump(mode="json"), {**overrides, "base.data_dir": str(data_dir)})
    return ctx.with_config(parse_config(data, "<bench transfer>"))


def _train(ctx: PhaseContext, catalogue: Path, root: Path) -> tuple[Path, dict[str, Any]]:
    """The product's explore + train steps on ``catalogue``; the best checkpoint and the train summary."""
    run_explore(ctx, catalogue, root / "trajectories")
    summary = run_train(ctx, catalogue, root / "trajectories", root / "checkpoints", resume=False)
    return Path(resolve_checkpoint(ctx, root / "checkpoints")), summary


def _policy(process: ProcessSpec, cfg: AgentFlowConfig, checkpoint: Path) -> ActorCritic:
    vocabulary = process.vocabulary
    policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, cfg.train.hidden_sizes)
    policy.load_state_dict(load_checkpoint(checkpoint, cfg.train.hidden_sizes, vocabulary=vocabulary).model)
    return policy


def _evaluate(ctx: PhaseContext, catalogue: Path, process: ProcessSpec, policy: ActorCritic | None) -> EvalResult:
    """``policy`` greedily (None: the process's rules) on the catalogue's test split, stratified over the dimensions."""
    cfg = ctx.cfg
    dimensions = sorted(cfg.variants.dimensions)
    test = stratified_eval_variants(read_splits(catalogue)["test"], TEST_EPISODES, dimensions, cfg.base.seed)
    pool = build_pool(ctx, test, min(16, len(test)), seed=cfg.base.seed + 2, scheduler="round_robin", standby=False)
    act: PolicyFn = expert_policy(pool, process.expert) if policy is None else greedy_policy(policy)
    try:
        return evaluate_policy(pool, act, TEST_EPISODES, seed=cfg.base.seed + 11, dimensions=dimensions)
    finally:
        pool.close()


def _consistency(ctx: PhaseContext, process: ProcessSpec, policy: ActorCritic) -> dict[str, float]:
    cfg = ctx.cfg
    return cross_channel_consistency(
        process, ctx.registry, dict(cfg.variants.dimensions), greedy_policy(policy), cfg.base.seed
    )


def run_transfer_bench(
    cfg: AgentFlowConfig, steps: int | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Leave one channel out, for each channel of the process; see the module docstring."""
    say = progress or (lambda _msg: None)
    started = time.perf_counter()
    ctx = PhaseContext.of(cfg)
    process = ctx.process
    channels = list(cfg.variants.base_envs)
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-transfer-") as tmp:
        root = Path(tmp)
        run_ctx = _with(ctx, root, {"train.total_steps": steps or DEFAULT_STEPS})
        run_cfg = run_ctx.cfg
        catalogue = root / "variants"
        run_variants(run_ctx, catalogue)
        say(f"all channels {channels}: explore, train")
        all_checkpoint, all_summary = _train(run_ctx, catalogue, root / "all")
        all_policy = _policy(process, run_cfg, all_checkpoint)
        held: dict[str, dict[str, Any]] = {}
        for channel in channels:
            others = [c for c in channels if c != channel]
            say(f"held out {channel}: explore, train on {others}")
            checkpoint, summary = _train(
                run_ctx,
                channel_catalogue(catalogue, root / f"without-{channel}" / "variants", others),
                root / f"without-{channel}",
            )
            only = channel_catalogue(catalogue, root / f"only-{channel}" / "variants", [channel])
            say(f"held out {channel}: evaluate on its test variants")
            rules = _evaluate(run_ctx, only, process, None)
            transfer = _evaluate(run_ctx, only, process, _policy(process, run_cfg, checkpoint))
            everywhere = _evaluate(run_ctx, only, process, all_policy)
            rules_rate = float(rules.process_success_rate)
            held[channel] = {
                "rules": rules_rate,
                "held_out_policy": float(transfer.process_success_rate),
                "all_channels_policy": float(everywhere.process_success_rate),
                "held_out_over_rules": float(transfer.process_success_rate) / rules_rate
                if rules_rate
                else float("nan"),
                "train_steps": summary["global_step"],
            }
        say("cross-channel action consistency on paired states")
        consistency = _consistency(run_ctx, process, all_policy)
    result: dict[str, Any] = {
        f"{channel}_held_out_over_rules": entry["held_out_over_rules"] for channel, entry in held.items()
    }
    result.update(
        {
            "min_held_out_over_rules": min(e["held_out_over_rules"] for e in held.values()),
            "cross_channel_consistency_policy": consistency["cross_channel_consistency"],
            "cross_channel_consistency_random": consistency["cross_channel_consistency_random"],
            "paired_states": int(consistency["cross_channel_paired_states"]),
            "held_out": held,
            "all_channels_train_steps": all_summary["global_step"],
            "total_steps_cap": run_cfg.train.total_steps,
            "test_episodes": TEST_EPISODES,
            "process": process.name,
            "channels": channels,
            "wall_s": time.perf_counter() - started,
        }
    )
    targets = {"min_held_out_over_rules": SUCCESS_RATIO_TARGET, "cross_channel_consistency_policy": CONSISTENCY_TARGET}
    result["targets"] = targets
    result["targets_met"] = {k: bool(result[k] >= bound) for k, bound in targets.items()}
    return result


def transfer_notes(result: dict[str, Any]) -> list[str]:
    """The lines BENCHMARKS.md shows under the transfer table: each held-out channel, then the consistency."""
    return [
        f"process {result['process']}, channels {result['channels']}; {result['test_episodes']} test episodes per side",
        *(
            f"held out {c}: rules {e['rules']:.3f}, held-out policy {e['held_out_policy']:.3f}, "
            f"all-channel policy {e['all_channels_policy']:.3f} (process success on its test variants)"
            for c, e in result["held_out"].items()
        ),
        f"cross-channel action consistency on {result['paired_states']} paired states: policy "
        f"{result['cross_channel_consistency_policy']:.3f}, random legal policy {result['cross_channel_consistency_random']:.3f}",
    ]
