"""from-openapi: an OpenAPI 3 spec -> env config + api mapping that validates and drives the real env."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflow_core.adapters.api import APISchemaAdapter
from agentflow_core.adapters.audit import audit_mapping
from agentflow_core.adapters.openapi import generate_from_openapi
from agentflow_core.adapters.schema import validate_mapping
from agentflow_core.envs.base import Scenario
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.payment_api import RAW_STATES, PaymentAPIEnv
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import MappingError
from agentflow_core.registry import load_entry
from agentflow_core.semantics import ACTIONS, CHECKOUT

ROOT = Path(__file__).resolve().parents[1]
SPEC: dict[str, Any] = yaml.safe_load((ROOT / "tests/data/shop_openapi.yaml").read_text())
HAND = APISchemaAdapter(
    json.loads((ROOT / "agentflow_core/mappings/payment_api_v1.json").read_text()), vocabulary=CHECKOUT
)


@pytest.fixture(scope="module")
def generated() -> tuple[dict[str, Any], dict[str, Any]]:
    return generate_from_openapi(SPEC, "shop_api", process="checkout", vocabulary=CHECKOUT)


def _expert_success(env: SemanticEnv, episodes: int) -> float:
    expert, wins = expert_for("payment_api"), 0
    for episode in range(episodes):
        obs, info = env.reset(seed=episode)
        terminated = truncated = False
        while not (terminated or truncated):
            obs, _, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
        wins += "PAYMENT_SUCCESS" in info["tokens"]
    return wins / episodes


def test_config_has_the_registry_shape(generated: tuple[dict[str, Any], dict[str, Any]]) -> None:
    config, mapping = generated
    assert set(config) == {"env_id", "process", "description", "class_path", "adapter", "mapping", "params"}
    assert config["env_id"] == "shop_api_v1" and config["adapter"] == "api" and config["mapping"] == "shop_api_v1.json"
    assert config["class_path"] == "agentflow_core.envs.payment_api:PaymentAPIEnv"
    assert Scenario.from_dict(config["params"]) == Scenario()
    assert (mapping["family"], mapping["template"], mapping["version"]) == ("shop_api", "api", 1)


def test_generated_mapping_validates_and_maps_every_action(generated: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, mapping = generated
    assert validate_mapping(mapping, "<generated>", expected_template="api", vocabulary=CHECKOUT) == mapping
    APISchemaAdapter(mapping, vocabulary=CHECKOUT)  # per-rule condition schema
    assert list(mapping["actions"]) == list(ACTIONS)
    actions = mapping["actions"]
    assert actions["LOGIN"] == {
        "type": "http",
        "method": "POST",
        "path": "/session",
        "body": {"username": "demo", "password": "demo"},
    }
    assert (actions["ENTER_PAYMENT"]["method"], actions["SUBMIT_PAYMENT"]["method"]) == ("GET", "POST")
    assert actions["TOP_UP_FUNDS"]["path"] == "/payment/topup" and actions["USE_BACKUP_CARD"]["body"] == {
        "card": "backup"
    }
    assert actions["ADD_TO_CART"]["body"] == {"quantity": 1} and actions["REMOVE_FROM_CART"]["method"] == "DELETE"
    assert actions["RETRY"] == {"type": "retry"}


def test_status_codes_and_enums_become_tokens(generated: tuple[dict[str, Any], dict[str, Any]]) -> None:
    _, mapping = generated
    by_when = {json.dumps(r["when"], sort_keys=True): r["emit"] for r in mapping["token_rules"]}
    assert by_when['{"status": 402}'] == ["INSUFFICIENT_FUNDS"] and by_when['{"status": 401}'] == ["LOGGED_OUT"]
    assert by_when['{"status_range": [500, 599]}'] == ["SERVER_ERROR"]
    assert by_when['{"equals": "paid", "json_path": "$.order.status"}'] == ["PAYMENT_SUCCESS"]
    assert by_when['{"equals": "expired", "json_path": "$.order.status"}'] == ["ORDER_EXPIRED"]
    assert by_when['{"equals": "cancelled", "json_path": "$.order.status"}'] == ["ORDER_CANCELLED"]
    assert "SESSION_EXPIRED" in by_when['{"equals": "expired", "json_path": "$.session.status"}']
    features = {r["feature"]: r for r in mapping["feature_rules"]}
    assert features["cart_items"]["scale"] == pytest.approx(0.2) and features["price_factor"]["scale"] == pytest.approx(
        0.005
    )
    assert (
        features["balance_ratio"]["scale"] == pytest.approx(0.5)
        and features["retries_used"]["source"] == "@.client.retries"
    )


def test_generated_mapping_reads_every_raw_state_like_the_hand_mapping(
    generated: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, mapping = generated
    adapter = APISchemaAdapter(mapping, vocabulary=CHECKOUT)
    assert audit_mapping(adapter, RAW_STATES, "shop_api_v1.json") == []
    for raw, intended in RAW_STATES:
        assert adapter.adapt_observation(raw) == HAND.adapt_observation(raw), intended


def test_expert_reaches_payment_success_with_the_generated_mapping(
    generated: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    _, mapping = generated
    env = SemanticEnv(PaymentAPIEnv(Scenario(), "shop_api_v1_test"), APISchemaAdapter(mapping, vocabulary=CHECKOUT))
    rate = _expert_success(env, 20)
    env.close()
    assert rate >= 0.9


def test_written_files_load_through_the_registry(
    tmp_path: Path, generated: tuple[dict[str, Any], dict[str, Any]]
) -> None:
    config, mapping = generated
    (tmp_path / config["mapping"]).write_text(json.dumps(mapping))
    config_file = tmp_path / f"{config['env_id']}.yaml"
    config_file.write_text(yaml.safe_dump(config))
    entry = load_entry(config_file, yaml.safe_load)
    env = entry.make({"user_tier": "vip"}, suffix="openapi")
    rate = _expert_success(env, 5)
    env.close()
    assert entry.family == "shop_api" and rate == 1.0


def test_extension_overrides_and_context() -> None:
    spec = {
        "openapi": "3.1.0",
        "info": {"title": "tiny"},
        "paths": {
            "/v2/purchase": {
                "post": {
                    "operationId": "doIt",
                    "x-agentflow-action": "SUBMIT_PAYMENT",
                    "responses": {
                        "200": {
                            "description": "ok",
                            "content": {
                                "application/json": {
                                    "schema": {
                                        "type": "object",
                                        "properties": {
                                            "receipt": {
                                                "type": "object",
                                                "properties": {
                                                    "state": {
                                                        "type": "string",
                                                        "enum": ["done", "nope"],
                                                        "x-agentflow-tokens": {"done": ["PAYMENT_SUCCESS"]},
                                                    },
                                                    "wallet_share": {
                                                        "type": "number",
                                                        "x-agentflow-feature": "balance_ratio",
                                                    },
                                                },
                                            },
                                            "order": {
                                                "type": "object",
                                                "properties": {"state": {"type": "string", "enum": ["expired"]}},
                                            },
                                        },
                                    }
                                }
                            },
                        }
                    },
                }
            },
            "/auth/login": {"post": {"operationId": "login", "responses": {"503": {"description": "down"}}}},
        },
    }
    config, mapping = generate_from_openapi(spec, "tiny_api", version=2, process="checkout", vocabulary=CHECKOUT)
    assert config["env_id"] == "tiny_api_v2" and mapping["version"] == 2
    assert mapping["actions"]["SUBMIT_PAYMENT"] == {
        "type": "http",
        "method": "POST",
        "path": "/v2/purchase",
        "body": {},
    }
    assert mapping["actions"]["LOGIN"]["path"] == "/auth/login"
    emits = {r["when"].get("json_path", str(r["when"])): r["emit"] for r in mapping["token_rules"]}
    assert emits["$.receipt.state"] == ["PAYMENT_SUCCESS"] and emits["$.order.state"] == ["ORDER_EXPIRED"]
    assert emits[str({"status_range": [500, 599]})] == ["SERVER_ERROR"]
    assert {"feature": "balance_ratio", "source": "$.receipt.wallet_share"}.items() <= mapping["feature_rules"][
        0
    ].items()


def test_rejects_bad_input() -> None:
    with pytest.raises(MappingError, match="family"):
        generate_from_openapi(SPEC, "Shop-API", process="checkout", vocabulary=CHECKOUT)
    with pytest.raises(MappingError, match="OpenAPI 3"):
        generate_from_openapi({"swagger": "2.0"}, "shop_api", process="checkout", vocabulary=CHECKOUT)
    bad = copy.deepcopy(SPEC)
    bad["components"]["schemas"]["Order"]["properties"]["status"]["x-agentflow-tokens"] = {"paid": ["NOT_A_TOKEN"]}
    with pytest.raises(MappingError, match="token_rules"):
        generate_from_openapi(bad, "shop_api", process="checkout", vocabulary=CHECKOUT)
