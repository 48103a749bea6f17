"""Policy consistency across variants (docs/design.md §4.3: "the same initial state in 100 variants").

Two measures, both of *greedy* choices:

* **Canonical probes** -- for each of K variants (chosen so that every value of every catalogue
  dimension is among them, :func:`covering_variants`), the same semantic states (the funnel
  stages and the recoveries: logged out, product viewed, cart filled, order pending, payment
  page, insufficient funds, declined card, network timeout) are encoded with *every* feature
  varied: the variant's own values of the variant features (``is_vip``, ``price_factor``,
  ``balance_ratio``, ... from its first observation; VIP variants also carry ``VIP_USER``), the
  stage features the state fixes (``cart_items`` in the family's own scale), and ``draws``
  seeded draws per variant of the features nothing in the state fixes (``retries_used``,
  ``step_fraction``). The policy's greedy action is asked for with every action allowed.
  ``agreement[i, j]`` is the share of probe states where variants ``i`` and ``j`` got the same
  action; the scalar is the mean off-diagonal entry (1.0 for K = 1). A policy that reads
  anything but the business state (the channel's cart scale, the clock, the price) disagrees
  with itself across variants; :func:`random_policy` on the same probe states gives the score's
  floor (about 1/12 with 12 actions), reported beside it for scale.
* **Matched states** -- on the stress rollouts, steps are grouped by their exact token set; per
  variant the modal action in that set is taken, and the score is the share of agreeing variant
  pairs, pooled over all token sets met by at least two variants.

Agreement alone can hide a policy that is consistently wrong, so :func:`per_variant_rows`
puts each variant's agreement next to its success rate.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.evaluation.records import EpisodeRecord, PolicyFn, StepRecord, dimension_value
from agentflow_core.process import CanonicalState
from agentflow_core.semantics import Vocabulary

# Checkout's stage features (a canonical state's logged_in / cart_items / payment_page flags set them), and
# the features nothing in a state fixes (drawn per probe, where the process declares them); every other
# feature describes the variant and is kept from its first observation.
STAGE_FEATURES: tuple[str, ...] = ("user_logged_in", "cart_items", "payment_page_loaded")
FREE_FEATURES: tuple[str, ...] = ("retries_used", "step_fraction")
FREE_FEATURE_HIGH = 0.5  # free features are drawn from [0, 0.5): early in the episode, before the retry budget ends
DEFAULT_DRAWS = 3
DEFAULT_CART_SCALE = 0.2  # one cart item, when the family's mapping does not say how cart_items is scaled

_FUNNEL = frozenset({"LOGGED_IN", "CART_FILLED", "CHECKOUT_STARTED", "ORDER_PENDING"})


CANONICAL_STATES: tuple[CanonicalState, ...] = (
    CanonicalState("logged_out", frozenset({"LOGGED_OUT"}), logged_in=False),
    CanonicalState("product_viewed", frozenset({"LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"})),
    CanonicalState("cart_filled", frozenset({"LOGGED_IN", "CART_FILLED", "PRODUCT_VIEWED"}), cart_items=1),
    CanonicalState("order_pending", _FUNNEL, cart_items=1),
    CanonicalState("payment_page", _FUNNEL | {"PAYMENT_PAGE"}, cart_items=1, payment_page=True),
    CanonicalState(
        "insufficient_funds", _FUNNEL | {"PAYMENT_PAGE", "INSUFFICIENT_FUNDS"}, cart_items=1, payment_page=True
    ),
    CanonicalState("declined_card", _FUNNEL | {"PAYMENT_PAGE", "INVALID_CARD"}, cart_items=1, payment_page=True),
    CanonicalState("network_timeout", _FUNNEL | {"NETWORK_TIMEOUT"}, cart_items=1),
)


@dataclass(frozen=True)
class ConsistencyResult:
    """Greedy actions ``[K, S]`` on the canonical probes, the K×K agreement matrix and its mean."""

    variant_ids: list[str]
    states: list[str]
    actions: np.ndarray
    matrix: np.ndarray
    score: float

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the report."""
        return {
            "score": self.score,
            "variants": self.variant_ids,
            "states": self.states,
            "actions": self.actions.tolist(),
            "matrix": np.round(self.matrix, 4).tolist(),
        }


