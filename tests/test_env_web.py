"""Web channel: the storefront env, its adapter and mapping, driven through the shared semantic face."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from agentflow_core.adapters.audit import audit_mapping, errors_only
from agentflow_core.adapters.base import BaseSemanticAdapter
from agentflow_core.adapters.schema import validate_mapping
from agentflow_core.adapters.web import WebAdapter
from agentflow_core.envs import web_checkout
from agentflow_core.envs.base import PhysicalEnv, Scenario
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.envs.web_checkout import CLIENT_TIMEOUT_S, WebCheckoutEnv
from agentflow_core.errors import EnvCrashError, MappingError
from agentflow_core.semantics import CHECKOUT, TOKENS, SemanticAction, decode_features, decode_tokens

A = SemanticAction
MAPPING_PATH = Path(web_checkout.__file__).resolve().parents[1] / "mappings" / "web_checkout_v2.json"
MAPPING: dict[str, Any] = json.loads(MAPPING_PATH.read_text())


def make_env(**params: Any) -> SemanticEnv:
    return SemanticEnv(
        WebCheckoutEnv(Scenario.from_dict(params), "web_checkout_v2_test"),
        WebAdapter(MAPPING, str(MAPPING_PATH), vocabulary=CHECKOUT),
    )


def act(env: SemanticEnv, *actions: SemanticAction) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
    """Take semantic actions in order; returns the last transition."""
    out: tuple[np.ndarray, float, bool, bool, dict[str, Any]] | None = None
    for action in actions:
        out = env.step(int(action))
    assert out is not None
    return out


def run_expert(env: SemanticEnv, seed: int) -> tuple[float, dict[str, Any], list[list[str]]]:
    expert = expert_for("web_checkout")
    obs, info = env.reset(seed=seed)
    episode_return, trace = 0.0, [info["tokens"]]
    while True:
        obs, reward, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
        episode_return += reward
        trace.append(info["tokens"])
        if terminated or truncated:
            return episode_return, info, trace


# ---------------------------------------------------------------- contract
def test_gymnasium_check_env_and_contract() -> None:
    env = make_env()
    check_env(env, skip_render_check=True)
    assert isinstance(env.physical, PhysicalEnv)
    assert (web_checkout.FAMILY, web_checkout.VERSION) == ("web_checkout", 2)
    assert (env.physical.family, env.physical.version) == ("web_checkout", 2)


def test_mapping_validates_and_audit_is_clean() -> None:
    assert (
        validate_mapping(MAPPING, str(MAPPING_PATH), expected_template="web", vocabulary=CHECKOUT)["family"]
        == "web_checkout"
    )
    assert set(MAPPING["actions"]) == {a.name for a in SemanticAction}
    findings = audit_mapping(WebAdapter(MAPPING, vocabulary=CHECKOUT), web_checkout.RAW_STATES, str(MAPPING_PATH))
    assert errors_only(findings) == []
    # The storefront has no 5xx page: SERVER_ERROR is the one token it never produces.
    assert {f.detail for f in findings} == {"no rule emits SERVER_ERROR"}
    intended = {token for _, token in web_checkout.RAW_STATES}
    assert intended >= set(TOKENS) - {"SERVER_ERROR", "CART_EMPTY"}


def test_info_keys_and_truncation_at_max_steps() -> None:
    env = make_env(max_episode_steps=5)
    _, info = env.reset(seed=1)
    assert (info["env_id"], info["step_id"], info["failure_reason"]) == ("web_checkout_v2_test", 0, None)
    for step in range(1, 6):
        _, reward, terminated, truncated, info = env.step(int(A.LOGIN) if step == 1 else int(A.VIEW_PRODUCT))
        assert info["step_id"] == step and info["env_id"] == "web_checkout_v2_test"
        assert not terminated and truncated == (step == 5)
        assert reward == pytest.approx(-0.01)
    assert info["failure_reason"] == "max_steps"
    with pytest.raises(EnvCrashError):
        env.step(int(A.VIEW_PRODUCT))


def test_determinism_for_a_seed() -> None:
    def rollout(seed: int) -> list[tuple[bytes, float, float]]:
        env, rng = make_env(network="packet_loss_5%", card_decline_rate=0.5), np.random.default_rng(99)
        obs, info = env.reset(seed=seed)
        out = []
        for _ in range(40):
            action = int(rng.choice(np.flatnonzero(info["action_mask"])))
            obs, reward, terminated, truncated, info = env.step(action)
            out.append((obs.tobytes(), reward, info["sim_time_s"]))
            if terminated or truncated:
                obs, info = env.reset(seed=seed + 1)
        return out

    assert rollout(3) == rollout(3)
    assert rollout(3) != rollout(4)


# ---------------------------------------------------------------- expert and funnel
def test_expert_reaches_payment_success_in_normal_variant() -> None:
    env = make_env()
    results = [run_expert(env, seed) for seed in range(50)]
    success = [info["failure_reason"] is None and "PAYMENT_SUCCESS" in info["tokens"] for _, info, _ in results]
    assert np.mean(success) >= 0.9
    _, info, trace = results[0]
    assert trace[0] == ["LOGGED_OUT"]
    assert "PAYMENT_PAGE" in {t for step in trace for t in step}
    assert np.mean([ret for ret, _, _ in results]) > 9.9


def test_happy_path_tokens_rewards_and_features() -> None:
    env = make_env(card_decline_rate=0.0)
    obs, info = env.reset(seed=0)
    assert decode_tokens(obs) == {"LOGGED_OUT"} and list(np.flatnonzero(info["action_mask"])) == [A.LOGIN, A.ESCALATE]
    expected = [
        (A.LOGIN, {"LOGGED_IN", "CART_EMPTY"}),
        (A.VIEW_PRODUCT, {"LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"}),
        (A.ADD_TO_CART, {"LOGGED_IN", "CART_FILLED"}),
        (A.CHECKOUT, {"LOGGED_IN", "CART_FILLED", "CHECKOUT_STARTED", "ORDER_PENDING"}),
        (A.ENTER_PAYMENT, {"LOGGED_IN", "CART_FILLED", "CHECKOUT_STARTED", "ORDER_PENDING", "PAYMENT_PAGE"}),
    ]
    for action, tokens in expected:
        obs, reward, terminated, _, info = env.step(int(action))
        assert set(info["tokens"]) == tokens and reward == pytest.approx(-0.01) and not terminated
    features = decode_features(obs)
    assert features["user_logged_in"] == 1.0 and features["payment_page_loaded"] == 1.0
    assert features["cart_items"] == pytest.approx(0.2)
    assert features["balance_ratio"] == pytest.approx(1.0)  # 500/100 * 0.5, clipped
    obs, reward, terminated, truncated, info = env.step(int(A.SUBMIT_PAYMENT))
    assert (reward, terminated, truncated, info["failure_reason"]) == (10.0, True, False, None)
    assert "PAYMENT_SUCCESS" in info["tokens"] and env.physical._obs["balance"] == 400.0


def test_inapplicable_action_costs_and_changes_nothing() -> None:
    env = make_env()
    obs, info = env.reset(seed=0)
    assert not info["action_mask"][A.SUBMIT_PAYMENT]
    obs2, reward, terminated, _, info = env.step(int(A.SUBMIT_PAYMENT))
    assert reward == pytest.approx(-0.05) and not terminated and info["applied"] is False
    assert np.array_equal(obs[: len(TOKENS)], obs2[: len(TOKENS)]) and info["sim_time_s"] == 0.0


# ---------------------------------------------------------------- business rules
def test_blocked_user_escalation_is_rewarded() -> None:
    env = make_env(user_tier="blocked", start_stage="payment")
    _, info = env.reset(seed=0)
    assert info["tokens"] == ["LOGGED_OUT"]  # a blocked user never starts signed in
    _, reward, terminated, _, info = env.step(int(A.LOGIN))
    assert info["tokens"] == ["USER_BLOCKED"] and reward == pytest.approx(-0.01) and not terminated
    assert list(np.flatnonzero(info["action_mask"])) == [A.ESCALATE]
    _, reward, terminated, _, info = env.step(int(A.ESCALATE))
    assert (reward, terminated, info["failure_reason"]) == (1.0, True, "user_blocked")
    assert info["tokens"] == ["ESCALATED"]
    ret, info, _ = run_expert(env, seed=5)
    assert ret == pytest.approx(0.99) and info["failure_reason"] == "user_blocked"


def test_wrong_escalation_and_cancel_are_penalised() -> None:
    env = make_env(start_stage="payment")
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(int(A.ESCALATE))
    assert (reward, terminated, info["failure_reason"], info["tokens"]) == (
        -1.0,
        True,
        "escalated",
        ["CART_FILLED", "ESCALATED", "LOGGED_IN"],
    )
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(int(A.CANCEL_ORDER))
    assert (reward, terminated, info["failure_reason"], info["risk"]) == (-2.0, True, "order_cancelled", 0.5)
    assert info["tokens"] == ["CART_FILLED", "LOGGED_IN", "ORDER_CANCELLED"]


def test_insufficient_funds_recovers_through_top_up() -> None:
    env = make_env(start_stage="payment", balance=30.0, card_decline_rate=0.0)
    obs, _ = env.reset(seed=0)
    assert decode_features(obs)["balance_ratio"] == pytest.approx(0.15)  # 30/100 * 0.5
    _, reward, terminated, _, info = env.step(int(A.SUBMIT_PAYMENT))
    assert "INSUFFICIENT_FUNDS" in info["tokens"] and "PAYMENT_PAGE" not in info["tokens"] and not terminated
    assert info["action_mask"][A.TOP_UP_FUNDS] and info["action_mask"][A.CANCEL_ORDER]
    _, _, _, _, info = env.step(int(A.TOP_UP_FUNDS))
    assert {"FUNDS_TOPPED_UP", "ORDER_PENDING"} <= set(info["tokens"]) and info["action_mask"][A.SUBMIT_PAYMENT]
    assert env.physical._obs["balance"] == 30.0 + 70.0  # the shortfall, as the SQL and API channels top up
    _, reward, terminated, _, info = env.step(int(A.SUBMIT_PAYMENT))
    assert (reward, terminated) == (10.0, True) and env.physical._obs["balance"] == 0.0


def test_declined_card_recovers_with_backup_card() -> None:
    env = make_env(start_stage="payment", card_decline_rate=1.0)
    env.reset(seed=0)
    _, _, terminated, _, info = env.step(int(A.SUBMIT_PAYMENT))
    assert "INVALID_CARD" in info["tokens"] and not terminated
    _, _, _, _, info = env.step(int(A.USE_BACKUP_CARD))
    assert "PAYMENT_PAGE" in info["tokens"] and "INVALID_CARD" not in info["tokens"]
    _, reward, terminated, _, info = env.step(int(A.SUBMIT_PAYMENT))
    assert (reward, terminated) == (10.0, True)


def test_decline_rate_is_card_decline_rate() -> None:
    env = make_env(start_stage="payment", card_decline_rate=0.3)
    declined = 0
    for seed in range(400):
        env.reset(seed=seed)
        declined += "INVALID_CARD" in env.step(int(A.SUBMIT_PAYMENT))[4]["tokens"]
    assert 0.24 < declined / 400 < 0.36


def test_native_ui_errors_invalid_cvv_incomplete_card_and_404() -> None:
    env = WebCheckoutEnv(Scenario(start_stage="payment", card_decline_rate=0.0), "w")
    adapter = WebAdapter(MAPPING, vocabulary=CHECKOUT)
    raw, _ = env.reset(seed=0)
    assert env.step({"type": "type", "field": "card_cvv", "text": "12"}).obs["fields"]["card_cvv"] == "12"
    res = env.step({"type": "click", "target": "#pay-now"})
    assert "INVALID_CARD" in adapter.adapt_observation(res.obs).tokens and res.obs["banner"]["kind"] == "error"
    env.step({"type": "type", "field": "card_number", "text": "4000"})
    env.step({"type": "type", "field": "card_cvv", "text": "123"})
    res = env.step({"type": "submit", "form": "payment"})
    assert "PAYMENT_FAILED" in adapter.adapt_observation(res.obs).tokens
    res = env.step({"type": "navigate", "url": "/no/such/page"})
    assert res.obs["page"] == "not_found" and "PAGE_NOT_FOUND" in adapter.adapt_observation(res.obs).tokens
    res = env.step(adapter.adapt_action(A.RETRY))
    assert res.obs["page"] == "payment"
    assert env.step({"type": "click", "target": "#use-backup-card"}).obs["fields"]["card_number"].endswith("4242")
    assert env.step({"type": "click", "target": "#pay-now"}).terminated
    with pytest.raises(ValueError, match="unknown web action type"):
        env.reset(seed=0)
        env.step({"type": "scroll"})


def test_out_of_stock_then_alternative_product() -> None:
    env = make_env(start_stage="product_detail", inventory=0, card_decline_rate=0.0)
    _, info = env.reset(seed=0)
    assert {"PRODUCT_VIEWED", "OUT_OF_STOCK"} <= set(info["tokens"]) and not info["action_mask"][A.ADD_TO_CART]
    assert env.physical._obs["title"] == "Espresso machine"
    _, _, _, _, info = env.step(int(A.VIEW_PRODUCT))
    assert "PRODUCT_VIEWED" in info["tokens"] and "OUT_OF_STOCK" not in info["tokens"]
    assert env.physical._obs["title"] == "Espresso machine (refurbished)" and info["action_mask"][A.ADD_TO_CART]
    _, _, _, _, info = env.step(int(A.ADD_TO_CART))
    assert "CART_FILLED" in info["tokens"]


def test_last_item_sells_out_and_remove_empties_cart() -> None:
    env = make_env(start_stage="product_detail", inventory=1)
    env.reset(seed=0)
    _, _, _, _, info = act(env, A.ADD_TO_CART, A.VIEW_PRODUCT)
    assert {"OUT_OF_STOCK", "CART_FILLED"} <= set(info["tokens"]) and not info["action_mask"][A.ADD_TO_CART]
    cart = make_env(start_stage="checkout")
    _, info = cart.reset(seed=0)
    assert info["action_mask"][A.REMOVE_FROM_CART]
    _, reward, _, _, info = cart.step(int(A.REMOVE_FROM_CART))
    assert (
        "CART_EMPTY" in info["tokens"] and "CART_FILLED" not in info["tokens"] and not info["action_mask"][A.CHECKOUT]
    )


def test_session_timeout_then_login_restores_cart_and_page() -> None:
    env = make_env(start_stage="checkout", session_timeout_steps=3, card_decline_rate=0.0)
    _, info = env.reset(seed=0)
    assert "CART_FILLED" in info["tokens"]
    _, _, _, _, info = act(env, A.CHECKOUT, A.ENTER_PAYMENT, A.USE_BACKUP_CARD)
    assert "PAYMENT_PAGE" in info["tokens"]
    _, reward, _, _, info = env.step(int(A.SUBMIT_PAYMENT))  # step 4 > 3: the server expires the session first
    assert set(info["tokens"]) == {"LOGGED_OUT", "SESSION_EXPIRED"} and info["applied"] is False
    _, _, _, _, info = env.step(int(A.LOGIN))
    assert {"PAYMENT_PAGE", "CART_FILLED", "ORDER_PENDING"} <= set(info["tokens"])
    _, reward, terminated, _, _ = env.step(int(A.SUBMIT_PAYMENT))
    assert (reward, terminated) == (10.0, True)


def test_order_expires_after_15_steps_and_checkout_renews_it() -> None:
    env = make_env(start_stage="payment", card_decline_rate=0.0)
    env.reset(seed=0)
    for _ in range(15):
        _, _, _, _, info = env.step(int(A.USE_BACKUP_CARD))
        assert "PAYMENT_PAGE" in info["tokens"]
    _, _, _, _, info = env.step(int(A.SUBMIT_PAYMENT))
    assert "ORDER_EXPIRED" in info["tokens"] and "ORDER_PENDING" not in info["tokens"]
    _, _, _, _, info = act(env, A.CHECKOUT, A.ENTER_PAYMENT, A.SUBMIT_PAYMENT)
    assert "PAYMENT_SUCCESS" in info["tokens"] and "Order #1002" in env.physical._obs["text"]


def test_vip_price_and_tokens() -> None:
    env = make_env(user_tier="vip", start_stage="product_detail", price_factor=1.2, card_decline_rate=0.0)
    obs, info = env.reset(seed=0)
    assert "VIP_USER" in info["tokens"] and decode_features(obs)["is_vip"] == 1.0
    assert decode_features(obs)["price_factor"] == pytest.approx(0.6)
    assert "$108.00" in env.physical._obs["text"] and env.physical.scenario.unit_price == 108.0  # 100 * 1.2 * 0.9
    act(env, A.ADD_TO_CART, A.CHECKOUT, A.ENTER_PAYMENT, A.SUBMIT_PAYMENT)
    assert env.physical._obs["balance"] == pytest.approx(500.0 - 108.0)
    standard = make_env(start_stage="product_detail", price_factor=1.2)
    _, info = standard.reset(seed=0)
    assert "VIP_USER" not in info["tokens"] and "$120.00" in standard.physical._obs["text"]


# ---------------------------------------------------------------- network
def test_packet_loss_times_out_sometimes_and_retry_reissues() -> None:
    env = make_env(
        network="packet_loss_5%", start_stage="product_detail", max_episode_steps=10_000, session_timeout_steps=10_000
    )
    env.reset(seed=7)
    timeouts, retried = 0, 0
    for _ in range(1000):
        before = env.physical._obs["page"]
        _, _, _, _, info = env.step(int(A.VIEW_PRODUCT))
        if "NETWORK_TIMEOUT" in info["tokens"]:
            timeouts += 1
            assert info["applied"] is False and env.physical._obs["page"] == before and info["action_mask"][A.RETRY]
            _, _, _, _, info = env.step(int(A.RETRY))
            if "NETWORK_TIMEOUT" not in info["tokens"]:
                retried += 1
                assert "PRODUCT_VIEWED" in info["tokens"] and not info["action_mask"][A.RETRY]
    assert 25 <= timeouts <= 80 and retried >= timeouts - 10
    assert decode_features(env.step(int(A.VIEW_PRODUCT))[0])["retries_used"] == 1.0  # 0.2 per retry, clipped


def test_latency_advances_simulated_clock_without_sleeping() -> None:
    env = make_env(
        network="latency_500ms", start_stage="product_detail", max_episode_steps=10_000, session_timeout_steps=10_000
    )
    env.reset(seed=11)
    n, timeouts = 2000, 0
    with mock.patch("time.sleep", side_effect=AssertionError("latency is simulated, never slept")):
        for _ in range(n):
            _, _, _, _, info = env.step(int(A.VIEW_PRODUCT))
            timeouts += "NETWORK_TIMEOUT" in info["tokens"]
    sim = info["sim_time_s"]
    assert 0.5 <= sim / n <= 0.65  # ~0.5 s per request (lognormal median 0.5 s; timeouts cost the full 1.0 s)
    assert 0.04 <= timeouts / n <= 0.10  # jitter past the 1.0 s client timeout "sometimes"
    normal = make_env(start_stage="product_detail")
    normal.reset(seed=0)
    assert normal.step(int(A.VIEW_PRODUCT))[4]["sim_time_s"] < CLIENT_TIMEOUT_S / 10


# ---------------------------------------------------------------- adapter
def test_adapter_decisions_are_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    env = make_env()
    with caplog.at_level(logging.DEBUG, logger="agentflow.adapter"):
        env.reset(seed=0)
        env.step(int(A.LOGIN))
    messages = [r.getMessage() for r in caplog.records if r.name == "agentflow.adapter"]
    assert any("family=web_checkout rule=login_page" in m and "LOGGED_OUT" in m for m in messages)
    assert any("rule=signed_in " in m for m in messages)
    assert any("feature_rule=f_cart_items" in m for m in messages)


def _reference_leaf(when: dict[str, Any], raw: dict[str, Any]) -> bool:
    """The leaf semantics written plainly, as an oracle for the compiled closures."""
    if "page" in when:
        return raw["page"] == when["page"]
    if "text_contains" in when:
        return when["text_contains"] in raw["text"]
    if "text_regex" in when:
        return re.search(when["text_regex"], raw["text"]) is not None
    if "selector" in when:
        sel = when["selector"]
        return sel in raw["buttons"] or sel in raw["links"] or sel.lstrip("#") in raw["fields"]
    if "banner" in when:
        return (raw["banner"] or {}).get("kind") == when["banner"]
    value = raw[when["field"]] if when["field"] in raw else raw["data"].get(when["field"])
    return bool({"==": value == when["value"], ">": value > when["value"]}[when["op"]])


def _reference_holds(when: dict[str, Any], raw: dict[str, Any]) -> bool:
    if "all" in when:
        return all(_reference_holds(w, raw) for w in when["all"])
    if "any" in when:
        return any(_reference_holds(w, raw) for w in when["any"])
    if "not" in when:
        return not _reference_holds(when["not"], raw)
    return _reference_leaf(when, raw)


def test_compiled_fast_path_equals_reference_and_base_engine(caplog: pytest.LogCaptureFixture) -> None:
    adapter = WebAdapter(MAPPING, vocabulary=CHECKOUT)
    env, rng = (
        WebCheckoutEnv(Scenario(network="packet_loss_5%", card_decline_rate=0.5, balance=150.0), "w"),
        np.random.default_rng(0),
    )
    raws = [raw for raw, _ in web_checkout.RAW_STATES]
    raw, _ = env.reset(seed=0)
    for _ in range(300):
        mask = adapter.action_mask(raw)
        result = env.step(adapter.adapt_action(int(rng.choice(np.flatnonzero(mask)))))
        raws.append(raw := result.obs)
        if result.terminated or result.truncated:
            raw, _ = env.reset(seed=int(rng.integers(1000)))
    for raw in raws:
        fast = adapter.adapt_observation(raw, {"step_fraction": 0.5})
        expected = {t for r in MAPPING["token_rules"] if _reference_holds(r["when"], raw) for t in r["emit"]}
        assert fast.tokens == expected
        with caplog.at_level(logging.DEBUG, logger="agentflow.adapter"):
            logged = adapter.adapt_observation(raw, {"step_fraction": 0.5})
        assert logged == fast
        base_mask = BaseSemanticAdapter.action_mask(adapter, raw)
        assert np.array_equal(adapter.action_mask(raw), base_mask)


@pytest.mark.parametrize(
    ("when", "path"),
    [
        ({"page": "cart", "text_contains": "x"}, "$.token_rules[0].when"),
        ({"css": "#x"}, "$.token_rules[0].when"),
        ({"field": "cart_count", "op": "~", "value": 0}, "$.token_rules[0].when.op"),
        ({"all": [{"page": "cart"}, {"text_regex": "("}]}, "$.token_rules[0].when.all[1].text_regex"),
    ],
)
def test_bad_conditions_fail_at_load_with_json_path(when: dict[str, Any], path: str) -> None:
    bad = {**MAPPING, "token_rules": [{"id": "bad", "when": when, "emit": ["LOGGED_IN"]}]}
    with pytest.raises(MappingError) as err:
        WebAdapter(bad, "bad.json", vocabulary=CHECKOUT)
    assert err.value.json_path == path


def test_extract_and_available_read_the_page() -> None:
    adapter = WebAdapter(MAPPING, vocabulary=CHECKOUT)
    raw = dict(web_checkout.RAW_STATES[0][0])
    assert adapter.extract("cart_count", raw) == 0.0 and adapter.extract("balance", raw) == 500.0
    assert adapter.extract("user_logged_in", raw) == 0.0 and adapter.extract("no_such_value", raw) is None
    assert adapter.extract("username", raw) is None  # a non-numeric form field
    assert adapter.available({"type": "submit", "form": "login"}, raw)
    assert not adapter.available({"type": "click", "target": "#pay-now"}, raw)
    assert adapter.available({"type": "navigate", "url": "/cart"}, raw)
    assert adapter.match({"selector": "#username"}, raw) and adapter.match({"banner": "none"}, raw)
