"""PaymentAPIEnv: the business table over real HTTP, faults, determinism, the shared server, the mapping."""

from __future__ import annotations

import json
import socket
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from gymnasium.utils.env_checker import check_env

from agentflow_core.adapters.api import APISchemaAdapter
from agentflow_core.adapters.audit import audit_mapping, errors_only
from agentflow_core.envs import payment_api_server as server_mod
from agentflow_core.envs.base import Scenario
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.payment_api import FAMILY, RAW_STATES, VERSION, PaymentAPIEnv
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.registry import load_entry
from agentflow_core.semantics import CHECKOUT, SemanticAction

A = SemanticAction
ROOT = Path(__file__).resolve().parents[1]
MAPPING = json.loads((ROOT / "agentflow_core/mappings/payment_api_v1.json").read_text())
ADAPTER = APISchemaAdapter(MAPPING, source="payment_api_v1.json", vocabulary=CHECKOUT)


class Driver:
    """Drives a PaymentAPIEnv by semantic action through the real mapping; reads tokens back."""

    def __init__(self, **scenario: Any) -> None:
        self.env = PaymentAPIEnv(Scenario(**scenario), "payment_api_v1_test")

    def reset(self, seed: int = 0) -> set[str]:
        raw, info = self.env.reset(seed=seed)
        assert info["failure_reason"] is None and info["step_id"] == 0
        return set(ADAPTER.adapt_observation(raw).tokens)

    def act(self, action: A) -> tuple[set[str], float, bool, bool, dict[str, Any]]:
        result = self.env.step(ADAPTER.adapt_action(int(action)))
        self.raw = result.obs
        return (
            set(ADAPTER.adapt_observation(result.obs).tokens),
            result.reward,
            result.terminated,
            result.truncated,
            result.info,
        )

    def outcome(self, action: A) -> str:
        """The client outcome of one action's exchange."""
        self.act(action)
        return str(self.raw["client"]["outcome"])

    def close(self) -> None:
        self.env.close()


@pytest.fixture
def drive() -> Any:
    drivers: list[Driver] = []

    def make(**scenario: Any) -> Driver:
        drivers.append(Driver(**scenario))
        return drivers[-1]

    yield make
    for d in drivers:
        d.close()


def _run_expert(env: SemanticEnv, episodes: int, seed0: int = 0) -> tuple[float, list[float]]:
    expert = expert_for(FAMILY)
    successes, returns = 0, []
    for episode in range(episodes):
        obs, info = env.reset(seed=seed0 + episode)
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
            total += reward
            done = terminated or truncated
        successes += "PAYMENT_SUCCESS" in info["tokens"]
        returns.append(total)
    return successes / episodes, returns


def test_family_constants() -> None:
    assert (FAMILY, VERSION, PaymentAPIEnv.family, PaymentAPIEnv.version) == ("payment_api", 1, "payment_api", 1)


def test_check_env_on_the_semantic_env() -> None:
    env = SemanticEnv(PaymentAPIEnv(Scenario(network="packet_loss_5%"), "payment_api_v1_check"), ADAPTER)
    check_env(env, skip_render_check=True)
    env.close()


def test_expert_succeeds_in_the_normal_variant() -> None:
    env = SemanticEnv(PaymentAPIEnv(Scenario(), "payment_api_v1_expert"), ADAPTER)
    rate, returns = _run_expert(env, 50)
    env.close()
    assert rate >= 0.9
    assert min(returns) > 9.8  # LOGIN, VIEW, ADD, CHECKOUT, ENTER, SUBMIT (+ a decline fix) at -0.01 each


@pytest.mark.parametrize("network", ["latency_500ms", "packet_loss_5%"])
def test_expert_recovers_from_network_faults(network: str) -> None:
    env = SemanticEnv(PaymentAPIEnv(Scenario(network=network), "payment_api_v1_faults"), ADAPTER)
    rate, _ = _run_expert(env, 30)
    env.close()
    assert rate >= 0.9


