"""Failure root causes (docs/design.md §4.3): cluster the failed episodes, report the top three with where they concentrate.

A *failed* episode ended (terminated or truncated) with an evaluated return below
``failure_reward_threshold`` and is not a handled outcome (``EpisodeRecord.success``). Its
*cause* is, in order: the pool failure that closed it (env_crash, env_timeout, env_invalid,
worker_lost); else the most recent anomaly token in its last three token sets (NETWORK_TIMEOUT,
SERVER_ERROR, PAGE_NOT_FOUND, INSUFFICIENT_FUNDS, INVALID_CARD, ...), since the channel state that
preceded the failure says more than the ending (usually ``max_steps``); else its
``failure_reason``; else ``low_return``.

Concentration: for every variant dimension value ``v`` (``family`` included), the share of the
cause's episodes with ``v`` against the share of *all* evaluated episodes with ``v``;
``lift = share_in_cause / share_overall``. The headline is the value with the highest lift
among those covering at least half of the cause ("mostly packet_loss_5% variants").
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from agentflow_core.evaluation.records import EpisodeRecord, dimension_value

# Anomaly tokens in priority order (when several are in the same token set) and their cause names.
ANOMALY_CAUSES: tuple[tuple[str, str], ...] = (
    ("NETWORK_TIMEOUT", "network_timeout"),
    ("SERVER_ERROR", "server_error"),
    ("PAGE_NOT_FOUND", "page_not_found"),
    ("INSUFFICIENT_FUNDS", "insufficient_funds"),
    ("INVALID_CARD", "invalid_card"),
    ("PAYMENT_FAILED", "payment_failed"),
    ("SESSION_EXPIRED", "session_expired"),
    ("ORDER_EXPIRED", "order_expired"),
    ("OUT_OF_STOCK", "out_of_stock"),
    ("USER_BLOCKED", "user_blocked"),
)

RECOMMENDATIONS: dict[str, str] = {
    "network_timeout": "Add retry logic for network timeouts: train more on packet-loss/latency variants and check RETRY after NETWORK_TIMEOUT.",
    "server_error": "Retry on 5xx with backoff; oversample variants with server errors.",
    "page_not_found": "Fix the broken link / mapping for PAGE_NOT_FOUND and teach RETRY or re-navigation there.",
    "insufficient_funds": "Teach TOP_UP_FUNDS after INSUFFICIENT_FUNDS (never reject the user); oversample low-balance variants.",
    "invalid_card": "Teach USE_BACKUP_CARD after INVALID_CARD; oversample high decline-rate variants.",
    "payment_failed": "Handle generic payment errors with USE_BACKUP_CARD or RETRY before giving up.",
    "session_expired": "LOGIN again after SESSION_EXPIRED (cart and order are kept); shorten the funnel.",
    "order_expired": "CHECKOUT again after ORDER_EXPIRED; pay sooner after checkout.",
    "out_of_stock": "VIEW_PRODUCT again on OUT_OF_STOCK (the next product is in stock).",
    "user_blocked": "ESCALATE blocked users immediately instead of looping.",
    "max_steps": "Episodes run out of steps: look for loops (repeated actions) and add step-cost shaping.",
    "order_cancelled": "Do not CANCEL_ORDER: raise its risk penalty or mask it outside explicit user requests.",
    "escalated": "Escalate only blocked users; penalise escalation elsewhere.",
    "env_crash": "Fix the crashing env family (see the quarantine list) before trusting its numbers.",
    "env_timeout": "Find the hanging env (blocking IO without timeout) and add timeouts.",
    "env_invalid": "Find the env/adapter producing NaN/inf observations or rewards.",
    "worker_lost": "Investigate worker deaths (memory, segfaults) in the pool logs.",
    "low_return": "Episodes end with a low return but no recorded reason: inspect their token paths.",
}

CRASH_CAUSES = frozenset({"env_crash", "env_timeout", "env_invalid", "worker_lost"})


@dataclass(frozen=True)
class Concentration:
    """Where a cause concentrates: one dimension value's share in the cause vs overall."""

    dimension: str
    value: str
    share_in_cause: float
    share_overall: float
    lift: float


