"""``agentflow bench learning``: AgentFlow's training and sb3-contrib MaskablePPO side by side, one run.

Both learners train on the same catalogue's train split with the same hyper-parameters (``train``
section of params.yaml: envs, rollout length, minibatch, epochs, learning rate, clip range, GAE,
loss coefficients, gradient clip, target KL, 64x64 tanh actor and critic) and the same training
reward (the product's :class:`~agentflow_core.rl.ppo.TrainingReward`: token table + env business
reward + shaping - risk penalty, scaled per base env). They differ where the products differ:

- AgentFlow runs as ``agentflow train`` does: the exploration phase's dataset (when BC needs it),
  the behaviour-cloning warm start, then :class:`~agentflow_core.rl.ppo.PPO` on the configured pool
  (``tasks.compose.build_pool``) with its scheduler and adaptive clip/KL;
- MaskablePPO sees the envs through Gymnasium as an SB3 user would wire them: a ``DummyVecEnv`` of
  ``train.num_envs`` envs, each reset onto a uniformly drawn train variant, masks from
  ``action_masks()``; SB3's ``target_kl`` stops an update's epochs early instead.

At checkpoints (every ``eval_every_updates`` rollouts, and before the first) both policies are
played greedily by :func:`~agentflow_core.evaluation.policy_eval.evaluate_policy` on the same stratified
validation and test pools, the ones ``agentflow train`` builds. Training time is the wall time of
everything but those evaluations: for AgentFlow the exploration phase, BC, pool start-up and PPO;
for MaskablePPO the vector env, the model and ``learn``. The reported policy of each learner is its
best validation checkpoint, as ``agentflow train`` ships; "reaching the expert" is the first
checkpoint whose test process success is at least the scripted expert's on the same test pool.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import torch

from agentflow_core.contracts import OraclePool, PolicyFn
from agentflow_core.evaluation.policy_eval import (
    EvalResult,
    evaluate_policy,
    expert_policy,
    greedy_policy,
    oracle_policy,
    stratified_eval_variants,
)
from agentflow_core.evaluation.value import value_metrics
from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.normalize import PerEnvRewardNormalizer
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.ppo import PPO, TrainingReward
from agentflow_core.rl.trajectories import behaviour_cloning_arrays
from agentflow_core.splits import read_splits
from agentflow_core.variants import VariantSpec
from benchmarks.sb3_envs import TrainVariantEnv, maskable_greedy, product_reward_vec_env
from tasks.compose import PoolFactory, build_pool, build_rollouts, env_factory, reward_function
from tasks.context import PhaseContext
from tasks.steps.evaluation import EVAL_NUM_ENVS, FINAL_EVAL_EPISODES
from tasks.steps.explore import run_explore
from tasks.steps.train import reward_transform
from tasks.steps.train_references import oracle_available
from tasks.steps.variants import run_variants

# (bound, higher is better): the learning benchmark's targets (docs/learning.md "Side by side with MaskablePPO").
TARGETS: dict[str, tuple[float, bool]] = {
    "test_process_success": (0.98, True),
    "min_family_process_success_vs_rules": (1.0, True),
    "time_to_rules_vs_maskableppo": (0.5, False),
}
DEFAULT_EVAL_EVERY_UPDATES = 4
# AgentFlow's figures under their own names; every other figure is prefixed by its learner.
HEADLINE = (
    "test_process_success",
    "test_goal_success",
    "test_process_success_vs_rules",
    "test_success_by_family",
    "min_family_process_success_vs_rules",
)
NESTED = ("setup_s", "test", "curve")


class TrainingClock:
    """Wall time of training alone: evaluations run inside :meth:`paused` and are not counted."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._paused_s = 0.0

    @property
    def elapsed(self) -> float:
        """Seconds since the clock started, less the paused ones."""
        return time.perf_counter() - self._started - self._paused_s

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop counting for the duration of the block."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self._paused_s += time.perf_counter() - start


