"""Phase 0, sandbox calibration: is every env stable and correctly mapped before we train on it?

For each sampled variant the reference policy (the family's scripted expert) runs ``resets``
episodes with seeds ``seed .. seed+resets-1``. A variant is *stable* when

1. it never crashes, hangs or returns NaN (any :class:`EnvError` fails it),
2. it is deterministic: replaying the first seed gives the identical return, and
3. the variance of its returns, in units of the goal reward (return / 10), is below
   ``max_reward_variance`` (docs/design.md §2.2: 0.05). An expert that sometimes finishes and sometimes
   does not produces a variance near 0.25, so a wrong mapping or a broken business rule fails
   this gate long before PPO would have wasted days on it, and
4. the expert reaches an accepted outcome -- the process's goal token, or a handled outcome the process
   declares for the variant (checkout: escalating a blocked user) -- in at least ``min_success`` of the
   episodes: an env that *consistently* fails (say a mapping that never emits checkout's PAYMENT_PAGE)
   has zero variance and must still fail the gate.

``env_stability_score`` is the share of stable variants. The per-variant return statistics are
kept (Welford) for per-env reward normalisation in training.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import EnvError

GOAL_REWARD = 10.0

Policy = Callable[[np.ndarray, np.ndarray], int]
# (env factory, reference policy, accepted outcome tokens of the variant)
Target = tuple[Callable[[], SemanticEnv], Policy, frozenset[str]]


@dataclass(frozen=True)
class VariantCalibration:
    """Calibration outcome of one variant."""

    env_id: str
    episodes: int
    mean_return: float
    std_return: float
    variance: float
    success_rate: float
    step_reward_mean: float
    step_reward_std: float
    step_count: int
    deterministic: bool
    stable: bool
    reason: str | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the calibration report and metrics."""
        return asdict(self)


def run_episode(
    env: SemanticEnv,
    policy: Policy,
    seed: int,
    accepted: frozenset[str],
    handled_outcomes: frozenset[str] = frozenset(),
    max_steps: int = 1000,
) -> tuple[list[float], bool]:
    """One episode of ``policy``: (per-step rewards, reached an ``accepted`` token or a ``handled_outcomes`` reason).

    ``accepted`` holds the process's goal and the handled-outcome tokens it declares for the variant
    (:meth:`~agentflow_core.semantics.Vocabulary.accepted_outcomes`); ``handled_outcomes`` are failure
    reasons a configuration accepts on top.
    """
    obs, info = env.reset(seed=seed)
    rewards: list[float] = []
    success = False
    for _ in range(max_steps):
        obs, reward, terminated, truncated, info = env.step(policy(obs, info["action_mask"]))
        rewards.append(reward)
        success = success or not accepted.isdisjoint(info["tokens"]) or info.get("failure_reason") in handled_outcomes
        if terminated or truncated:
            break
    return rewards, success


def calibrate_variant(
    env: SemanticEnv,
    policy: Policy,
    resets: int,
    seed: int,
    max_variance: float,
    accepted: frozenset[str],
    min_success: float = 0.0,
    handled_outcomes: frozenset[str] = frozenset(),
) -> VariantCalibration:
    """Run the stability check on one env (which the caller owns and closes)."""
    returns: list[float] = []
    step_rewards: list[float] = []
    successes = 0
    try:
        for i in range(resets):
            rewards, ok = run_episode(env, policy, seed + i, accepted, handled_outcomes)
            returns.append(sum(rewards))
            step_rewards.extend(rewards)
            successes += ok
        replay = sum(run_episode(env, policy, seed, accepted, handled_outcomes)[0])
    except EnvError as exc:
        return VariantCalibration(
            env.env_id,
            len(returns),
            math.nan,
            math.nan,
            math.nan,
            0.0,
            math.nan,
            math.nan,
            0,
            False,
            False,
            f"{exc.failure_reason}: {exc}",
        )
    values = np.asarray(returns) / GOAL_REWARD
    variance = float(values.var())
    deterministic = replay == returns[0]
    reason = None
    if not deterministic:
        reason = f"not deterministic: seed {seed} gave {returns[0]:.4f} then {replay:.4f}"
    elif variance >= max_variance:
        reason = f"reward variance {variance:.4f} >= {max_variance} (expert success {successes / resets:.0%})"
    elif successes / resets < min_success:
        reason = (
            f"the scripted expert reached the goal in {successes / resets:.0%} of episodes (< {min_success:.0%}): "
            "the mapping or the business rules are broken"
        )
    return VariantCalibration(
        env.env_id,
        resets,
        float(np.mean(returns)),
        float(np.std(returns)),
        variance,
        successes / resets,
        float(np.mean(step_rewards)),
        float(np.std(step_rewards)),
        len(step_rewards),
        deterministic,
        reason is None,
        reason,
    )


@dataclass(frozen=True)
class CalibrationReport:
    """All variants' outcomes and the gate verdict."""

    variants: list[VariantCalibration]
    env_stability_score: float
    max_failed_fraction: float

    @classmethod
    def of(cls, results: list[VariantCalibration], max_failed_fraction: float) -> CalibrationReport:
        """The verdict over per-variant results (calibrated in one process or in several)."""
        return cls(results, sum(v.stable for v in results) / max(len(results), 1), max_failed_fraction)

    @property
    def failed(self) -> list[VariantCalibration]:
        """The unstable variants, in catalogue order."""
        return [v for v in self.variants if not v.stable]

    @property
    def passed(self) -> bool:
        """The gate: at most ``max_failed_fraction`` of the variants may be unstable."""
        return len(self.failed) <= self.max_failed_fraction * len(self.variants)

    def summary(self) -> str:
        """The score and the first ten failures with their reasons, for the gate's error message."""
        head = (
            f"env_stability_score={self.env_stability_score:.3f} ({len(self.variants) - len(self.failed)}/"
            f"{len(self.variants)} stable, gate allows {self.max_failed_fraction:.0%} failed)"
        )
        lines = [f"  {v.env_id}: {v.reason}" for v in self.failed[:10]]
        return "\n".join([head, *lines])


def calibrate(
    envs: Sequence[Target],
    resets: int,
    seed: int,
    max_variance: float,
    max_failed_fraction: float,
    min_success: float = 0.0,
    handled_outcomes: frozenset[str] = frozenset(),
    progress: Callable[[int, int], None] | None = None,
) -> CalibrationReport:
    """Calibrate each (env factory, reference policy, accepted tokens) target; envs are built and closed here."""
    results = []
    for i, (make, policy, accepted) in enumerate(envs):
        env = make()
        try:
            results.append(
                calibrate_variant(env, policy, resets, seed, max_variance, accepted, min_success, handled_outcomes)
            )
        finally:
            env.close()
        if progress:
            progress(i + 1, len(envs))
    return CalibrationReport.of(results, max_failed_fraction)