@dataclass(frozen=True)
class MatchedConsistency:
    """Agreement of modal greedy actions on token sets met by several variants in the rollouts."""

    score: float
    token_sets: int
    agreeing_pairs: int
    pairs: int
    worst: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the report."""
        return {
            "score": self.score,
            "token_sets": self.token_sets,
            "agreeing_pairs": self.agreeing_pairs,
            "pairs": self.pairs,
            "least_consistent_states": self.worst,
        }


def variant_feature_names(vocabulary: Vocabulary, states: Sequence[CanonicalState] = ()) -> tuple[str, ...]:
    """The features a probe keeps from the variant: neither fixed by a state nor free."""
    fixed = set(STAGE_FEATURES) | set(FREE_FEATURES) | {name for state in states for name, _ in state.features}
    return tuple(f for f in vocabulary.features if f not in fixed)


def probe_observation(
    state: CanonicalState,
    variant_features: Mapping[str, float],
    cart_scale: float = DEFAULT_CART_SCALE,
    free_features: Mapping[str, float] | None = None,
    *,
    vocabulary: Vocabulary,
) -> np.ndarray:
    """The encoded observation of ``state`` in a variant with ``variant_features``; every feature is set."""
    names = set(vocabulary.features)
    features = {name: float(variant_features.get(name, 0.0)) for name in variant_feature_names(vocabulary)}
    stage = {
        "user_logged_in": float(state.logged_in),
        "cart_items": state.cart_items * cart_scale,
        "payment_page_loaded": float(state.payment_page),
    }
    features.update({name: value for name, value in stage.items() if name in names})
    features.update(dict(state.features))
    features.update({name: float((free_features or {}).get(name, 0.0)) for name in FREE_FEATURES if name in names})
    tokens = set(state.tokens)
    # checkout: a VIP variant shows VIP_USER once logged in (its is_vip feature says so)
    if state.logged_in and features.get("is_vip", 0.0) >= 0.5 and "VIP_USER" in vocabulary.tokens:
        tokens.add("VIP_USER")
    return vocabulary.encode(tokens, features)


def random_policy(seed: int) -> PolicyFn:
    """A uniformly random legal action per observation (seeded): the floor a consistency score is read against."""
    rng = np.random.default_rng(seed)

    def act(obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        noise = rng.random(np.shape(masks))
        return np.asarray(np.where(masks, noise, -1.0).argmax(axis=-1), dtype=np.int64)

    return act


def covering_variants(
    episodes: Sequence[EpisodeRecord], sample_order: Sequence[str], dimensions: Sequence[str], k: int
) -> list[str]:
    """``k`` played variants in sample order, first one for every (dimension, value) not yet covered.

    A probe over the first ``k`` of the sample can miss a family or a dimension value entirely;
    covering each value first makes every dimension vary in the probe (when ``k`` allows).
    """
    first: dict[str, EpisodeRecord] = {}
    for episode in episodes:
        first.setdefault(episode.env_id, episode)
    played = [env_id for env_id in sample_order if env_id in first]
    chosen: list[str] = []
    covered: set[tuple[str, str]] = set()
    for env_id in played:
        values = {(d, dimension_value(first[env_id], d)) for d in ("family", *dimensions)}
        if not values <= covered and len(chosen) < k:
            chosen.append(env_id)
            covered |= values
    rest = [env_id for env_id in played if env_id not in set(chosen)]
    picked = set(chosen + rest[: max(k - len(chosen), 0)])
    return [env_id for env_id in played if env_id in picked]


def agreement_matrix(actions: np.ndarray) -> np.ndarray:
    """``[K, S]`` actions -> ``[K, K]`` share of states on which two variants chose the same action."""
    actions = np.asarray(actions)
    return (actions[:, None, :] == actions[None, :, :]).mean(axis=-1)


def mean_off_diagonal(matrix: np.ndarray) -> float:
    """Mean pairwise agreement, the diagonal (a variant with itself) left out; 1.0 for one variant."""
    k = matrix.shape[0]
    if k < 2:
        return 1.0
    return float((matrix.sum() - np.trace(matrix)) / (k * (k - 1)))


def canonical_consistency(
    policy_fn: PolicyFn,
    variant_ids: Sequence[str],
    variant_features: Sequence[Mapping[str, float]],
    cart_scales: Sequence[float] | None = None,
    states: Sequence[CanonicalState] = CANONICAL_STATES,
    draws: int = DEFAULT_DRAWS,
    seed: int = 0,
    *,
    vocabulary: Vocabulary,
) -> ConsistencyResult:
    """Ask ``policy_fn`` for its greedy action in every probe state of every variant (one batch).

    Probe state ``(state, d)`` of variant ``i`` carries the ``d``-th seeded draw of the free
    features for that variant, so the free features differ between variants on the same state.
    A process that declares no probe states has no canonical consistency: the score is NaN.
    """
    k = len(variant_ids)
    if not states:
        actions = np.zeros((k, 0), np.int64)
        return ConsistencyResult(list(variant_ids), [], actions, np.full((k, k), np.nan), math.nan)
    scales = list(cart_scales) if cart_scales is not None else [DEFAULT_CART_SCALE] * k
    free = np.random.default_rng(seed).uniform(0.0, FREE_FEATURE_HIGH, size=(k, draws, len(FREE_FEATURES)))
    names = [f"{state.name}#{d}" for state in states for d in range(draws)]
    obs = (
        np.stack(
            [
                probe_observation(
                    state, feats, scale, dict(zip(FREE_FEATURES, free[i, d], strict=True)), vocabulary=vocabulary
                )
                for i, (feats, scale) in enumerate(zip(variant_features, scales, strict=True))
                for state in states
                for d in range(draws)
            ]
        )
        if k
        else np.zeros((0, 1), np.float32)
    )
    masks = np.ones((len(obs), vocabulary.n_actions), dtype=bool)
    n = len(names)
    actions = np.asarray(policy_fn(obs, masks), dtype=np.int64).reshape(k, n) if k else np.zeros((0, n), np.int64)
    matrix = agreement_matrix(actions) if k else np.zeros((0, 0))
    return ConsistencyResult(list(variant_ids), names, actions, matrix, mean_off_diagonal(matrix))


def _modal_actions(steps: Iterable[StepRecord]) -> dict[frozenset[str], dict[str, int]]:
    counts: dict[frozenset[str], dict[str, Counter[int]]] = {}
    for step in steps:
        counts.setdefault(step.state_tokens, {}).setdefault(step.env_id, Counter())[step.action] += 1
    # Ties go to the smallest action id, so the result does not depend on the order of the steps.
    return {
        tokens: {env: min(c, key=lambda a: (-c[a], a)) for env, c in by_env.items()}
        for tokens, by_env in counts.items()
    }


def matched_state_consistency(steps: Iterable[StepRecord], worst: int = 5) -> MatchedConsistency:
    """Pooled share of agreeing variant pairs over token sets seen in at least two variants."""
    agreeing = total = sets = 0
    rows: list[dict[str, Any]] = []
    for tokens, modal in _modal_actions(steps).items():
        n = len(modal)
        if n < 2:
            continue
        by_action = Counter(modal.values())
        agree = sum(c * (c - 1) // 2 for c in by_action.values())
        pairs = n * (n - 1) // 2
        agreeing, total, sets = agreeing + agree, total + pairs, sets + 1
        rows.append(
            {
                "tokens": sorted(tokens),
                "variants": n,
                "agreement": agree / pairs,
                "actions": {str(a): c for a, c in sorted(by_action.items())},
            }
        )
    rows.sort(key=lambda r: (float(r["agreement"]), -int(r["variants"])))
    return MatchedConsistency(agreeing / total if total else 1.0, sets, agreeing, total, rows[:worst])


def policy_agreement(actions_a: np.ndarray, actions_b: np.ndarray) -> float:
    """Share of states on which two policies choose the same greedy action (1.0 when there are none)."""
    a, b = np.asarray(actions_a).ravel(), np.asarray(actions_b).ravel()
    return float((a == b).mean()) if a.size else 1.0


def per_variant_rows(
    result: ConsistencyResult, episodes: Sequence[EpisodeRecord], target: float
) -> list[dict[str, Any]]:
    """Each probed variant's mean agreement with the others next to its success rate.

    ``consistent_but_bad`` marks a variant that agrees with the rest (>= ``target``) but succeeds
    in fewer than half of its episodes: the policy is uniformly wrong there, not erratic.
    """
    by_env: dict[str, list[EpisodeRecord]] = {}
    for episode in episodes:
        by_env.setdefault(episode.env_id, []).append(episode)
    k = len(result.variant_ids)
    rows = []
    for i, env_id in enumerate(result.variant_ids):
        agreement = float((result.matrix[i].sum() - 1.0) / (k - 1)) if k > 1 else 1.0
        eps = by_env.get(env_id, [])
        success = sum(e.success for e in eps) / len(eps) if eps else float("nan")
        rows.append(
            {
                "env_id": env_id,
                "family": eps[0].family if eps else "",
                "agreement": agreement,
                "success_rate": success,
                "episodes": len(eps),
                "consistent_but_bad": bool(agreement >= target and eps and success < 0.5),
            }
        )
    return rows