def test_login_funnel_and_rewards(drive: Any) -> None:
    d = drive()
    assert d.reset() == {"LOGGED_OUT"}
    assert d.act(A.ADD_TO_CART)[:2] == ({"LOGGED_OUT"}, -0.05)  # not applicable while logged out
    tokens, reward, terminated, truncated, info = d.act(A.LOGIN)
    assert tokens == {"LOGGED_IN", "CART_EMPTY"} and reward == -0.01 and not (terminated or truncated)
    assert d.act(A.CHECKOUT)[:2] == ({"LOGGED_IN", "CART_EMPTY"}, -0.05)
    assert d.act(A.VIEW_PRODUCT)[0] == {"LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"}
    assert d.act(A.ADD_TO_CART)[0] == {"LOGGED_IN", "CART_FILLED"}
    assert d.act(A.REMOVE_FROM_CART)[0] == {"LOGGED_IN", "CART_EMPTY"}
    d.act(A.VIEW_PRODUCT)
    d.act(A.ADD_TO_CART)
    assert d.act(A.CHECKOUT)[0] == {"LOGGED_IN", "CART_FILLED", "CHECKOUT_STARTED", "ORDER_PENDING"}
    assert d.raw["status_code"] == 201
    assert "PAYMENT_PAGE" in d.act(A.ENTER_PAYMENT)[0]
    assert d.act(A.RETRY)[1] == -0.05  # nothing failed: a harmless replay, but a wasted step
    tokens, reward, terminated, _, info = d.act(A.SUBMIT_PAYMENT)
    if "INVALID_CARD" in tokens:  # 10% decline: fix and pay
        d.act(A.USE_BACKUP_CARD)
        tokens, reward, terminated, _, info = d.act(A.SUBMIT_PAYMENT)
    assert "PAYMENT_SUCCESS" in tokens and reward == 10.0 and terminated and info["failure_reason"] is None


def test_vip_user_gets_the_discount(drive: Any) -> None:
    d = drive(user_tier="vip", start_stage="checkout")
    assert d.reset() == {"LOGGED_IN", "VIP_USER", "CART_FILLED"}
    d.act(A.CHECKOUT)
    assert d.raw["json"]["order"]["total"] == 90.0
    features = ADAPTER.adapt_observation(d.raw).features
    assert features["is_vip"] == 1.0 and features["cart_items"] == pytest.approx(0.2)
    assert features["price_factor"] == pytest.approx(0.5) and features["user_logged_in"] == 1.0


def test_blocked_user_escalation_is_the_right_move(drive: Any) -> None:
    d = drive(user_tier="blocked")
    d.reset()
    assert d.act(A.LOGIN)[:2] == ({"USER_BLOCKED"}, -0.01)
    assert d.act(A.VIEW_PRODUCT)[:2] == ({"USER_BLOCKED"}, -0.05)
    tokens, reward, terminated, _, info = d.act(A.ESCALATE)
    assert tokens == {"ESCALATED"}  # support has the case: ESCALATED supersedes USER_BLOCKED (the process says)
    assert (reward, terminated, info["failure_reason"]) == (1.0, True, "user_blocked")
    assert drive(user_tier="blocked", start_stage="payment").reset() == {"USER_BLOCKED"}


def test_escalating_a_healthy_order_costs(drive: Any) -> None:
    d = drive(start_stage="product_detail")
    d.reset()
    tokens, reward, terminated, _, info = d.act(A.ESCALATE)
    assert "ESCALATED" in tokens and (reward, terminated, info["failure_reason"]) == (-1.0, True, "escalated")


def test_out_of_stock_then_next_product(drive: Any) -> None:
    d = drive(inventory=0)
    d.reset()
    d.act(A.LOGIN)
    assert {"PRODUCT_VIEWED", "OUT_OF_STOCK"} <= d.act(A.VIEW_PRODUCT)[0]
    tokens, reward, *_ = d.act(A.ADD_TO_CART)
    assert "OUT_OF_STOCK" in tokens and reward == -0.05 and d.raw["status_code"] == 409
    tokens = d.act(A.VIEW_PRODUCT)[0]
    assert "PRODUCT_VIEWED" in tokens and "OUT_OF_STOCK" not in tokens
    assert "CART_FILLED" in d.act(A.ADD_TO_CART)[0]


