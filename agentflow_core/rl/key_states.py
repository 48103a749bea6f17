"""Key states found in exploration data: the tokens that precede the right outcome and are rare where it is hard.

A token is a *key state* when an episode that passes through it ends in the outcome its variant
accepts (the goal, or the handled outcome that is right for it) much more often than episodes do on
average, and when it is rare on *cold* variants -- those whose exploration episodes reach that
outcome less often than ``cold_threshold``, where success is sparse. Such a token marks
progress the learner sees seldom exactly where the reward is sparse, so a small once-per-episode
bonus on it (a shaping term, :mod:`agentflow_core.rl.reward`) carries the signal earlier.

For every token ``k`` (outcome tokens and tokens present in every first state excluded):

* ``lift_k = P(outcome | k seen before the last step) - P(outcome)`` over the complete episodes;
* ``cold_share_k``: the share of steps on cold variants whose state carries ``k``.

Tokens with ``lift_k >= min_lift``, at least ``min_episodes`` episodes through them and
``cold_share_k <= max_cold_share`` are kept, the highest lift first, at most ``max_terms``. A kept
token pays ``weight * lift_k * outcome_return`` once per episode, ``outcome_return`` being the mean
return of the episodes that reached their outcome: the bonus is a fraction of what the outcome is
worth, in the reward's own units.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from agentflow_core.rl.trajectories import Episode


@dataclass(frozen=True)
class KeyState:
    """One mined key state and the figures that selected it."""

    token: str
    lift: float  # P(outcome | token seen) - P(outcome)
    episodes: int  # complete episodes that passed through the token
    cold_share: float  # share of cold variants' steps whose state carries the token
    reward: float  # the once-per-episode bonus it is proposed with


@dataclass(frozen=True)
class KeyStateLimits:
    """Selection thresholds of :func:`mine_key_states`."""

    min_lift: float = 0.1
    min_episodes: int = 20
    max_cold_share: float = 0.1
    cold_threshold: float = 0.3
    max_terms: int = 4
    weight: float = 0.2


@dataclass
class _Counts:
    outcome: int = 0
    seen: int = 0
    seen_outcome: int = 0
    cold_steps: int = 0


def _reached(ep: Episode, accepted: frozenset[str]) -> bool:
    return ep.terminated and not accepted.isdisjoint(ep.tokens[-1])


def _cold_variants(episodes: list[tuple[Episode, bool]], threshold: float) -> set[str]:
    totals: dict[str, list[int]] = {}
    for ep, reached in episodes:
        row = totals.setdefault(ep.variant_hash, [0, 0])
        row[0] += int(reached)
        row[1] += 1
    return {variant for variant, (hits, n) in totals.items() if hits / n < threshold}


def mine_key_states(
    episodes: Iterable[Episode],
    accepted: Mapping[str, frozenset[str]],
    limits: KeyStateLimits = KeyStateLimits(),
) -> list[KeyState]:
    """Key states of ``episodes`` (variant hash -> its accepted outcome tokens in ``accepted``; others skipped)."""
    judged = [
        (ep, _reached(ep, accepted[ep.variant_hash]))
        for ep in episodes
        if ep.complete and len(ep) > 0 and ep.variant_hash in accepted
    ]
    if not judged:
        return []
    cold = _cold_variants(judged, limits.cold_threshold)
    outcome_tokens = set().union(*accepted.values())
    at_reset = set.intersection(*(set(ep.tokens[0]) for ep, _ in judged))
    counts: dict[str, _Counts] = {}
    cold_steps = 0
    for ep, reached in judged:
        for token in set().union(*map(set, ep.tokens[:-1])) if len(ep) > 1 else set():
            c = counts.setdefault(token, _Counts())
            c.seen += 1
            c.seen_outcome += int(reached)
        if ep.variant_hash in cold:
            cold_steps += len(ep)
            for step_tokens in ep.tokens:
                for token in step_tokens:
                    counts.setdefault(token, _Counts()).cold_steps += 1
    base = float(np.mean([reached for _, reached in judged]))
    returns = [float(ep.rewards.sum()) for ep, reached in judged if reached]
    outcome_return = float(np.mean(returns)) if returns else 0.0
    found = []
    for token, c in counts.items():
        if token in outcome_tokens or token in at_reset or c.seen < limits.min_episodes:
            continue
        lift = c.seen_outcome / c.seen - base
        share = c.cold_steps / cold_steps if cold_steps else 0.0
        if lift >= limits.min_lift and share <= limits.max_cold_share:
            found.append(KeyState(token, lift, c.seen, share, limits.weight * lift * outcome_return))
    found.sort(key=lambda k: (-k.lift, k.token))
    return [k for k in found[: limits.max_terms] if k.reward > 0.0]
