"""The SQL channel: contract, business rules, transaction isolation, DB failures, the db adapter."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from sqlalchemy import create_engine

from agentflow_core.adapters.db import DBAdapter
from agentflow_core.envs.base import PhysicalEnv, Scenario
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.order_db import (
    FAMILY,
    RAW_STATES,
    VERSION,
    OrderDBEnv,
    dump_tables,
)
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import MappingError
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, TOKENS, SemanticAction

MAPPING_PATH = Path(__file__).resolve().parents[1] / "agentflow_core" / "mappings" / "order_db_v1.json"
A = SemanticAction


@pytest.fixture(scope="module")
def mapping() -> dict[str, Any]:
    return json.loads(MAPPING_PATH.read_text())


@pytest.fixture(scope="module")
def adapter(mapping: dict[str, Any]) -> DBAdapter:
    return DBAdapter(mapping, str(MAPPING_PATH), vocabulary=CHECKOUT)


def sql(op: str) -> dict[str, str]:
    return {"type": "sql", "op": op}


def make(**params: Any) -> OrderDBEnv:
    return OrderDBEnv(Scenario(**{"card_decline_rate": 0.0, **params}), "order_db_v1_test")


def run(env: OrderDBEnv, *ops: str) -> list[Any]:
    return [env.step(sql(op)) for op in ops]


def funnel_to_payment(env: OrderDBEnv) -> None:
    results = run(env, "login", "view_product", "add_cart_item", "create_order", "open_payment")
    assert all(r.info["applied"] for r in results)


def semantic_episode(env: SemanticEnv, seed: int) -> tuple[float, dict[str, Any]]:
    expert = expert_for(FAMILY)
    obs, info = env.reset(seed=seed)
    episode_return = 0.0
    while True:
        obs, reward, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
        episode_return += reward
        if terminated or truncated:
            return episode_return, info


# ------------------------------------------------------------------------------------ contract
def test_physical_contract_and_check_env(adapter: DBAdapter) -> None:
    physical = OrderDBEnv(Scenario(), "order_db_v1_contract")
    assert isinstance(physical, PhysicalEnv) and (physical.family, physical.version) == ("order_db", 1)
    assert (FAMILY, VERSION) == ("order_db", 1)
    env = SemanticEnv(physical, adapter)
    check_env(env, skip_render_check=True)
    _, info = env.reset(seed=3)
    assert {"env_id", "step_id", "failure_reason"} <= set(info) and info["env_id"] == "order_db_v1_contract"
    _, _, _, _, info = env.step(int(A.LOGIN))
    assert (info["step_id"], info["failure_reason"], info["tokens"]) == (1, None, ["CART_EMPTY", "LOGGED_IN"])
    env.close()


def test_expert_reaches_payment_success_in_normal_variant(adapter: DBAdapter) -> None:
    env = SemanticEnv(OrderDBEnv(Scenario(), "order_db_v1_expert"), adapter)
    outcomes = [semantic_episode(env, seed) for seed in range(50)]
    successes = sum("PAYMENT_SUCCESS" in info["tokens"] for _, info in outcomes)
    assert successes / 50 >= 0.9
    assert all(ret > 9.8 for ret, info in outcomes if "PAYMENT_SUCCESS" in info["tokens"])
    env.close()


@pytest.mark.parametrize(
    ("params", "expected_reason", "min_return"),
    [
        ({"network": "packet_loss_5%"}, None, 9.5),
        ({"network": "latency_500ms"}, None, 9.5),
        ({"balance": 30.0}, None, 9.5),
        ({"card_decline_rate": 1.0}, None, 9.5),
        ({"start_stage": "payment", "user_tier": "vip"}, None, 9.9),
        ({"user_tier": "blocked"}, "user_blocked", 0.9),
    ],
)
def test_expert_recovers_across_variants(
    adapter: DBAdapter, params: dict[str, Any], expected_reason: str | None, min_return: float
) -> None:
    env = SemanticEnv(OrderDBEnv(Scenario(**params), "order_db_v1_variant"), adapter)
    for seed in range(10):
        episode_return, info = semantic_episode(env, seed)
        assert info["failure_reason"] == expected_reason
        assert episode_return >= min_return
    env.close()


# ------------------------------------------------------------------------------------ business rules
def test_happy_path_rows_and_rewards() -> None:
    env = make()
    raw, info = env.reset(seed=0)
    assert raw["session"]["status"] is None and raw["cart"]["items"] == 0 and info["step_id"] == 0
    funnel_to_payment(env)
    result = env.step(sql("charge"))
    assert result.terminated and not result.truncated and result.reward == pytest.approx(10.0)
    assert result.obs["payment"] == {"status": "captured", "code": "00", "card": "primary", "open": 0, "attempts": 1}
    assert result.obs["order"]["status"] == "paid" and result.obs["order"]["total"] == 100.0
    assert result.obs["user"]["balance"] == 400.0 and result.obs["cart"]["items"] == 0
    assert result.info["failure_reason"] is None
    env.close()


def test_vip_price_and_discount() -> None:
    env = make(user_tier="vip", price_factor=1.5)
    env.reset(seed=0)
    funnel_to_payment(env)
    obs = env.step(sql("charge")).obs
    assert obs["user"]["tier"] == "vip" and obs["user"]["vip"] == 1
    assert obs["order"]["total"] == pytest.approx(Scenario(user_tier="vip", price_factor=1.5).unit_price) == 135.0
    env.close()


def test_blocked_user_escalation_is_correct_and_other_escalation_wrong() -> None:
    env = make(user_tier="blocked")
    env.reset(seed=0)
    obs = env.step(sql("login")).obs
    assert obs["user"]["status"] == "blocked" and obs["session"]["status"] is None
    result = env.step(sql("escalate"))
    assert result.terminated and result.reward == pytest.approx(1.0) and result.info["failure_reason"] == "user_blocked"
    assert result.obs["ticket"]["reason"] == "user_blocked"
    env.close()
    env = make()
    env.reset(seed=0)
    result = env.step(sql("escalate"))
    assert result.terminated and result.reward == pytest.approx(-1.0) and result.info["failure_reason"] == "escalated"
    env.close()


def test_out_of_stock_is_a_check_constraint_and_next_product_is_in_stock() -> None:
    env = make(inventory=0)
    env.reset(seed=0)
    run(env, "login")
    assert env.step(sql("view_product")).obs["product"]["stock"] == 0
    result = env.step(sql("add_cart_item"))
    assert result.obs["error"]["kind"] == "constraint"
    assert result.obs["error"]["constraint"] == "ck_inventory_stock_nonneg"
    assert result.info["failure_reason"] == "constraint_violation" and not result.terminated
    assert result.reward == pytest.approx(-0.05) and result.obs["cart"]["items"] == 0
    assert env.step(sql("view_product")).obs["product"]["stock"] == 20
    result = env.step(sql("add_cart_item"))
    assert (
        result.obs["cart"]["items"] == 1
        and result.obs["product"]["stock"] == 19
        and result.obs["error"]["kind"] is None
    )
    env.close()


def test_cart_removal_restores_stock_and_checkout_constraints() -> None:
    env = make(inventory=5)
    env.reset(seed=0)
    run(env, "login", "view_product", "add_cart_item", "add_cart_item")
    result = env.step(sql("remove_cart_items"))
    assert result.obs["cart"]["items"] == 0 and result.obs["product"]["stock"] == 5
    empty = env.step(sql("create_order"))
    assert (empty.obs["error"]["constraint"], empty.reward) == ("ck_orders_total_positive", pytest.approx(-0.05))
    run(env, "add_cart_item", "create_order")
    second = env.step(sql("create_order"))
    assert second.obs["error"]["constraint"] == "uq_orders_one_pending" and second.obs["order"]["status"] == "pending"
    env.close()


def test_declined_card_then_backup_card() -> None:
    env = make(card_decline_rate=1.0)
    env.reset(seed=0)
    funnel_to_payment(env)
    declined = env.step(sql("charge")).obs
    assert (declined["payment"]["status"], declined["payment"]["code"]) == ("declined", "05")
    switched = env.step(sql("switch_card")).obs
    assert switched["payment"] == {"status": "initiated", "code": None, "card": "backup", "open": 1, "attempts": 2}
    assert env.step(sql("charge")).obs["payment"]["status"] == "captured"
    env.close()


def test_insufficient_funds_then_top_up() -> None:
    env = make(balance=30.0)
    env.reset(seed=0)
    funnel_to_payment(env)
    nsf = env.step(sql("charge"))
    assert nsf.obs["payment"]["status"] == "insufficient_funds" and nsf.obs["user"]["balance"] == 30.0
    assert not nsf.terminated
    topped = env.step(sql("top_up")).obs
    assert topped["topup"]["amount"] == 100.0 and topped["user"]["balance"] == 130.0
    assert topped["payment"]["status"] == "initiated"
    paid = env.step(sql("charge"))
    assert paid.terminated and paid.obs["user"]["balance"] == 30.0
    env.close()


def test_session_expiry_keeps_cart_and_login_restores() -> None:
    env = make(session_timeout_steps=3)
    env.reset(seed=0)
    run(env, "login", "view_product", "add_cart_item")  # session created at step 1
    at_timeout, past_timeout = (r.obs for r in run(env, "refresh", "refresh"))  # ages 3 and 4
    assert at_timeout["session"]["status"] == "active"
    assert past_timeout["session"]["status"] == "expired" and past_timeout["cart"]["items"] == 1
    blocked = env.step(sql("create_order"))
    assert not blocked.info["applied"] and blocked.reward == pytest.approx(-0.05)
    obs = env.step(sql("login")).obs
    assert obs["session"]["status"] == "active" and obs["cart"]["items"] == 1
    assert env.step(sql("create_order")).obs["order"]["status"] == "pending"
    env.close()


def test_pending_order_expires_after_15_steps_and_checkout_again() -> None:
    env = make()
    env.reset(seed=0)
    run(env, "login", "view_product", "add_cart_item", "create_order")
    first_id = env.step(sql("refresh")).obs["order"]["id"]
    results = run(env, *["refresh"] * 15)  # created at step 4: pending at age 15, expired at 16
    assert results[-2].obs["order"]["status"] == "pending" and results[-1].obs["order"]["status"] == "expired"
    again = env.step(sql("create_order")).obs["order"]
    assert again["status"] == "pending" and again["id"] != first_id
    env.close()


def test_cancel_order_terminates_with_penalty() -> None:
    env = make()
    env.reset(seed=0)
    assert env.step(sql("cancel_order")).reward == pytest.approx(-0.05)
    run(env, "login", "view_product", "add_cart_item", "create_order")
    result = env.step(sql("cancel_order"))
    assert result.terminated and result.reward == pytest.approx(-2.0)
    assert result.info["failure_reason"] == "order_cancelled" and result.obs["order"]["status"] == "cancelled"
    env.close()


def test_truncation_and_inapplicable_actions() -> None:
    env = make(max_episode_steps=3)
    env.reset(seed=0)
    first, second, third = run(env, "charge", "top_up", "login")
    assert first.reward == second.reward == pytest.approx(-0.05) and not first.info["applied"]
    assert third.truncated and not third.terminated and third.info["failure_reason"] == "max_steps"
    env.close()


@pytest.mark.parametrize("stage", ["login", "product_detail", "checkout", "payment"])
def test_start_stages(stage: str) -> None:
    env = make(start_stage=stage, inventory=0)
    raw, _ = env.reset(seed=0)
    expected = {
        "login": (None, 0, None, None),
        "product_detail": ("active", 0, None, None),
        "checkout": ("active", 1, None, None),
        "payment": ("active", 1, "pending", "initiated"),
    }[stage]
    assert (
        raw["session"]["status"],
        raw["cart"]["items"],
        raw["order"]["status"],
        raw["payment"]["status"],
    ) == expected
    env.close()


def test_packet_loss_drops_statements_and_retry_reissues() -> None:
    env = make(network="packet_loss_5%", max_episode_steps=1000)
    env.reset(seed=1)
    kinds = Counter(env.step(sql("refresh")).obs["error"]["kind"] for _ in range(600))
    assert 0.025 < kinds["network_timeout"] / 600 < 0.08 and set(kinds) == {None, "network_timeout"}
    # A dropped LOGIN is not applied; RETRY re-issues it.
    for seed in range(200):
        env.reset(seed=seed)
        result = env.step(sql("login"))
        if result.obs["error"]["kind"] == "network_timeout":
            break
    else:
        pytest.fail("no dropped first statement in 200 episodes at 5% loss")
    assert not result.info["applied"] and result.info["failure_reason"] == "network_timeout"
    assert result.obs["session"]["status"] is None
    retried = env.step(sql("retry"))
    while retried.info["failure_reason"] == "network_timeout":
        retried = env.step(sql("retry"))
    assert retried.info["op"] == "login" and retried.info["applied"] and retried.obs["session"]["status"] == "active"
    assert retried.obs["client"]["retries"] >= 1
    assert env.step(sql("retry")).reward == pytest.approx(-0.05)  # nothing owed any more
    env.close()


def test_latency_advances_simulated_clock_and_sometimes_times_out() -> None:
    env = make(network="latency_500ms", max_episode_steps=1000)
    env.reset(seed=0)
    results = [env.step(sql("refresh")) for _ in range(500)]
    timeouts = sum(r.obs["error"]["kind"] == "query_timeout" for r in results)
    assert 0.01 < timeouts / 500 < 0.08
    deltas = np.diff([0.0] + [r.info["sim_time_s"] for r in results])
    assert deltas.min() >= 0.5 and deltas.max() == pytest.approx(1.0) and 0.6 < deltas.mean() < 0.7
    env.close()


# ------------------------------------------------------------------------------------ isolation / DB failures
def test_rolled_back_episodes_leave_database_byte_identical(tmp_path: Path, adapter: DBAdapter) -> None:
    path = tmp_path / "orders.db"
    scenario = Scenario(
        start_stage="payment",
        max_episode_steps=12,
        card_decline_rate=0.3,
        balance=150.0,
        network="packet_loss_5%",
        session_timeout_steps=5,
    )
    env = SemanticEnv(OrderDBEnv(scenario, "order_db_v1_iso", url=f"sqlite:///{path}"), adapter)
    reader = create_engine(f"sqlite:///{path}")
    with reader.connect() as conn:
        before = dump_tables(conn)
    file_hash = hashlib.sha256(path.read_bytes()).hexdigest()
    rng = np.random.default_rng(0)
    ops: Counter[str] = Counter()
    for episode in range(1000):
        _, info = env.reset(seed=episode)
        while True:
            legal = np.flatnonzero(info["action_mask"])
            action = int(rng.choice(legal)) if rng.random() < 0.5 else int(rng.integers(N_ACTIONS))
            _, _, terminated, truncated, info = env.step(action)
            ops[f"{info['op']}:{info['applied']}"] += 1
            if terminated or truncated:
                break
    with reader.connect() as conn:
        after = dump_tables(conn)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == file_hash
    env.close()
    with reader.connect() as conn:
        closed = dump_tables(conn)
    reader.dispose()
    assert after == before and before["users"] and before["orders"] == []
    assert closed["users"] == [] and closed["products"] == []  # close() removes the env's own rows
    assert ops["charge:True"] > 100 and ops["add_cart_item:True"] > 100 and ops["create_order:False"] > 100


def test_lock_timeout_is_an_error_row_not_an_exception(tmp_path: Path, adapter: DBAdapter) -> None:
    path = tmp_path / "locked.db"
    env = SemanticEnv(OrderDBEnv(Scenario(), "order_db_v1_lock", url=f"sqlite:///{path}?timeout=0.05"), adapter)
    env.reset(seed=0)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a second writer holds the write lock
    _, reward, terminated, _, info = env.step(int(A.LOGIN))
    assert info["failure_reason"] == "lock_timeout" and "SERVER_ERROR" in info["tokens"]
    assert info["error"]["kind"] == "lock_timeout" and "database is locked" in info["error"]["message"]
    assert not terminated and reward == pytest.approx(-0.01) and info["action_mask"][A.RETRY]
    other.execute("ROLLBACK")
    other.close()
    _, _, _, _, info = env.step(int(A.RETRY))
    assert info["failure_reason"] is None and "LOGGED_IN" in info["tokens"]
    env.close()


def test_hostile_identifiers_are_bound_parameters() -> None:
    env = OrderDBEnv(Scenario(), "x'); DROP TABLE users; --")
    env.reset(seed=0)
    funnel_to_payment(env)
    assert env.step(sql("charge")).terminated
    env.close()


def test_determinism_for_a_seed() -> None:
    scenario = Scenario(network="packet_loss_5%", card_decline_rate=0.5, balance=120.0, max_episode_steps=40)

    def trajectory() -> list[Any]:
        env = OrderDBEnv(scenario, "order_db_v1_det")
        out: list[Any] = [env.reset(seed=7)[0]]
        rng = np.random.default_rng(11)
        for _ in range(40):
            result = env.step(
                sql(
                    str(
                        rng.choice(
                            [
                                "login",
                                "view_product",
                                "add_cart_item",
                                "create_order",
                                "open_payment",
                                "charge",
                                "switch_card",
                                "top_up",
                                "retry",
                            ]
                        )
                    )
                )
            )
            out.append((result.obs, result.reward, result.terminated, result.truncated, result.info))
            if result.done:
                break
        env.close()
        return out

    assert trajectory() == trajectory()


def test_unknown_native_action_is_a_programming_error() -> None:
    env = make()
    env.reset(seed=0)
    with pytest.raises(ValueError, match="native action"):
        env.step({"type": "sql", "op": "DROP TABLE users"})
    env.close()


# ------------------------------------------------------------------------------------ adapter / mapping
def test_raw_states_map_to_their_intended_tokens(adapter: DBAdapter) -> None:
    for raw, token in RAW_STATES:
        assert token in adapter.adapt_observation(raw).tokens, (token, raw)
    assert {token for _, token in RAW_STATES} <= adapter.producible_tokens() <= set(TOKENS)
    # No collapse: states meaning different business tokens yield different token sets.
    by_tokens: dict[frozenset[str], set[str]] = {}
    for raw, token in RAW_STATES:
        by_tokens.setdefault(adapter.adapt_observation(raw).tokens, set()).add(token)
    for produced, intended in by_tokens.items():
        assert intended <= produced


def test_mapping_maps_every_action_to_a_sql_op(mapping: dict[str, Any], adapter: DBAdapter) -> None:
    assert set(mapping["actions"]) == {a.name for a in SemanticAction}
    for action in SemanticAction:
        native = adapter.adapt_action(int(action))
        assert native["type"] == "sql" and "requires" not in native


def test_features_are_read_from_columns(adapter: DBAdapter) -> None:
    env = SemanticEnv(
        OrderDBEnv(Scenario(user_tier="vip", start_stage="payment", balance=45.0), "order_db_v1_feat"), adapter
    )
    env.reset(seed=0)
    features = env.last_obs.features if env.last_obs else {}
    assert features["user_logged_in"] == 1.0 and features["is_vip"] == 1.0 and features["payment_page_loaded"] == 1.0
    assert features["cart_items"] == pytest.approx(0.2) and features["price_factor"] == pytest.approx(0.5)
    # balance 45 against a pending order of 90 (VIP price): ratio 0.5, scaled by 0.5
    assert features["balance_ratio"] == pytest.approx(0.25) and features["retries_used"] == 0.0
    env.close()


@pytest.mark.parametrize(
    ("leaf", "json_path"),
    [
        ({"column": "order.status", "equals": "pending", "in": ["paid"]}, "$.token_rules[0].when"),
        ({"column": "order.status", "equal": "pending"}, "$.token_rules[0].when"),
        ({"column": "Order Status", "equals": "pending"}, "$.token_rules[0].when.column"),
        ({"column": "cart.items", "op": "~", "value": 0}, "$.token_rules[0].when.op"),
    ],
)
def test_when_schema_rejects_bad_leaves(mapping: dict[str, Any], leaf: dict[str, Any], json_path: str) -> None:
    bad = dict(mapping, token_rules=[{"id": "bad", "when": leaf, "emit": ["ORDER_PENDING"]}])
    with pytest.raises(MappingError) as err:
        DBAdapter(bad, "bad.json", vocabulary=CHECKOUT)
    assert err.value.json_path == json_path


def test_leaf_predicates(adapter: DBAdapter) -> None:
    raw = {"order": {"status": "pending"}, "cart": {"items": 2}, "error": {"kind": None}, "flag": True}
    assert adapter.match({"column": "order.status", "equals": "pending"}, raw)
    assert adapter.match({"column": "order.status", "in": ["paid", "pending"]}, raw)
    assert adapter.match({"column": "cart.items", "op": ">", "value": 1}, raw)
    assert not adapter.match({"column": "cart.items", "op": "<", "value": 1}, raw)
    assert adapter.match({"column": "error.kind", "is_null": True}, raw)
    assert adapter.match({"column": "missing.column", "is_null": True}, raw)
    assert not adapter.match({"column": "order.status", "op": ">", "value": 0}, raw)
    assert adapter.extract("cart.items", raw) == 2.0 and adapter.extract("flag", raw) == 1.0
    assert adapter.extract("order.status", raw) is None and adapter.extract("nope.x", raw) is None


@pytest.mark.parametrize("dialect_name", ["sqlite", "postgresql"])
def test_statements_compile_once_ahead_for_each_dialect(dialect_name: str) -> None:
    """The hot path runs SQL compiled ahead, without parameter values: every statement must compile so,
    bind every placeholder it renders, and (INSERT) report its new key the dialect's way."""
    import re

    from sqlalchemy.dialects import postgresql, sqlite
    from sqlalchemy.sql.expression import ClauseElement

    from agentflow_core.envs.order_db import fixtures
    from agentflow_core.envs.order_db import statements as sql

    dialect = {"sqlite": sqlite.dialect(), "postgresql": postgresql.dialect()}[dialect_name]
    statements = {
        name: v
        for module in (sql, fixtures)
        for name, v in vars(module).items()
        if name.lstrip("_").isupper() and isinstance(v, ClauseElement)
    }
    assert len(statements) > 25
    for name, statement in statements.items():
        compiled = sql._compile(statement, dialect)
        assert "POSTCOMPILE" not in compiled.sql, name
        if dialect_name == "postgresql":
            assert compiled.names is None and set(re.findall(r"%\((\w+)\)s", compiled.sql)) <= compiled.defaults.keys()
            assert compiled.returns_id == compiled.sql.startswith("INSERT"), name  # RETURNING the new key
        else:
            assert compiled.names is not None and len(compiled.names) == compiled.sql.count("?"), name
            assert set(compiled.names) <= compiled.defaults.keys() and not compiled.returns_id  # lastrowid
    assert sql.ObsRow._fields == tuple(sql.READ_OBS.selected_columns.keys())
