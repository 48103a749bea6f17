"""``agentflow bench learning``: AgentFlow's training and two sb3-contrib MaskablePPO peers side by side, one run.

The three learners train on the same catalogue's train split with the same hyper-parameters (``train``
section of params.yaml) and the same training reward (the product's
:class:`~agentflow_core.rl.ppo.TrainingReward`, with the mined shaping terms where
``train.reward.auto_shaping`` is on). They differ in what they start from and how they run:

- ``agentflow`` runs as ``agentflow train`` does after the cycle's earlier phases: the exploration
  phase around the rules, the offline stage (BC, then CQL, gated; ``tasks.steps.offline``) where
  ``offline.enabled``, else BC alone, then :class:`~agentflow_core.rl.ppo.PPO` on worker-side
  rollouts (``tasks.compose.build_rollouts``) with its scheduler, adaptive clip/KL and the decaying KL
  term toward the offline actor;
- ``maskableppo`` and ``maskableppo_bc`` (:mod:`benchmarks.learning_peers`): MaskablePPO from
  scratch, and MaskablePPO after BC on the same rules' logs.

At checkpoints (every ``eval_every_updates`` rollouts, and before the first) every policy is played
greedily on the same validation and test episodes (:mod:`benchmarks.learning_eval`). Training time is
the wall time of everything but those evaluations (the offline gate's validation evaluation
included); the figures are in :mod:`benchmarks.learning_figures`.
"""

from __future__ import annotations

import os
import platform
import tempfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from agentflow_core.evaluation.policy_eval import greedy_policy
from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.cql import load_actor
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.ppo import PPO
from agentflow_core.rl.trajectories import behaviour_cloning_arrays
from agentflow_core.splits import read_splits
from benchmarks.learning_eval import Evaluator, LearnerRun, TrainingClock
from benchmarks.learning_figures import HEADLINE, NESTED, PEERS, TARGETS, headline, learner_figures, notes, targets
from benchmarks.learning_peers import Demonstrations, train_maskableppo
from tasks.compose import PoolFactory, build_pool, build_rollouts, reward_function
from tasks.context import PhaseContext
from tasks.steps.auto_shaping import auto_shaped
from tasks.steps.explore import run_explore
from tasks.steps.offline import OfflineStart, offline_start, run_offline
from tasks.steps.train import reward_transform
from tasks.steps.variants import run_variants

__all__ = ["TARGETS", "run_learning_bench", "train_agentflow"]

DEFAULT_EVAL_EVERY_UPDATES = 4


def _warm_start(
    ctx: PhaseContext,
    catalogue: Path,
    work: Path,
    policy: ActorCritic,
    run: LearnerRun,
    clock: TrainingClock,
    pool_factory: PoolFactory,
) -> OfflineStart | None:
    """What ``agentflow train`` starts PPO from: the offline stage's actor where it passed its gate, else BC.

    Returns the offline start (its KL prior goes on PPO's loss) or None.
    """
    cfg, seed, vocabulary = ctx.cfg, ctx.cfg.base.seed, ctx.vocabulary
    trajectories = work / "trajectories"
    offline = None
    if cfg.offline.enabled and cfg.train.bc_warm_start:  # otherwise its actors are references PPO never sees
        started = clock.elapsed
        summary = run_offline(ctx, catalogue, trajectories, work / "offline", pool_factory=pool_factory)
        clock.exclude(summary["time_s"]["validation_eval"])  # the gate's evaluation, as every evaluation here
        offline = offline_start(ctx, work / "offline", None)
        run.setup_s["offline_s"] = clock.elapsed - started
        run.stages["offline"] = {
            "passed": summary["passed"],
            "bc_samples": summary["bc_samples"],
            "offline_vs_bc_validation": summary["offline_vs_bc_validation"],
        }
    if offline is not None:
        load_actor(policy, offline.actor)
    elif cfg.train.bc_warm_start:
        started = clock.elapsed
        accepted = {v.content_hash: vocabulary.accepted_outcomes(v.params) for v in read_splits(catalogue)["train"]}
        result = behaviour_cloning(policy, *behaviour_cloning_arrays(trajectories, accepted, vocabulary), seed=seed)
        run.setup_s["bc_s"] = clock.elapsed - started
        run.stages["bc"] = {"samples": result.samples, "accuracy": result.accuracy}
    return offline


