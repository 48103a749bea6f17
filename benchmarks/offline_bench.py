"""``agentflow bench offline``: PPO from BC vs PPO from BC + CQL (the offline stage), same data, same test split.

Per setting, one exploration dataset is collected (``explore`` section, with ``total_steps`` set by the
setting), then two learners train on the catalogue's train split with the shipped PPO settings and
training reward, as ``agentflow train`` does:

- ``bc``: behaviour cloning on the successful episodes, then PPO;
- ``bc_cql``: the offline stage (:func:`tasks.steps.offline.offline_actor`: the same BC actor, then
  discrete CQL with prioritized replay and the actor moved toward pi_BC · exp(Q/temperature)), then PPO with the
  decaying ``KL(pi || pi_offline)`` term.

Both start from the same network initialisation. Each is played greedily on the same stratified test
episodes before its first PPO update (the *starting* test process success) and every
``eval_every`` updates after; "steps to expert" counts PPO env steps to the first checkpoint at or
above the scripted expert's test process success (the exploration steps are the same for both and
not counted). A learner stops at the expert or at its step budget.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentflow_core.contracts import PolicyFn
from agentflow_core.evaluation.policy_eval import expert_policy, greedy_policy
from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.cql import OfflinePrior, QNetwork, load_actor, masked_q
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.ppo import PPO
from agentflow_core.rl.trajectories import behaviour_cloning_arrays
from agentflow_core.splits import read_splits
from benchmarks.learning_bench import machine_info
from benchmarks.learning_eval import Evaluator, LearnerRun, TrainingClock
from tasks.compose import build_pool, build_rollouts, reward_function
from tasks.context import PhaseContext
from tasks.steps.explore import run_explore
from tasks.steps.offline import offline_actor
from tasks.steps.train import reward_transform
from tasks.steps.variants import run_variants

# The harder setting: exploration around the untrained network instead of the scripted expert, so the
# dataset holds few successful episodes for BC (with 1,500 expert-exploration steps BC still started at 1.00).
HARDER_BEHAVIOUR = "policy"


def q_greedy_policy(q: QNetwork) -> PolicyFn:
    """The argmax legal action of the conservative Q (no actor)."""

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            values = q(torch.as_tensor(obs, dtype=torch.float32))
            return masked_q(values, torch.as_tensor(mask, dtype=torch.bool)).argmax(-1).numpy()

    return act


def _fresh_policy(ctx: PhaseContext, seed: int) -> ActorCritic:
    torch.manual_seed(seed)
    vocabulary = ctx.process.vocabulary
    return ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, ctx.cfg.train.hidden_sizes)


def _ppo_to_expert(
    ctx: PhaseContext,
    run: LearnerRun,
    policy: ActorCritic,
    catalogue: Path,
    evaluator: Evaluator,
    expert: float,
    eval_every: int,
    prior: OfflinePrior | None,
) -> None:
    """PPO from ``policy`` until a test checkpoint reaches ``expert`` or the step budget ends."""
    cfg = ctx.cfg
    tc, seed = cfg.train, cfg.base.seed
    clock = TrainingClock()
    pool = build_rollouts(ctx, read_splits(catalogue)["train"], tc.num_envs, seed=seed)
    try:
        with reward_function(ctx, pool.num_envs) as reward_fn:
            ppo = PPO(policy, pool, tc, seed=seed, reward_transform=reward_transform(cfg, pool, reward_fn))
            ppo.policy_penalty = prior
            evaluator.checkpoint(run, greedy_policy(ppo.policy), 0, clock)
            while ppo.update < tc.num_updates and run.checkpoints[-1].test_process_success < expert:
                ppo.train_iteration()
                if ppo.update % eval_every == 0 or ppo.update == tc.num_updates:
                    evaluator.checkpoint(run, greedy_policy(ppo.policy), ppo.global_step, clock)
    finally:
        pool.close()
    run.train_s, run.env_steps = clock.elapsed, ppo.global_step


def _figures(run: LearnerRun, expert: float) -> dict[str, Any]:
    reached = next((c for c in run.checkpoints if c.test_process_success >= expert), None)
    return {
        "start_test_process_success": run.checkpoints[0].test_process_success,
        "start_test_success_by_family": run.checkpoints[0].test_process_success_by_family,
        "final_test_process_success": run.checkpoints[-1].test_process_success,
        "reached_rules": reached is not None,
        "steps_to_rules": None if reached is None else reached.env_steps,
        "ppo_steps": run.env_steps,
        "ppo_s": run.train_s,
        "setup_s": run.setup_s,
        "curve": [asdict(c) for c in run.checkpoints],
    }


def run_setting(
    ctx: PhaseContext,
    work: Path,
    behaviour: str,
    explore_steps: int,
    eval_every: int,
    test_episodes: int | None,
    progress: Callable[[str], None] | None,
) -> dict[str, Any]:
    """One dataset (``explore_steps`` exploration steps), both learners, both evaluated the same way."""
    cfg = ctx.cfg
    cfg = cfg.model_copy(
        update={
            "explore": cfg.explore.model_copy(
                update={
                    "behaviour": behaviour,
                    "total_steps": explore_steps,
                    "remediation": cfg.explore.remediation.model_copy(update={"max_steps": 0}),
                }
            )
        }
    )
    ctx = ctx.with_config(cfg)
    seed = cfg.base.seed
    catalogue, trajectories = work / "variants", work / f"trajectories_{behaviour}_{explore_steps}"
    if not catalogue.exists():
        run_variants(ctx, catalogue)
    explored = run_explore(ctx, catalogue, trajectories)
    evaluator = Evaluator(ctx, read_splits(catalogue), build_pool, test_episodes, progress)
    try:
        expert = evaluator.test(expert_policy(evaluator.test_pool)).process_success_rate
        bc = LearnerRun("bc")
        started = time.perf_counter()
        policy = _fresh_policy(ctx, seed)
        vocabulary = ctx.process.vocabulary
        accepted = {v.content_hash: vocabulary.accepted_outcomes(v.params) for v in read_splits(catalogue)["train"]}
        behaviour_cloning(policy, *behaviour_cloning_arrays(trajectories, accepted, vocabulary), seed=seed)
        bc.setup_s["bc_s"] = time.perf_counter() - started
        _ppo_to_expert(ctx, bc, policy, catalogue, evaluator, expert, eval_every, None)
        cql = LearnerRun("bc_cql")
        started = time.perf_counter()
        _, actor, q, offline = offline_actor(ctx, catalogue, trajectories, seed)
        cql.setup_s["bc_cql_s"] = time.perf_counter() - started
        q_greedy = evaluator.test(q_greedy_policy(q)).process_success_rate  # CQL's own greedy policy, for reference
        policy = _fresh_policy(ctx, seed)
        load_actor(policy, actor.state_dict())
        prior = OfflinePrior(actor, cfg.offline.kl_coef, cfg.offline.kl_decay_updates)
        _ppo_to_expert(ctx, cql, policy, catalogue, evaluator, expert, eval_every, prior)
    finally:
        evaluator.close()
    ours, base = _figures(cql, expert), _figures(bc, expert)
    return {
        "behaviour": behaviour,
        "explore_steps": explore_steps,
        "explore_goal_episodes": explored.get("goal_episodes"),
        "bc_samples": offline["bc_samples"],
        "cql_transitions": offline["transitions"],
        "test_process_success_rules": expert,
        "start_gain": ours["start_test_process_success"] - base["start_test_process_success"],
        "q_greedy_test_process_success": q_greedy,
        "bc": base,
        "bc_cql": ours,
        "offline": {k: v for k, v in offline.items() if not k.endswith("_curve")},
    }


def run_offline_bench(
    ctx: PhaseContext,
    work: Path,
    settings: list[tuple[str, int]],
    eval_every: int = 2,
    test_episodes: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every ``(explore.behaviour, explore steps)`` setting (the shipped exploration first, then harder ones)."""
    cfg = ctx.cfg
    load_before = list(os.getloadavg())
    runs = {f"{b}_{n}": run_setting(ctx, work, b, n, eval_every, test_episodes, progress) for b, n in settings}
    result: dict[str, Any] = {"settings": runs}
    for name, s in runs.items():
        for learner in ("bc", "bc_cql"):
            result[f"{name}/{learner}/start_test_process_success"] = s[learner]["start_test_process_success"]
            result[f"{name}/{learner}/steps_to_rules"] = s[learner]["steps_to_rules"]
        result[f"{name}/expert_test_process_success"] = s["test_process_success_rules"]
        result[f"{name}/start_gain"] = s["start_gain"]
        result[f"{name}/q_greedy_test_process_success"] = s["q_greedy_test_process_success"]
    result["config"] = {
        "ppo_total_steps": cfg.train.total_steps,
        "eval_every_updates": eval_every,
        "offline": cfg.offline.model_dump(mode="json"),
    }
    result["machine"] = machine_info() | {"load_avg_before": load_before}
    result["notes"] = notes(result)
    return result