def test_card_decline_then_backup_card(drive: Any) -> None:
    d = drive(start_stage="payment", card_decline_rate=1.0)
    assert "PAYMENT_PAGE" in d.reset()
    tokens, reward, terminated, *_ = d.act(A.SUBMIT_PAYMENT)
    assert "INVALID_CARD" in tokens and "PAYMENT_PAGE" not in tokens and d.raw["status_code"] == 422 and not terminated
    assert "PAYMENT_FAILED" in d.act(A.SUBMIT_PAYMENT)[0]  # the declined card again: generic failure
    assert "PAYMENT_PAGE" in d.act(A.USE_BACKUP_CARD)[0]
    tokens, reward, terminated, *_ = d.act(A.SUBMIT_PAYMENT)
    assert "PAYMENT_SUCCESS" in tokens and reward == 10.0 and terminated


def test_insufficient_funds_then_top_up(drive: Any) -> None:
    d = drive(start_stage="payment", balance=50.0, card_decline_rate=0.0)
    d.reset()
    assert ADAPTER.adapt_observation(d.env.reset(seed=0)[0]).features["balance_ratio"] == pytest.approx(0.25)
    tokens, reward, terminated, *_ = d.act(A.SUBMIT_PAYMENT)
    assert "INSUFFICIENT_FUNDS" in tokens and d.raw["status_code"] == 402 and not terminated
    assert "FUNDS_TOPPED_UP" in d.act(A.TOP_UP_FUNDS)[0]
    assert d.act(A.TOP_UP_FUNDS)[1] == -0.05  # no shortfall left
    assert d.act(A.SUBMIT_PAYMENT)[:3] == ({"LOGGED_IN", "CART_EMPTY", "PAYMENT_SUCCESS"}, 10.0, True)


def test_session_expiry_keeps_cart_and_login_restores(drive: Any) -> None:
    d = drive(start_stage="checkout", session_timeout_steps=3)
    d.reset()
    for _ in range(3):
        assert "LOGGED_IN" in d.act(A.VIEW_PRODUCT)[0]
    tokens, reward, *_ = d.act(A.VIEW_PRODUCT)
    assert tokens == {"SESSION_EXPIRED", "LOGGED_OUT"} and reward == -0.01
    assert d.act(A.LOGIN)[0] == {"LOGGED_IN", "CART_FILLED"}


def test_pending_order_expires_and_checkout_renews(drive: Any) -> None:
    d = drive(start_stage="payment")
    d.reset()
    for _ in range(15):
        assert "ORDER_PENDING" in d.act(A.VIEW_PRODUCT)[0]
    tokens = d.act(A.VIEW_PRODUCT)[0]
    assert "ORDER_EXPIRED" in tokens and "ORDER_PENDING" not in tokens and "ORDER_CANCELLED" not in tokens
    assert "ORDER_EXPIRED" in d.act(A.SUBMIT_PAYMENT)[0] and d.raw["json"]["error"]["code"] == "order_expired"
    assert {"ORDER_PENDING", "CHECKOUT_STARTED"} <= d.act(A.CHECKOUT)[0]
    assert d.raw["json"]["order"]["id"] == "ord-2"


def test_cancel_order_is_terminal_and_distinct_from_expired(drive: Any) -> None:
    d = drive(start_stage="payment")
    d.reset()
    tokens, reward, terminated, _, info = d.act(A.CANCEL_ORDER)
    assert "ORDER_CANCELLED" in tokens and "ORDER_EXPIRED" not in tokens
    assert (reward, terminated, info["failure_reason"]) == (-2.0, True, "order_cancelled")


def test_truncation_at_max_steps(drive: Any) -> None:
    d = drive(max_episode_steps=3)
    d.reset()
    assert d.act(A.VIEW_PRODUCT)[3] is False
    d.act(A.VIEW_PRODUCT)
    _, reward, terminated, truncated, info = d.act(A.VIEW_PRODUCT)
    assert (terminated, truncated, info["failure_reason"], info["step_id"]) == (False, True, "max_steps", 3)