@dataclass(frozen=True)
class Checkpoint:
    """One greedy evaluation of a learner along training."""

    env_steps: int
    train_s: float
    validation_process_success: float
    test_process_success: float
    test_goal_success: float
    test_process_success_by_family: dict[str, float]


@dataclass
class LearnerRun:
    """A learner's curve and what it needed before its first PPO update."""

    name: str
    checkpoints: list[Checkpoint] = field(default_factory=list)
    test_results: list[EvalResult] = field(default_factory=list)
    setup_s: dict[str, float] = field(default_factory=dict)
    train_s: float = 0.0
    env_steps: int = 0  # every env step the learner took, exploration included
    explore_steps: int = 0
    test_variant_hashes: list[str] = field(default_factory=list)


class Evaluator:
    """The validation and test pools of ``agentflow train`` and the one evaluation both learners go through."""

    def __init__(
        self,
        ctx: PhaseContext,
        splits: dict[str, list[VariantSpec]],
        pool_factory: PoolFactory,
        test_episodes: int | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        cfg = ctx.cfg
        tc, seed = cfg.train, cfg.base.seed
        self.dimensions = sorted(cfg.variants.dimensions)
        self.validation_episodes = tc.eval_episodes
        self.test_episodes = test_episodes or max(tc.eval_episodes, FINAL_EVAL_EPISODES)
        validation = stratified_eval_variants(splits["validation"], self.validation_episodes, self.dimensions, seed)
        test = stratified_eval_variants(splits["test"], self.test_episodes, self.dimensions, seed)
        slots = min(tc.num_envs, EVAL_NUM_ENVS)
        self.seed, self.progress = seed, progress
        self.validation_pool = pool_factory(
            ctx, validation, slots, seed=seed + 1, scheduler="round_robin", standby=False
        )
        self.test_pool = pool_factory(ctx, test, slots, seed=seed + 2, scheduler="round_robin", standby=False)

    def test(self, act: PolicyFn) -> EvalResult:
        """The test split's evaluation (seed as in ``agentflow train``'s final one)."""
        return evaluate_policy(self.test_pool, act, self.test_episodes, seed=self.seed + 11, dimensions=self.dimensions)

    def checkpoint(self, run: LearnerRun, act: PolicyFn, env_steps: int, clock: TrainingClock) -> None:
        """Evaluate ``act`` on validation and test, off the training clock, and append it to ``run``."""
        with clock.paused():
            validation = evaluate_policy(
                self.validation_pool, act, self.validation_episodes, seed=self.seed + 7, dimensions=self.dimensions
            )
            test = self.test(act)
        run.test_results.append(test)
        run.test_variant_hashes = [v.content_hash for v in self.test_pool.variants]
        run.checkpoints.append(
            Checkpoint(
                env_steps=env_steps,
                train_s=clock.elapsed,
                validation_process_success=validation.process_success_rate,
                test_process_success=test.process_success_rate,
                test_goal_success=test.success_rate,
                test_process_success_by_family=test.process_success_by_family,
            )
        )
        if self.progress is not None:
            c = run.checkpoints[-1]
            self.progress(
                f"{run.name}: {c.env_steps} steps, {c.train_s:.0f} s training, validation/test process success "
                f"{c.validation_process_success:.3f}/{c.test_process_success:.3f}"
            )

    def close(self) -> None:
        """Close both pools."""
        self.validation_pool.close()
        self.test_pool.close()


def train_agentflow(
    ctx: PhaseContext,
    catalogue: Path,
    work: Path,
    evaluator: Evaluator,
    eval_every: int,
    pool_factory: PoolFactory = build_pool,
) -> LearnerRun:
    """AgentFlow as ``agentflow train`` trains it: exploration data for BC, BC warm start, then PPO on worker-side rollouts."""
    cfg = ctx.cfg
    tc, seed = cfg.train, cfg.base.seed
    run = LearnerRun("agentflow")
    clock = TrainingClock()
    train_variants = read_splits(catalogue)["train"]
    torch.manual_seed(seed)
    vocabulary = ctx.process.vocabulary
    policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, tc.hidden_sizes)
    explore_steps = 0  # the exploration phase's env steps count towards AgentFlow's steps to the expert
    if tc.bc_warm_start:
        trajectories = work / "trajectories"
        started = clock.elapsed
        explore_steps = int(run_explore(ctx, catalogue, trajectories, pool_factory=pool_factory)["explore_steps"])
        run.setup_s["explore_s"] = clock.elapsed - started
        started = clock.elapsed
        accepted = {v.content_hash: vocabulary.accepted_outcomes(v.params) for v in train_variants}
        behaviour_cloning(policy, *behaviour_cloning_arrays(trajectories, accepted, vocabulary), seed=seed)
        run.setup_s["bc_s"] = clock.elapsed - started
    started = clock.elapsed
    # the product's rollout source (worker-side rollouts), unless a test hands in its own pools
    pool = (
        build_rollouts(ctx, train_variants, tc.num_envs, seed=seed)
        if pool_factory is build_pool
        else pool_factory(ctx, train_variants, tc.num_envs, seed=seed)
    )
    try:
        with reward_function(ctx, pool.num_envs) as reward_fn:
            ppo = PPO(policy, pool, tc, seed=seed, reward_transform=reward_transform(cfg, pool, reward_fn))
            run.setup_s["pool_s"] = clock.elapsed - started
            evaluator.checkpoint(run, greedy_policy(ppo.policy), explore_steps, clock)
            while ppo.update < tc.num_updates:
                ppo.train_iteration()
                if ppo.update % eval_every == 0 or ppo.update == tc.num_updates:
                    evaluator.checkpoint(run, greedy_policy(ppo.policy), explore_steps + ppo.global_step, clock)
    finally:
        pool.close()
    run.train_s, run.env_steps, run.explore_steps = clock.elapsed, explore_steps + ppo.global_step, explore_steps
    return run