def notes(result: dict[str, Any]) -> list[str]:
    """What the figures mean, and per setting whether BC alone already starts at the expert."""
    eval_every = result["config"]["eval_every_updates"]
    load_before = result["machine"]["load_avg_before"]
    out = [
        "Starting test process success: greedy on the test split before PPO's first update (BC actor vs BC+CQL actor).",
        "steps_to_rules: PPO env steps to the first test checkpoint at or above the scripted expert (checkpoints every "
        f"{eval_every} updates); 0 means the starting actor is already there. None: not reached within the budget.",
        "Settings: BEHAVIOUR_N = N exploration steps (no remediation) epsilon-greedy around BEHAVIOUR: expert is "
        f"the shipped explore section; {HARDER_BEHAVIOUR} (around the untrained network) is the harder setting, "
        "a dataset with few successful episodes for BC.",
        f"Load average before: {' / '.join(f'{v:.2f}' for v in load_before)} on {os.cpu_count()} CPUs (a shared machine "
        "when above the CPU count: times are noisy, steps and success are not).",
    ]
    for name, setting in result["settings"].items():
        bc, cql, expert = setting["bc"], setting["bc_cql"], setting["test_process_success_rules"]
        if bc["start_test_process_success"] >= expert:
            out.append(
                f"{name}: BC alone already starts at the expert ({bc['start_test_process_success']:.3f} vs "
                f"{expert:.3f}): the offline stage has nothing to add there (BC+CQL starts at "
                f"{cql['start_test_process_success']:.3f})."
            )
        else:
            out.append(
                f"{name}: BC starts at {bc['start_test_process_success']:.3f}, BC+CQL at "
                f"{cql['start_test_process_success']:.3f} (expert {expert:.3f}); PPO steps to the expert: BC "
                f"{bc['steps_to_rules']}, BC+CQL {cql['steps_to_rules']} (budget {bc['ppo_steps']} / {cql['ppo_steps']})."
            )
    return out