def test_start_stages(drive: Any) -> None:
    assert drive(start_stage="product_detail").reset() == {"LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"}
    assert drive(start_stage="checkout").reset() == {"LOGGED_IN", "CART_FILLED"}
    assert drive(start_stage="payment").reset() == {
        "LOGGED_IN",
        "CART_FILLED",
        "CHECKOUT_STARTED",
        "ORDER_PENDING",
        "PAYMENT_PAGE",
    }


def test_fault_rates_per_network_condition(drive: Any) -> None:
    outcomes: dict[str, Counter[str]] = {}
    for network in ("normal", "packet_loss_5%"):
        d = drive(network=network, start_stage="product_detail", max_episode_steps=10_000, session_timeout_steps=10_000)
        d.reset(seed=3)
        outcomes[network] = Counter(d.outcome(A.LOGIN) for _ in range(1500))
    assert outcomes["normal"] == Counter({"client_error": 1500})  # 409 already logged in, never a fault
    lossy = outcomes["packet_loss_5%"]
    assert 0.03 < lossy["timeout"] / 1500 < 0.07 and 0.015 < lossy["server_error"] / 1500 < 0.045
    slow = drive(
        network="latency_500ms", start_stage="product_detail", max_episode_steps=10_000, session_timeout_steps=10_000
    )
    slow.reset(seed=3)
    latencies = []
    for _ in range(400):
        slow.act(A.LOGIN)
        latencies.append(slow.raw["latency_s"])
    assert 0.48 < float(np.median(latencies)) < 0.52
    assert slow.raw["sim_time_s"] == pytest.approx(400 * 0.25 + sum(latencies), abs=1e-3)


def test_timeout_then_retry_applies_once(drive: Any) -> None:
    d = drive(network="packet_loss_5%", start_stage="product_detail", card_decline_rate=0.0)
    for seed in range(200):  # find a seed whose first ADD_TO_CART attempt is dropped
        d.reset(seed=seed)
        tokens, reward, *_ = d.act(A.ADD_TO_CART)
        if tokens == {"NETWORK_TIMEOUT"}:
            break
    else:
        pytest.fail("no dropped ADD_TO_CART in 200 seeds")
    assert reward == -0.01 and d.raw["status_code"] is None and d.raw["sim_time_s"] >= 1.0
    while "NETWORK_TIMEOUT" in tokens or "SERVER_ERROR" in tokens:
        tokens, reward, *_ = d.act(A.RETRY)
    assert d.raw["json"]["cart"]["items"] == 1 and reward == -0.01


def test_same_seed_same_episode() -> None:
    def rollout(seed: int) -> list[Any]:
        env = PaymentAPIEnv(Scenario(network="packet_loss_5%", card_decline_rate=0.5, start_stage="payment"), "det")
        raw, _ = env.reset(seed=seed)
        rng = np.random.default_rng(99)
        trace = [raw]
        for _ in range(40):
            result = env.step(ADAPTER.adapt_action(int(rng.integers(0, 12))))
            trace.append((result.obs, result.reward, result.terminated))
            if result.terminated:
                env.reset(seed=seed + 1)
        env.close()
        return trace

    assert rollout(5) == rollout(5)
    assert rollout(5) != rollout(6)


def test_one_shared_server_for_many_envs() -> None:
    threads_before = threading.active_count()
    envs = [PaymentAPIEnv(Scenario(), f"payment_api_v1_{i}") for i in range(200)]
    server = envs[0]._server
    assert server is not None and all(e._server is server for e in envs)
    assert server_mod.shared_server_refs() == 200
    for i, env in enumerate(envs):
        env.reset(seed=i)
        env.step(ADAPTER.adapt_action(A.LOGIN))
    assert len(server.state.episodes) == 200
    assert threading.active_count() - threads_before <= 3  # 1 serving thread + 1 keep-alive handler
    for env in envs[:-1]:
        env.close()
    assert server.running and len(server.state.episodes) == 1
    envs[-1].close()
    assert not server.running and server_mod.shared_server_refs() == 0
    host, port = server.url.removeprefix("http://").split(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=0.5):
        pass
    fresh = PaymentAPIEnv(Scenario(), "payment_api_v1_fresh")  # the next env starts a new one
    assert fresh._server is not server and fresh._server is not None and fresh._server.running
    fresh.close()


