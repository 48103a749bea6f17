"""Phase 1 step: coverage-driven exploration of the variant catalogue into trajectory shards.

Only the catalogue's train split is explored (validation and test stay unseen until evaluation).
Called by ``agentflow explore`` (and so by the DVC stage) and by the Prefect task. Outputs
(atomically, as one directory ``out_dir``): ``part-*.parquet`` shards and their ``_meta.json``
card (``agentflow_core.rl.trajectories``), ``coverage.json`` (the token-transition graph and the
coverage numbers). The exit metric ``state_coverage_ratio`` also goes to ``metrics_path``; the
summary carries the Phase 1 gate's verdict (``passed``, ``gate``) over the tokens the catalogue's
families can reach (``tasks.compose.reachable_tokens``), the unseen ones and the declared unreachable
ones with their reasons.

The behaviour policy is ε-greedy around ``explore.behaviour``: the current policy (by default: the
network PPO will start from, initialised from ``base.seed``) or the scripted expert, with
coverage-driven ε-random legal actions. The expert alone first runs
``explore.reference_pool_steps`` pool steps to fill the edge-coverage reference.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentflow_core.atomic import atomic_dir, check_output, write_json
from agentflow_core.evaluation.policy_eval import greedy_policy
from agentflow_core.gates import evaluate_gate, explore_gate
from agentflow_core.rl.checkpoint import load_checkpoint
from agentflow_core.rl.coverage import CoverageTracker
from agentflow_core.rl.exploration import ExploreProgress, explore
from agentflow_core.rl.policy import ActorCritic, policy_hash
from agentflow_core.rl.trajectories import TrajectoryWriter
from agentflow_core.splits import read_splits
from agentflow_core.variants import read_meta
from tasks.budgets import budget_metrics
from tasks.compose import (
    PoolFactory,
    build_pool,
    expert_policy_hash,
    reachable_tokens,
    reward_function,
    unreachable_tokens,
)
from tasks.context import PhaseContext
from tasks.provenance import GIT_COMMIT_TAG, git_tags


def behaviour_policy(
    ctx: PhaseContext, warm_start: Path | None = None
) -> tuple[Callable[[np.ndarray, np.ndarray], np.ndarray], str]:
    """(greedy policy fn, policy hash) that ε-greedy exploration wraps.

    ``warm_start`` (a retrain's champion checkpoint) is the network PPO will start from, so with
    ``explore.behaviour: policy`` exploration is ε-greedy around it.
    """
    cfg = ctx.cfg
    if cfg.explore.behaviour == "expert":
        expert = ctx.process.expert()
        return expert.act_batch, expert_policy_hash(expert)
    torch.manual_seed(cfg.base.seed)  # the same initialisation run_train starts PPO from
    vocab = ctx.vocabulary
    policy = ActorCritic(vocab.obs_dim, vocab.n_actions, cfg.train.hidden_sizes)
    if warm_start is not None:
        policy.load_state_dict(load_checkpoint(warm_start, cfg.train.hidden_sizes, vocabulary=vocab).model)
    return greedy_policy(policy), policy_hash(policy)


def run_explore(
    ctx: PhaseContext,
    catalogue_path: Path,
    out_dir: Path,
    metrics_path: Path | None = None,
    on_progress: Callable[[ExploreProgress], None] | None = None,
    pool_factory: PoolFactory = build_pool,
    class_paths: Collection[str] | None = None,
    *,
    seed: int | None = None,
    priority: Sequence[str] = (),
    warm_start: Path | None = None,
    card: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Explore the catalogue's train split; write shards + card + coverage graph; return the summary.

    A retrain passes its cycle ``seed`` (default ``base.seed``), the champion as ``warm_start`` and
    ``priority``: env ids explored first. With a priority the pool walks the train split round-robin
    in that order (the priority variants, then the rest in catalogue order) instead of using
    ``pool.scheduler``. ``card`` adds entries to the dataset card.
    """
    cfg = ctx.cfg
    check_output(out_dir)
    started = time.perf_counter()
    variants = read_splits(catalogue_path)["train"]
    seed = cfg.base.seed if seed is None else seed
    if priority:
        rank = {env_id: i for i, env_id in enumerate(priority)}
        variants = sorted(variants, key=lambda v: rank.get(v.env_id, len(rank)))
    if class_paths is None:
        registry = ctx.registry
        class_paths = {registry.get(b).class_path for b in {v.base_env_id for v in variants}}
    vocab = ctx.vocabulary
    tracker = CoverageTracker(reachable_tokens(class_paths, vocab.tokens), vocabulary=vocab)
    unreachable = unreachable_tokens(class_paths, vocab.tokens)
    expert = ctx.process.expert()
    behaviour, behaviour_hash = behaviour_policy(ctx, warm_start)
    reward_cfg = cfg.train.reward
    scheduler = "round_robin" if priority else None
    pool = pool_factory(ctx, variants, cfg.explore.num_envs, seed=seed, scheduler=scheduler)
    try:
        with reward_function(ctx, pool.num_envs) as reward_fn, atomic_dir(Path(out_dir)) as tmp:
            writer = TrajectoryWriter(
                tmp,
                cfg.explore.shard_rows,
                card={
                    "phase": "explore",
                    "behaviour": cfg.explore.behaviour,
                    "catalogue": str(catalogue_path),
                    "catalogue_sha256": read_meta(catalogue_path)["catalogue_sha256"],
                    "git_commit": git_tags()[GIT_COMMIT_TAG],
                    "split": "train",
                    "variants": len(variants),
                    "reward_mode": reward_cfg.mode,
                    "vocab_version": vocab.version,
                    **(card or {}),
                },
                vocabulary=vocab,
            )
            result = explore(
                pool,
                behaviour,
                cfg.explore,
                np.random.default_rng(seed),
                writer,
                seed=seed,
                tracker=tracker,
                reward_fn=reward_fn,
                policy_hash=behaviour_hash,
                reference_fn=expert.act_batch,
                reference_pool_steps=cfg.explore.reference_pool_steps,
                on_progress=on_progress,
                restart_schedule=bool(priority),
            )
            card = writer.close()
            write_json(tmp / "coverage.json", result.coverage_graph)
            model_failures = reward_fn.model.failures if reward_fn.model is not None else 0
    finally:
        pool.close()
    summary: dict[str, Any] = {
        **result.metrics(),
        "rows": card["rows"],
        "shards": len(card["shards"]),
        "failure_reasons": result.failure_reasons,
        "reward_model_failures": model_failures,
        "reachable_tokens": int(tracker.reachable.sum()),
        "unseen_tokens": [n["token"] for n in result.coverage_graph["nodes"] if n["reachable"] and not n["visits"]],
        "unreachable_tokens": unreachable,
    }
    gate = explore_gate(cfg)
    verdict = evaluate_gate(gate, summary)
    summary.update(
        passed=verdict.passed,
        gate=verdict.message,
        message=verdict.message
        + (f"; unseen tokens: {', '.join(summary['unseen_tokens'])}" if summary["unseen_tokens"] else ""),
        **budget_metrics(
            "explore", time.perf_counter() - started, cfg.explore.budget_s, result.steps, gate.budget_steps
        ),
    )
    if metrics_path is not None:
        write_json(metrics_path, _metric_subset(summary))
    return summary


def _metric_subset(summary: Mapping[str, Any]) -> dict[str, float]:
    keys = (
        "state_coverage_ratio",
        "token_coverage",
        "edge_coverage",
        "explore_steps",
        "explore_episodes",
        "goal_episodes",
        "mean_epsilon",
        "final_epsilon",
    )
    budget = {k: float(v) for k, v in summary.items() if k.startswith("budget/")}
    return {**{k: float(summary[k]) for k in keys}, "remediation_steps": float(summary["remediation_steps"]), **budget}