def train_maskableppo(
    ctx: PhaseContext, catalogue: Path, evaluator: Evaluator, eval_every: int
) -> tuple[LearnerRun, dict[str, Any]]:
    """sb3-contrib MaskablePPO with the train section's hyper-parameters and the product's reward."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    cfg = ctx.cfg
    tc, seed = cfg.train, cfg.base.seed
    run = LearnerRun("maskableppo")
    clock = TrainingClock()
    train_variants = read_splits(catalogue)["train"]
    factory = env_factory(ctx, train_variants)
    venv = DummyVecEnv([lambda: TrainVariantEnv(train_variants, factory) for _ in range(tc.num_envs)])
    venv.seed(seed)
    kwargs: dict[str, Any] = {
        "n_steps": tc.n_steps,
        "batch_size": tc.minibatch_size,
        "n_epochs": tc.n_epochs,
        "learning_rate": tc.learning_rate,
        "gamma": tc.gamma,
        "gae_lambda": tc.gae_lambda,
        "clip_range": tc.clip_range,
        "ent_coef": tc.ent_coef,
        "vf_coef": tc.vf_coef,
        "max_grad_norm": tc.max_grad_norm,
        "target_kl": tc.target_kl,
        "policy_kwargs": {
            "net_arch": {"pi": list(tc.hidden_sizes), "vf": list(tc.hidden_sizes)},
            "activation_fn": torch.nn.Tanh,
        },
    }
    with reward_function(ctx, tc.num_envs) as reward_fn:
        normalizer = PerEnvRewardNormalizer() if tc.reward.normalize else None
        reward = TrainingReward(reward_fn, normalizer, key_of=lambda info: str(info["base_env_id"]))
        model = MaskablePPO("MlpPolicy", product_reward_vec_env(venv, reward), seed=seed, device="cpu", **kwargs)
        run.setup_s["model_s"] = clock.elapsed

        class Checkpoints(BaseCallback):  # type: ignore[misc]
            """Evaluates at the start of every ``eval_every``-th rollout: after the previous update."""

            rollouts = 0

            def _on_rollout_start(self) -> None:
                if self.rollouts % eval_every == 0:
                    evaluator.checkpoint(run, maskable_greedy(model), int(self.num_timesteps), clock)
                self.rollouts += 1

            def _on_step(self) -> bool:
                return True

        callback = Checkpoints()
        model.learn(total_timesteps=tc.num_updates * tc.num_envs * tc.n_steps, callback=callback)
        if run.checkpoints[-1].env_steps != model.num_timesteps:
            evaluator.checkpoint(run, maskable_greedy(model), int(model.num_timesteps), clock)
    venv.close()
    run.train_s, run.env_steps = clock.elapsed, int(model.num_timesteps)
    return run, {k: v for k, v in kwargs.items() if k != "policy_kwargs"} | {"net": "pi/vf 64x64 tanh"}


def _reach(run: LearnerRun, expert: float) -> Checkpoint | None:
    """The first checkpoint whose test process success is at least the expert's."""
    return next((c for c in run.checkpoints if c.test_process_success >= expert), None)


