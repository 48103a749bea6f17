"""Risk term (docs/design-003.md §2.2): risky actions are counted and penalised in the evaluated return.

Each semantic action declares a risk (the process YAML's ``actions[].risk``; checkout: CANCEL_ORDER 0.5, SUBMIT_PAYMENT
0.1) and a channel may raise it in context (``info["risk"]``, e.g. cancelling a paid order or
submitting a payment twice). A step with ``risk > threshold`` is *risky*; each costs
``penalty`` in ``EpisodeRecord.evaluated_return = env_return - penalty * risky_steps``, the
return every other measure (failures, champion reward) uses.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentflow_core.evaluation.records import EpisodeRecord, StepRecord


@dataclass(frozen=True)
class RiskReport:
    """Risky-step counts and rates by action and by family, and the total penalty applied."""

    threshold: float
    penalty: float
    risky_steps: int
    steps: int
    risky_episodes: int
    total_penalty: float
    by_action: dict[str, dict[str, float]]
    by_family: dict[str, dict[str, float]]
    max_risk: float

    @property
    def rate(self) -> float:
        """Share of steps above the risk threshold (0 with no steps)."""
        return self.risky_steps / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the stress analysis."""
        return {
            "threshold": self.threshold,
            "penalty": self.penalty,
            "risky_steps": self.risky_steps,
            "steps": self.steps,
            "rate": self.rate,
            "risky_episodes": self.risky_episodes,
            "total_penalty": self.total_penalty,
            "max_risk": self.max_risk,
            "by_action": self.by_action,
            "by_family": self.by_family,
        }


def _table(risky: Counter[str], total: Counter[str]) -> dict[str, dict[str, float]]:
    return {
        k: {"risky": risky[k], "steps": total[k], "rate": risky[k] / total[k]}
        for k in sorted(total, key=lambda k: (-risky[k], k))
        if risky[k]
    }


def action_name(action: int, actions: Sequence[str]) -> str:
    """The semantic action's name (in the process's ``actions``) for a report, or the raw number when out of range."""
    return actions[action] if 0 <= action < len(actions) else str(action)


def risk_report(
    steps: Sequence[StepRecord],
    episodes: Sequence[EpisodeRecord],
    threshold: float,
    penalty: float,
    actions: Sequence[str],
) -> RiskReport:
    """Count steps with ``risk > threshold``; rates are per action taken and per family's steps."""
    by_action: Counter[str] = Counter()
    action_total: Counter[str] = Counter()
    by_family: Counter[str] = Counter()
    family_total: Counter[str] = Counter()
    for step in steps:
        name = action_name(step.action, actions)
        action_total[name] += 1
        family_total[step.family] += 1
        if step.risk > threshold:
            by_action[name] += 1
            by_family[step.family] += 1
    risky = sum(by_action.values())
    return RiskReport(
        threshold,
        penalty,
        risky,
        len(steps),
        sum(e.risky_steps > 0 for e in episodes),
        penalty * risky,
        _table(by_action, action_total),
        _table(by_family, family_total),
        max((s.risk for s in steps), default=0.0),
    )
