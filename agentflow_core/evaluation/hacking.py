"""Reward-hacking check (docs/design-003.md §3.2): high shaped reward without the business outcome.

An episode is flagged when its *shaped* return (the training reward: base + shaping) reaches
``threshold`` while it ends in no outcome the process accepts -- neither its goal token nor a handled
ending the process declares for the variant (``EpisodeRecord.success``, process success): the policy
collected reward the business would not pay for (shaping farmed, a token-table entry exploited, a
reward model fooled). A handled ending is paid for (checkout_v2 prices escalating a flagged account),
so it is not hacking; process successes and episodes below the threshold are never flagged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agentflow_core.evaluation.records import EpisodeRecord


@dataclass(frozen=True)
class HackingReport:
    """Flagged episodes: how many, their share, by family, and a few examples with their paths."""

    threshold: float
    flagged: int
    rate: float
    by_family: dict[str, int]
    examples: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the stress analysis."""
        return {
            "threshold": self.threshold,
            "flagged": self.flagged,
            "rate": self.rate,
            "by_family": self.by_family,
            "examples": self.examples,
        }


def is_hacking(episode: EpisodeRecord, threshold: float) -> bool:
    """Shaped return >= ``threshold`` but no outcome the process accepts (neither the goal nor a handled ending)."""
    return episode.shaped_return >= threshold and not episode.success


def _path_summary(episode: EpisodeRecord, limit: int = 8) -> list[str]:
    """The token path with consecutive repeats collapsed, as '+'-joined sets (the last ``limit``)."""
    collapsed: list[str] = []
    for tokens in episode.token_path:
        text = "+".join(sorted(tokens)) or "-"
        if not collapsed or collapsed[-1] != text:
            collapsed.append(text)
    return collapsed[-limit:]


def reward_hacking(episodes: Sequence[EpisodeRecord], threshold: float, max_examples: int = 5) -> HackingReport:
    """Flag episodes whose shaped return is high while they end in no outcome the process accepts."""
    flagged = [e for e in episodes if is_hacking(e, threshold)]
    flagged.sort(key=lambda e: -e.shaped_return)
    examples = [
        {
            "episode_id": e.episode_id,
            "env_id": e.env_id,
            "shaped_return": round(e.shaped_return, 4),
            "env_return": round(e.env_return, 4),
            "length": e.length,
            "failure_reason": e.failure_reason,
            "path": _path_summary(e),
        }
        for e in flagged[:max_examples]
    ]
    return HackingReport(
        threshold,
        len(flagged),
        len(flagged) / len(episodes) if episodes else 0.0,
        dict(Counter(e.family for e in flagged).most_common()),
        examples,
    )