def _selected(run: LearnerRun) -> int:
    """The best validation checkpoint (the earliest on ties), as ``agentflow train`` ships it."""
    scores = [c.validation_process_success for c in run.checkpoints]
    return scores.index(max(scores))


def _value_figures(test: EvalResult, rules: EvalResult, oracle: EvalResult | None) -> dict[str, Any]:
    """The learner's business value and regret closed on the test split, where the process prices episodes."""
    values = {"trained": test.value, "rules": rules.value, "oracle": None if oracle is None else oracle.value}
    figures = value_metrics(values, test.mean_length)
    return {k: v for k, v in figures.items() if "/" not in k and not k.endswith(("_rules", "_oracle"))}


def _learner_figures(run: LearnerRun, expert: EvalResult, oracle: EvalResult | None = None) -> dict[str, Any]:
    best = _selected(run)
    test = run.test_results[best]
    by_family = test.process_success_by_family
    expert_by_family = expert.process_success_by_family
    reached = _reach(run, expert.process_success_rate)
    return {
        "test_process_success": test.process_success_rate,
        "test_goal_success": test.success_rate,
        "test_process_success_vs_rules": _ratio(test.process_success_rate, expert.process_success_rate),
        "test_success_by_family": by_family,
        "min_family_process_success_vs_rules": min(_ratio(by_family[f], expert_by_family[f]) for f in expert_by_family),
        "selected_checkpoint_env_steps": run.checkpoints[best].env_steps,
        "final_test_process_success": run.checkpoints[-1].test_process_success,
        "reached_rules": reached is not None,
        "time_to_rules_s": None if reached is None else reached.train_s,
        "steps_to_rules": None if reached is None else reached.env_steps,
        "train_s": run.train_s,
        "env_steps": run.env_steps,
        "explore_steps": run.explore_steps,
        "setup_s": run.setup_s,
        "test": test.to_dict(),
        "curve": [asdict(c) for c in run.checkpoints],
        **_value_figures(test, expert, oracle),
    }


