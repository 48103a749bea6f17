"""The shared side of ``agentflow bench learning``: the training clock, the checkpoints and the one evaluation.

Every learner is played greedily by :func:`~agentflow_core.evaluation.policy_eval.evaluate_policy` on
the same stratified validation and test pools, the ones ``agentflow train`` builds; the rules and
(where every channel has one) the oracle are played once on the same test episodes, the ends of the
regret each checkpoint's test business value is measured against.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from agentflow_core.contracts import OraclePool, PolicyFn
from agentflow_core.evaluation.policy_eval import (
    EvalResult,
    evaluate_policy,
    expert_policy,
    oracle_policy,
    stratified_eval_variants,
)
from agentflow_core.evaluation.value import regret_closed
from agentflow_core.variants import VariantSpec
from tasks.compose import PoolFactory
from tasks.context import PhaseContext
from tasks.steps.evaluation import EVAL_NUM_ENVS, FINAL_EVAL_EPISODES
from tasks.steps.train import selection_metric
from tasks.steps.train_references import oracle_available


class TrainingClock:
    """Wall time of training alone: evaluations run inside :meth:`paused` and are not counted.

    ``started_s`` starts the clock that many seconds in: a learner that reuses another's exploration
    data carries the time that exploration took.
    """

    def __init__(self, started_s: float = 0.0) -> None:
        self._started = time.perf_counter() - started_s
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

    def exclude(self, seconds: float) -> None:
        """Take ``seconds`` already spent off the count (an evaluation run inside a product step)."""
        self._paused_s += seconds


@dataclass(frozen=True)
class Checkpoint:
    """One greedy evaluation of a learner along training; the value fields are None where nothing is priced."""

    env_steps: int
    train_s: float
    validation_process_success: float
    validation_business_value: float | None
    test_process_success: float
    test_goal_success: float
    test_business_value: float | None
    test_regret_closed: float | None
    test_process_success_by_family: dict[str, float]
    # what picks the reported checkpoint, as ``agentflow train`` ranks them (tasks.steps.train.selection_metric)
    selection: tuple[float, float]


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
    stages: dict[str, Any] = field(default_factory=dict)  # what each stage before PPO did (BC samples, CQL gate)


class Evaluator:
    """The validation and test pools of ``agentflow train``, the references on the test split, one evaluation."""

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
        self.rules = self.test(expert_policy(self.test_pool, ctx.process.expert))
        pool = self.test_pool
        self.oracle = self.test(oracle_policy(pool)) if isinstance(pool, OraclePool) and oracle_available(ctx) else None

    @property
    def priced(self) -> bool:
        """Whether the regret is defined here: the rules and the oracle both priced, the oracle the better."""
        return self.regret_closed(self.rules) is not None

    def regret_closed(self, result: EvalResult) -> float | None:
        """The share of the rules-to-oracle gap ``result`` closes on the test episodes; None where undefined."""
        if result.value is None or self.rules.value is None or self.oracle is None or self.oracle.value is None:
            return None
        return regret_closed(result.value.overall, self.rules.value.overall, self.oracle.value.overall)

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
                validation_business_value=None if validation.value is None else validation.value.overall,
                test_process_success=test.process_success_rate,
                test_goal_success=test.success_rate,
                test_business_value=None if test.value is None else test.value.overall,
                test_regret_closed=self.regret_closed(test),
                test_process_success_by_family=test.process_success_by_family,
                selection=selection_metric(validation),
            )
        )
        if self.progress is not None:
            self.progress(_progress_line(run.name, run.checkpoints[-1]))

    def close(self) -> None:
        """Close both pools."""
        self.validation_pool.close()
        self.test_pool.close()


def _progress_line(name: str, c: Checkpoint) -> str:
    line = (
        f"{name}: {c.env_steps} steps, {c.train_s:.0f} s training, validation/test process success "
        f"{c.validation_process_success:.3f}/{c.test_process_success:.3f}"
    )
    if c.test_business_value is not None:
        line += f", test value {c.test_business_value:.2f}"
    if c.test_regret_closed is not None:
        line += f", regret closed {c.test_regret_closed:.3f}"
    return line
