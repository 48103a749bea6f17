"""The evaluation trajectory schema: one record per env step and one per finished episode.

Every evaluation measure (consistency, coverage, root causes, reward hacking, risk) is a pure
function of these records, so it is testable on synthetic trajectories with known answers and
runs the same on records read back from disk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentflow_core.contracts import POOL_FAILURES, PolicyFn

__all__ = ["EpisodeRecord", "PolicyFn", "StepRecord"]


@dataclass(slots=True)
class StepRecord:
    """One transition: the state the action was taken in (``state_tokens``) and its outcome."""

    episode_id: str
    env_id: str
    family: str
    params: Mapping[str, Any]
    step_id: int
    state_tokens: frozenset[str]
    action: int
    tokens: frozenset[str]
    reward: float
    shaped_reward: float
    risk: float
    terminated: bool
    truncated: bool
    failure_reason: str | None


@dataclass(slots=True)
class EpisodeRecord:
    """One finished episode.

    ``success`` is process success: the process's goal token reached, or a handled ending the process
    accepts for the variant (``handled_outcomes`` in its YAML; checkout: escalating a blocked user, for
    whom paying is impossible); ``reached_goal`` is goal success (the goal token reached). ``evaluated_return`` is the env return minus the risk penalty.
    """

    episode_id: str
    env_id: str
    family: str
    params: Mapping[str, Any]
    length: int
    env_return: float
    shaped_return: float
    evaluated_return: float
    reached_goal: bool
    success: bool
    failure_reason: str | None
    risky_steps: int
    token_path: list[frozenset[str]] = field(default_factory=list)
    initial_features: dict[str, float] = field(default_factory=dict)
    business_value: float | None = None  # the channel's ``info["business_value"]`` at the end, if it prices episodes

    @property
    def crashed(self) -> bool:
        """The episode was closed by an env or worker failure, not by the business process."""
        return self.failure_reason in POOL_FAILURES

    def last_tokens(self, k: int = 3) -> list[frozenset[str]]:
        """The outcome token sets of the last ``k`` steps (the lead-up to how it ended)."""
        return self.token_path[-k:]


def dimension_value(episode: EpisodeRecord, dimension: str) -> str:
    """The episode's value of a variant dimension as text (``family`` is a dimension too)."""
    if dimension == "family":
        return episode.family
    value = episode.params.get(dimension)
    return "-" if value is None else str(value)