def _vs(ours: dict[str, Any], peer: dict[str, Any], what: str, budget: str) -> float | None:
    """Our figure to reach the expert over the peer's; against the peer's whole budget if it never reached it."""
    if ours[what] is None:
        return None  # we did not reach it: no figure to report
    theirs = float(peer[what] if peer["reached_rules"] else peer[budget])
    return float(ours[what]) / theirs if theirs > 0 else None  # the peer there at once: no ratio


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
    """Generate the catalogue, train both learners one after the other, evaluate both the same way.

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
            expert = evaluator.test(expert_policy(evaluator.test_pool, ctx.process.expert))
            pool = evaluator.test_pool
            oracle = (
                evaluator.test(oracle_policy(pool)) if oracle_available(ctx) and isinstance(pool, OraclePool) else None
            )
            agentflow = train_agentflow(ctx, catalogue, work, evaluator, eval_every, pool_factory)
            maskable, sb3_config = train_maskableppo(ctx, catalogue, evaluator, eval_every)
        finally:
            evaluator.close()
    ours, peer = _learner_figures(agentflow, expert, oracle), _learner_figures(maskable, expert, oracle)
    result: dict[str, Any] = {
        **{k: ours[k] for k in HEADLINE},
        "time_to_rules_vs_maskableppo": _vs(ours, peer, "time_to_rules_s", "train_s"),
        "steps_to_rules_vs_maskableppo": _vs(ours, peer, "steps_to_rules", "env_steps"),
        "test_process_success_rules": expert.process_success_rate,
        "test_success_by_family_rules": expert.process_success_by_family,
        **{
            f"test_business_value_{name}": result.value.overall
            for name, result in (("rules", expert), ("oracle", oracle))
            if result is not None and result.value is not None
        },
        **{f"agentflow_{k}": v for k, v in ours.items() if k not in HEADLINE and k not in NESTED},
        **{f"maskableppo_{k}": v for k, v in peer.items() if k not in NESTED},
        "agentflow": {k: ours[k] for k in NESTED},
        "maskableppo": {k: peer[k] for k in NESTED},
        "test_variant_hashes": {
            "agentflow": agentflow.test_variant_hashes,
            "maskableppo": maskable.test_variant_hashes,
        },
        "config": {
            "train": cfg.train.model_dump(mode="json"),
            "pool": cfg.pool.model_dump(mode="json"),
            "variants": cfg.variants.model_dump(mode="json"),
            "explore_total_steps": cfg.explore.total_steps,
            "eval_every_updates": eval_every,
            "test_episodes": evaluator.test_episodes,
            "validation_episodes": evaluator.validation_episodes,
            "maskableppo": sb3_config,
        },
        "machine": machine_info() | {"load_avg_before": load_before},
    }
    result["notes"] = _notes(result)
    result["targets"] = {key: bound for key, (bound, _) in TARGETS.items()}
    result["targets_met"] = {key: _met(result[key], *TARGETS[key]) for key in TARGETS}
    return result


def _notes(result: dict[str, Any]) -> list[str]:
    """What the figures mean, and which of them are bounds rather than measurements."""
    cfg, machine = result["config"], result["machine"]
    notes = [
        f"Both learners: {cfg['train']['total_steps']} env steps requested on the train split "
        f"(same hyper-parameters and training reward); greedy evaluations every {cfg['eval_every_updates']} rollouts "
        f"on the same {cfg['validation_episodes']} validation and {cfg['test_episodes']} test episodes (stratified "
        "over family and every dimension value); the reported policy is each learner's best validation checkpoint.",
        "Process success: the goal, or the handled outcome accepted for the variant (escalation for a blocked user).",
        "time_to_rules_*: training wall time (evaluations excluded) to the first checkpoint at or above the "
        "scripted expert's test process success; AgentFlow's includes exploration, BC and pool start-up, "
        "MaskablePPO's its vector env and model. steps_to_rules_*: env steps to that checkpoint, AgentFlow's "
        "exploration steps included (its first checkpoint, after BC, is at agentflow_explore_steps).",
        f"Load average (1/5/15 min) before: {_loads(machine['load_avg_before'])}, after: "
        f"{_loads(machine['load_avg_1_5_15'])} on {machine['cpus']} CPUs.",
    ]
    if result["agentflow_reached_rules"] and not result["maskableppo_reached_rules"]:
        notes.append(
            "MaskablePPO never reached the rules within its budget: the *_to_rules_vs_maskableppo ratios divide "
            "by its whole training time / steps, so they are upper bounds."
        )
    if not result["agentflow_reached_rules"]:
        notes.append("AgentFlow never reached the rules within its budget: no *_to_rules_vs_maskableppo figure.")
    return notes


def _loads(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _met(value: float | None, bound: float, higher: bool) -> bool:
    if value is None:
        return False
    return value >= bound if higher else value <= bound


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")
