"""Paired challenger-vs-champion comparison on identical held-out episodes.

Both policies play the same list of episodes -- the same variant with the same reset seed, in the
same order -- so every episode is a pair and the noise of which variants and seeds each policy
happened to draw cancels out. Per pair the outcome is process success (the goal, or the handled
ending accepted for the variant) and the evaluated return. A pair in which exactly one policy
succeeds is *discordant*: a ``win`` for the challenger or a ``loss``.

The challenger *beats* the champion iff it wins more discordant pairs than it loses, or wins and
losses tie and its mean paired evaluated return is strictly higher. Held-out process success can
therefore never decrease through a promotion (``success_diff = (wins - losses) / n >= 0``).
``sign_test_p`` is the exact two-sided sign test (McNemar's exact test) on the discordant pairs,
reported, not gated on: the tiny and the shipped held-out sets are too small for it to decide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class EpisodeOutcome:
    """One episode of one policy: which episode it was and how it ended."""

    key: str  # the episode's identity: position in the held-out list and variant id
    success: bool  # process success
    evaluated_return: float


@dataclass(frozen=True)
class PairedComparison:
    """The paired numbers and the verdict."""

    episodes: int
    wins: int
    losses: int
    ties: int
    challenger_success: float
    champion_success: float
    success_diff: float
    mean_return_diff: float
    sign_test_p: float
    beats: bool

    def to_dict(self) -> dict[str, float | int | bool]:
        """JSON-ready form for decisions and reports."""
        return asdict(self)


def sign_test_p(wins: int, losses: int) -> float:
    """Exact two-sided binomial p-value of ``wins`` vs ``losses`` under p = 1/2 (1.0 with no discordant pair)."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def compare_paired(challenger: Sequence[EpisodeOutcome], champion: Sequence[EpisodeOutcome]) -> PairedComparison:
    """Compare two policies episode by episode; the episode keys must be identical and in the same order."""
    if len(challenger) != len(champion) or not challenger:
        raise ValueError(
            f"paired comparison needs the same non-empty episodes, got {len(challenger)} and {len(champion)}"
        )
    for a, b in zip(challenger, champion, strict=True):
        if a.key != b.key:
            raise ValueError(f"episodes are not paired: {a.key!r} vs {b.key!r}")
    n = len(challenger)
    wins = sum(a.success and not b.success for a, b in zip(challenger, champion, strict=True))
    losses = sum(b.success and not a.success for a, b in zip(challenger, champion, strict=True))
    return_diff = sum(a.evaluated_return - b.evaluated_return for a, b in zip(challenger, champion, strict=True)) / n
    beats = wins > losses or (wins == losses and return_diff > 0.0)
    return PairedComparison(
        episodes=n,
        wins=wins,
        losses=losses,
        ties=n - wins - losses,
        challenger_success=sum(a.success for a in challenger) / n,
        champion_success=sum(b.success for b in champion) / n,
        success_diff=(wins - losses) / n,
        mean_return_diff=return_diff,
        sign_test_p=sign_test_p(wins, losses),
        beats=beats,
    )