def train_agentflow(
    ctx: PhaseContext,
    catalogue: Path,
    work: Path,
    evaluator: Evaluator,
    eval_every: int,
    pool_factory: PoolFactory = build_pool,
) -> LearnerRun:
    """AgentFlow on the product's path: exploration, BC -> CQL (or BC), then PPO on worker-side rollouts; with
    ``train.bc_warm_start: false`` PPO from a fresh network (the exploration off its clock)."""
    cfg = ctx.cfg
    tc, seed = cfg.train, cfg.base.seed
    run = LearnerRun("agentflow")
    clock = TrainingClock()
    train_variants = read_splits(catalogue)["train"]
    # the cycle's exploration phase (the rules' logs): its time and env steps count towards AgentFlow's where
    # PPO learns from them (the warm start, mined shaping); the BC peer learns from the same logs either way
    trajectories = work / "trajectories"
    explore_steps = int(run_explore(ctx, catalogue, trajectories, pool_factory=pool_factory)["explore_steps"])
    explore_s = clock.elapsed
    run.stages["exploration"] = {"s": explore_s, "env_steps": explore_steps}
    if tc.bc_warm_start or cfg.train.reward.auto_shaping:
        run.setup_s["explore_s"], run.explore_steps = explore_s, explore_steps
    else:
        clock.exclude(explore_s)
    ctx, _ = auto_shaped(ctx, catalogue, trajectories)
    torch.manual_seed(seed)
    vocabulary = ctx.vocabulary
    policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, tc.hidden_sizes)
    offline = _warm_start(ctx, catalogue, work, policy, run, clock, pool_factory)
    started = clock.elapsed
    # the product's rollout source (worker-side rollouts), unless a test hands in its own pools
    pool = (
        build_rollouts(ctx, train_variants, tc.num_envs, seed=seed)
        if pool_factory is build_pool
        else pool_factory(ctx, train_variants, tc.num_envs, seed=seed)
    )
    try:
        with reward_function(ctx, pool.num_envs) as reward_fn:
            ppo = PPO(policy, pool, tc, seed=seed, reward_transform=reward_transform(ctx.cfg, pool, reward_fn))
            if offline is not None:
                ppo.policy_penalty = offline.prior
            run.setup_s["pool_s"] = clock.elapsed - started
            evaluator.checkpoint(run, greedy_policy(ppo.policy), run.explore_steps, clock)
            while ppo.update < tc.num_updates:
                ppo.train_iteration()
                if ppo.update % eval_every == 0 or ppo.update == tc.num_updates:
                    evaluator.checkpoint(run, greedy_policy(ppo.policy), run.explore_steps + ppo.global_step, clock)
    finally:
        pool.close()
    run.train_s, run.env_steps = clock.elapsed, run.explore_steps + ppo.global_step
    return run


def machine_info() -> dict[str, Any]:
    """Where the figures were measured: CPUs, load, library versions."""
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "load_avg_1_5_15": list(os.getloadavg()),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "stable_baselines3": version("stable_baselines3"),
        "sb3_contrib": version("sb3_contrib"),
    }


def run_learning_bench(
    ctx: PhaseContext,
    work: Path | None = None,
    eval_every: int = DEFAULT_EVAL_EVERY_UPDATES,
    test_episodes: int | None = None,
    pool_factory: PoolFactory = build_pool,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Generate the catalogue, train the three learners one after the other, evaluate them the same way.

    ``test_episodes`` defaults to the size of ``agentflow train``'s final test evaluation.
    """
    cfg = ctx.cfg
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-learning-") as tmp:
        work = Path(tmp) if work is None else work
        catalogue = work / "variants"
        run_variants(ctx, catalogue)
        load_before = list(os.getloadavg())
        evaluator = Evaluator(ctx, read_splits(catalogue), pool_factory, test_episodes, progress)
        try:
            agentflow = train_agentflow(ctx, catalogue, work, evaluator, eval_every, pool_factory)
            trajectories = work / "trajectories"
            shaped, _ = auto_shaped(ctx, catalogue, trajectories)  # the same training reward as AgentFlow's
            exploration = agentflow.stages["exploration"]
            logs = Demonstrations(trajectories, exploration["s"], exploration["env_steps"])
            scratch, sb3_config = train_maskableppo(shaped, catalogue, evaluator, eval_every)
            warm, warm_config = train_maskableppo(shaped, catalogue, evaluator, eval_every, logs)
        finally:
            evaluator.close()
    runs = {"agentflow": agentflow, "maskableppo": scratch, "maskableppo_bc": warm}
    figures = {name: learner_figures(run, evaluator) for name, run in runs.items()}
    ours, priced = figures["agentflow"], evaluator.priced
    result: dict[str, Any] = {
        **{k: ours[k] for k in HEADLINE if k in ours},
        **headline(ours, {name: figures[name] for name in PEERS}, priced),
        "test_process_success_rules": evaluator.rules.process_success_rate,
        "test_success_by_family_rules": evaluator.rules.process_success_by_family,
        **{
            f"test_business_value_{name}": ref.value.overall
            for name, ref in (("rules", evaluator.rules), ("oracle", evaluator.oracle))
            if ref is not None and ref.value is not None
        },
        "priced": priced,
        **{f"agentflow_{k}": v for k, v in ours.items() if k not in HEADLINE and k not in NESTED},
        **{f"{name}_{k}": v for name in PEERS for k, v in figures[name].items() if k not in NESTED},
        **{name: {k: figures[name][k] for k in NESTED} for name in runs},
        "test_variant_hashes": {name: run.test_variant_hashes for name, run in runs.items()},
        "config": {
            "train": cfg.train.model_dump(mode="json"),
            "offline": cfg.offline.model_dump(mode="json"),
            "pool": cfg.pool.model_dump(mode="json"),
            "variants": cfg.variants.model_dump(mode="json"),
            "explore_total_steps": cfg.explore.total_steps,
            "eval_every_updates": eval_every,
            "test_episodes": evaluator.test_episodes,
            "test_episodes_played": evaluator.rules.episodes,  # stratification covers every stratum: may be more
            "validation_episodes": evaluator.validation_episodes,
            "maskableppo": sb3_config,
            "maskableppo_bc": warm_config,
        },
        "machine": machine_info() | {"load_avg_before": load_before},
    }
    result["notes"] = notes(result, priced)
    result["targets"], result["targets_met"] = targets(result, priced)
    return result