@dataclass(frozen=True)
class RootCause:
    """One failure cause: its count and share of failures, ending reasons, concentration and advice."""

    cause: str
    count: int
    share: float
    endings: dict[str, int]
    concentration: list[Concentration]
    recommendation: str
    examples: list[str] = field(default_factory=list)

    @property
    def headline(self) -> Concentration | None:
        """The most over-represented value among those covering at least half of the cause."""
        majority = [c for c in self.concentration if c.share_in_cause >= 0.5]
        return max(majority or self.concentration, key=lambda c: (c.lift, c.share_in_cause), default=None)

    def summary(self) -> str:
        """``network_timeout: 42% (mostly network=packet_loss_5%, 80% vs 33% overall)``."""
        text = f"{self.cause}: {self.share:.0%}"
        head = self.headline
        if head is not None and head.lift > 1.0:
            text += (
                f" (mostly {head.dimension}={head.value}: {head.share_in_cause:.0%} of these vs "
                f"{head.share_overall:.0%} overall)"
            )
        return text

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the report, with the one-line summary and its recommendation."""
        head = self.headline
        return {
            "cause": self.cause,
            "count": self.count,
            "share": self.share,
            "endings": self.endings,
            "summary": self.summary(),
            "recommendation": self.recommendation,
            "headline": asdict(head) if head else None,
            "concentration": [asdict(c) for c in self.concentration[:8]],
            "examples": self.examples,
        }


def is_failure(episode: EpisodeRecord, threshold: float) -> bool:
    """Done with an evaluated return below ``threshold`` and not a business success / handled outcome."""
    return not episode.success and episode.evaluated_return < threshold


def cause_of(episode: EpisodeRecord, lookback: int = 3) -> str:
    """The episode's root-cause label (see the module docstring for the order of the rules)."""
    if episode.failure_reason in CRASH_CAUSES:
        return str(episode.failure_reason)
    for tokens in reversed(episode.last_tokens(lookback)):
        for token, cause in ANOMALY_CAUSES:
            if token in tokens:
                return cause
    return episode.failure_reason or "low_return"


def recommendation_for(cause: str, head: Concentration | None = None) -> str:
    """One line of advice for a cause, naming where it concentrates."""
    text = RECOMMENDATIONS.get(cause, f"Inspect episodes failing with {cause}.")
    if head is not None and head.lift > 1.0:
        text += f" Start with {head.dimension}={head.value} variants."
    return text


def _concentration(
    members: Sequence[EpisodeRecord], population: Sequence[EpisodeRecord], dimensions: Sequence[str]
) -> list[Concentration]:
    rows = []
    for dim in dimensions:
        overall = Counter(dimension_value(e, dim) for e in population)
        inside = Counter(dimension_value(e, dim) for e in members)
        for value, count in inside.items():
            share_in, share_all = count / len(members), overall[value] / len(population)
            rows.append(
                Concentration(dim, value, share_in, share_all, share_in / share_all if share_all else float("inf"))
            )
    rows.sort(key=lambda c: (-c.lift, -c.share_in_cause, c.dimension, c.value))
    return rows


def root_causes(
    episodes: Sequence[EpisodeRecord],
    dimensions: Sequence[str],
    threshold: float = 5.0,
    top: int = 3,
    lookback: int = 3,
) -> tuple[list[RootCause], int]:
    """The ``top`` causes of failed episodes (share of all failures) and the number of failures."""
    failed = [e for e in episodes if is_failure(e, threshold)]
    groups: dict[str, list[EpisodeRecord]] = {}
    for episode in failed:
        groups.setdefault(cause_of(episode, lookback), []).append(episode)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:top]
    dims = ["family", *[d for d in dimensions if d != "family"]]
    causes = []
    for cause, members in ranked:
        conc = _concentration(members, episodes, dims)
        draft = RootCause(cause, len(members), len(members) / len(failed), {}, conc, "")
        endings = dict(Counter(str(e.failure_reason) for e in members).most_common())
        causes.append(
            RootCause(
                cause,
                len(members),
                draft.share,
                endings,
                conc,
                recommendation_for(cause, draft.headline),
                [e.episode_id for e in members[:3]],
            )
        )
    return causes, len(failed)