def test_env_on_an_external_server() -> None:
    server = server_mod.PaymentAPIServer().start()
    env = PaymentAPIEnv(Scenario(start_stage="payment"), "payment_api_v1_ext", server_url=server.url)
    raw, _ = env.reset(seed=0)
    assert raw["status_code"] == 200 and raw["endpoint"] == "/payment"
    env.close()
    assert server.running and not server.state.episodes  # the env deleted its episode, the server is not its own
    server.stop()


def test_mapping_audit_is_clean() -> None:
    findings = audit_mapping(ADAPTER, RAW_STATES, "payment_api_v1.json")
    assert errors_only(findings) == [] and findings == []  # every token producible, nothing collapsed
    readings = {intended: ADAPTER.adapt_observation(raw).tokens for raw, intended in RAW_STATES}
    assert "ORDER_EXPIRED" not in readings["ORDER_CANCELLED"] and "ORDER_CANCELLED" not in readings["ORDER_EXPIRED"]


def _signature(raw: dict[str, Any]) -> set[tuple[str, Any]]:
    body = raw["json"] or {}
    sig = {("status_code", raw["status_code"]), ("outcome", raw["client"]["outcome"])}
    for part in ("session", "cart", "order", "payment", "product", "escalation"):
        value = body.get(part)
        sig.add((part, value.get("status") if isinstance(value, dict) else value))
    return sig


def test_raw_states_cover_what_the_channel_produces() -> None:
    known = set().union(*(_signature(raw) for raw, _ in RAW_STATES))
    seen: set[tuple[str, Any]] = set()
    rng = np.random.default_rng(0)
    scenarios = [
        Scenario(
            network=n,
            user_tier=t,
            start_stage=s,
            inventory=i,
            balance=b,
            card_decline_rate=0.5,
            session_timeout_steps=8,
        )
        for n, t, s, i, b in [
            ("packet_loss_5%", "standard", "login", 0, 50.0),
            ("packet_loss_5%", "vip", "payment", 5, 500.0),
            ("latency_500ms", "blocked", "login", 20, 500.0),
            ("packet_loss_5%", "standard", "checkout", 20, 20.0),
        ]
    ]
    for k, scenario in enumerate(scenarios):
        env = PaymentAPIEnv(scenario, f"cover_{k}")
        seen |= _signature(env.reset(seed=k)[0])
        for _ in range(600):
            result = env.step(ADAPTER.adapt_action(int(rng.integers(0, 12))))
            seen |= _signature(result.obs)
            if result.terminated or result.truncated:
                seen |= _signature(env.reset(seed=int(rng.integers(1000)))[0])
        env.close()
    assert seen <= known, f"raw states missing from RAW_STATES: {sorted(seen - known, key=str)}"
    assert ("outcome", "timeout") in seen and ("status_code", 503) in seen and ("order", "expired") in seen


def test_registry_builds_the_env_from_its_config() -> None:
    entry = load_entry(ROOT / "configs/envs/payment_api_v1.yaml", yaml.safe_load)
    env = entry.make(suffix="registry")
    rate, _ = _run_expert(env, 5)
    env.close()
    assert entry.family == FAMILY and rate == 1.0


def test_unknown_native_action_wastes_a_step_without_changing_state(drive: Any) -> None:
    d = drive(start_stage="checkout")
    d.reset()
    before = d.env.step(ADAPTER.adapt_action(A.VIEW_PRODUCT)).obs
    result = d.env.step({"type": "noop"})
    assert result.obs == before and result.reward == -0.05 and not result.terminated
