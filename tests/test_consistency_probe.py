"""The hardened consistency probe can fail: every feature and dimension varies, a random policy sets the floor."""

from __future__ import annotations

import numpy as np
import pytest

from agentflow_core.envs.experts import expert_for
from agentflow_core.evaluation.consistency import (
    CANONICAL_STATES,
    FREE_FEATURES,
    STAGE_FEATURES,
    canonical_consistency,
    covering_variants,
    random_policy,
    variant_feature_names,
)
from agentflow_core.evaluation.records import EpisodeRecord
from agentflow_core.semantics import CHECKOUT, FEATURE_INDEX, FEATURES, N_TOKENS, SemanticAction

A = SemanticAction
CART_SCALES = {"web_checkout": 0.2, "order_db": 0.1, "payment_api": 0.05}
FAMILIES = tuple(CART_SCALES)


def probe_variants(k: int = 12) -> tuple[list[str], list[dict[str, float]], list[float]]:
    """K variants over the three families, with their own VIP flag, price and balance."""
    rng = np.random.default_rng(3)
    ids, features, scales = [], [], []
    for i in range(k):
        family = FAMILIES[i % 3]
        ids.append(f"{family}-{i}")
        features.append(
            {"is_vip": float(i % 2), "price_factor": float(rng.uniform(0.3, 1.0)), "balance_ratio": float(rng.random())}
        )
        scales.append(CART_SCALES[family])
    return ids, features, scales


def expert(obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The scripted expert: token rules only, consistent across variants by construction."""
    return expert_for("any").act_batch(obs, masks)


def reads_cart_scale(obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The expert, except that it checks out only when ``cart_items`` looks like 2+ items on the web channel's scale."""
    actions = expert(obs, masks)
    cart = obs[:, N_TOKENS + FEATURE_INDEX["cart_items"]]
    return np.where((actions == int(A.CHECKOUT)) & (cart < 0.15), int(A.ADD_TO_CART), actions)


def reads_the_clock(obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
    """The expert, except that late in an episode it escalates wherever it would submit a payment."""
    actions = expert(obs, masks)
    late = obs[:, N_TOKENS + FEATURE_INDEX["step_fraction"]] > 0.25
    return np.where(late & (actions == int(A.SUBMIT_PAYMENT)), int(A.ESCALATE), actions)


def test_the_probe_sets_and_varies_every_feature() -> None:
    assert set(variant_feature_names(CHECKOUT)) | set(STAGE_FEATURES) | set(FREE_FEATURES) == set(FEATURES)
    seen: list[np.ndarray] = []

    def record(obs: np.ndarray, masks: np.ndarray) -> np.ndarray:
        seen.append(obs.copy())
        return expert(obs, masks)

    ids, features, scales = probe_variants()
    canonical_consistency(record, ids, features, scales, vocabulary=CHECKOUT)
    block = seen[0][:, N_TOKENS:]
    for name in FEATURES:
        assert len(np.unique(block[:, FEATURE_INDEX[name]])) >= 2, f"the probe never varies {name}"


def test_expert_high_random_low_channel_reader_lower() -> None:
    ids, features, scales = probe_variants()
    expert_score = canonical_consistency(expert, ids, features, scales, vocabulary=CHECKOUT).score
    random_score = canonical_consistency(random_policy(0), ids, features, scales, vocabulary=CHECKOUT).score
    cart_score = canonical_consistency(reads_cart_scale, ids, features, scales, vocabulary=CHECKOUT).score
    clock_score = canonical_consistency(reads_the_clock, ids, features, scales, vocabulary=CHECKOUT).score
    assert expert_score == 1.0
    assert random_score == pytest.approx(1 / 12, abs=0.05)  # 12 actions, all allowed on the probe
    # cart_filled (1 of the 8 states) splits the 12 variants into web (4, scale .2: CHECKOUT) and the
    # rest (8: ADD_TO_CART): C(4,2) + C(8,2) = 34 of 66 pairs agree there, every pair on the other 7
    assert cart_score == pytest.approx((7 + 34 / 66) / 8)
    assert random_score < clock_score < 0.95


def test_random_policy_is_seeded_and_legal() -> None:
    masks = np.random.default_rng(0).random((200, 12)) < 0.3
    masks[:, 5] = True
    a, b = random_policy(7)(np.zeros((200, 1)), masks), random_policy(7)(np.zeros((200, 1)), masks)
    assert np.array_equal(a, b) and masks[np.arange(200), a].all()
    assert len(np.unique(a)) > 3


def _episode(env_id: str, family: str, network: str, tier: str) -> EpisodeRecord:
    return EpisodeRecord(
        f"ep-{env_id}", env_id, family, {"network": network, "user_tier": tier}, 1, 0.0, 0.0, 0.0, False, False, None, 0
    )


def test_covering_variants_reach_every_dimension_value_first() -> None:
    # sample order puts the rare values last: the first k of the sample would miss them
    episodes = [_episode(f"w{i}", "web_checkout", "normal", "standard") for i in range(10)]
    episodes += [
        _episode("o1", "order_db", "normal", "standard"),
        _episode("w-lossy", "web_checkout", "packet_loss_5%", "standard"),
        _episode("p-vip", "payment_api", "normal", "vip"),
    ]
    order = [e.env_id for e in episodes] + ["never-played"]
    chosen = covering_variants(episodes, order, ["network", "user_tier"], k=5)
    assert len(chosen) == 5 and {"o1", "w-lossy", "p-vip"} <= set(chosen)
    assert chosen == [e for e in order if e in set(chosen)]  # kept in sample order
    assert covering_variants(episodes, order, ["network"], k=50) == order[:-1]
    assert len(CANONICAL_STATES) == 8
