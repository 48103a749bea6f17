"""Paired challenger-vs-champion comparison on identical held-out episodes.

Both policies play the same list of episodes -- the same variant with the same reset seed, in the
same order -- so every episode is a pair and the noise of which variants and seeds each policy
happened to draw cancels out. Per pair the outcome is process success (the goal, or the handled
ending accepted for the variant) and the evaluated return. A pair in which exactly one policy
succeeds is *discordant*: a ``win`` for the challenger or a ``loss``.

Every two-policy comparison judges the *paired* per-episode difference with its confidence bound
(:func:`paired_difference`), never a raw difference of two means on a small sample: the mean of
``d_i = a_i - b_i`` over the pairs and its two-sided Student-t interval
``mean ± t_{(1+c)/2, n-1} · sd(d) / sqrt(n)``. The bound says how far the sample lets the true
mean difference lie; a gate compares the bound, not the point estimate, with its margin.

The challenger *beats* the champion iff it wins at least as many discordant pairs as it loses
(held-out process success can never decrease through a promotion: ``success_diff >= 0``) and it
is better with 95% confidence: the lower bound of the paired process-success difference, or of the
paired evaluated-return difference, is above 0. ``sign_test_p`` is the exact two-sided sign test
(McNemar's exact test) on the discordant pairs, reported alongside.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

# The confidence of every paired bound a gate or promotion reads.
CONFIDENCE = 0.95


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
    success_diff_low: float = -math.inf
    mean_return_diff_low: float = -math.inf

    def to_dict(self) -> dict[str, float | int | bool]:
        """JSON-ready form for decisions and reports."""
        return asdict(self)


def t_quantile(p: float, dof: int) -> float:
    """The ``p`` quantile of Student's t with ``dof`` degrees of freedom.

    Exact for 1 and 2 degrees of freedom; from 3 on, the Cornish-Fisher expansion around the normal
    quantile (Abramowitz & Stegun 26.7.5), within 0.2% of the exact value at dof 3 and closer beyond.
    """
    if dof < 1:
        raise ValueError(f"Student's t needs at least one degree of freedom, got {dof}")
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z, n = statistics.NormalDist().inv_cdf(p), float(dof)
    return (
        z
        + (z**3 + z) / (4 * n)
        + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * n**2)
        + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * n**3)
        + (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / (92160 * n**4)
    )


@dataclass(frozen=True)
class PairedDifference:
    """The mean paired difference ``a - b`` over ``pairs`` pairs and its two-sided confidence interval."""

    pairs: int
    mean: float
    low: float
    high: float
    confidence: float = CONFIDENCE

    def to_dict(self) -> dict[str, float | int]:
        """JSON-ready form."""
        return asdict(self)


def paired_difference(diffs: Sequence[float], confidence: float = CONFIDENCE) -> PairedDifference:
    """The mean of the paired differences and its Student-t interval (infinite with a single pair).

    All differences equal (no spread) give a zero-width interval at their value: the sample shows
    no disagreement to be unsure about.
    """
    n = len(diffs)
    if n == 0:
        raise ValueError("a paired difference needs at least one pair")
    mean = math.fsum(diffs) / n
    if n == 1:
        return PairedDifference(1, mean, -math.inf, math.inf, confidence)
    half = t_quantile((1 + confidence) / 2, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return PairedDifference(n, mean, mean - half, mean + half, confidence)


def paired_by_key(
    a: Iterable[tuple[str, float]], b: Iterable[tuple[str, float]], confidence: float = CONFIDENCE
) -> PairedDifference:
    """The paired difference of two policies' outcomes blocked by ``key`` (a variant, an episode).

    Each side's outcomes are averaged per key first, then paired over the keys both played: where
    two policies' episodes of a variant do not line up one to one (a pool hands variants out as
    episodes end), the variant is the pair.
    """

    def means(rows: Iterable[tuple[str, float]]) -> dict[str, float]:
        cells: dict[str, list[float]] = {}
        for key, value in rows:
            cells.setdefault(key, []).append(float(value))
        return {key: math.fsum(v) / len(v) for key, v in cells.items()}

    ma, mb = means(a), means(b)
    common = sorted(ma.keys() & mb.keys())
    if not common:
        raise ValueError("the two policies played no common episode key: nothing to pair")
    return paired_difference([ma[k] - mb[k] for k in common], confidence)


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
    pairs = list(zip(challenger, champion, strict=True))
    success = paired_difference([float(a.success) - float(b.success) for a, b in pairs])
    returns = paired_difference([a.evaluated_return - b.evaluated_return for a, b in pairs])
    beats = wins >= losses and (success.low > 0.0 or returns.low > 0.0)
    return PairedComparison(
        episodes=n,
        wins=wins,
        losses=losses,
        ties=n - wins - losses,
        challenger_success=sum(a.success for a in challenger) / n,
        champion_success=sum(b.success for b in champion) / n,
        success_diff=(wins - losses) / n,
        mean_return_diff=returns.mean,
        sign_test_p=sign_test_p(wins, losses),
        beats=beats,
        success_diff_low=success.low,
        mean_return_diff_low=returns.low,
    )
