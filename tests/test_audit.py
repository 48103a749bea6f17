"""Mapping audit: the shipped mappings are clean, and planted mapping bugs are found and located."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from agentflow_core.adapters.audit import audit_entry, audit_mapping, errors_only, raw_states_of
from agentflow_core.adapters.base import BaseSemanticAdapter
from agentflow_core.registry import EnvEntry, EnvRegistry, load_entry
from agentflow_core.semantics import CHECKOUT, FEATURES, TOKENS

REPO = Path(__file__).resolve().parents[1]
ENTRIES = EnvRegistry(REPO / "configs/envs", yaml.safe_load).entries()


class FieldAdapter(BaseSemanticAdapter):
    """Leaf condition ``{"field": name, "equals": value}`` on a flat dict."""

    template = "db"
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "required": ["field", "equals"],
        "additionalProperties": False,
        "properties": {"field": {"type": "string"}, "equals": {}},
    }

    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        return bool(raw.get(when["field"]) == when["equals"])

    def extract(self, source: str, raw: Any) -> float | None:
        return None


def order_mapping(expired_emits: str = "ORDER_EXPIRED") -> dict[str, Any]:
    return {
        "family": "orders",
        "template": "db",
        "version": 1,
        "actions": {"CHECKOUT": {"type": "sql"}},
        "token_rules": [
            {"id": "R_PENDING", "when": {"field": "status", "equals": "pending"}, "emit": ["ORDER_PENDING"]},
            {"id": "R_CANCELLED", "when": {"field": "status", "equals": "cancelled"}, "emit": ["ORDER_CANCELLED"]},
            {"id": "R_EXPIRED", "when": {"field": "status", "equals": "expired"}, "emit": [expired_emits]},
            {"id": "R_PAID", "when": {"field": "status", "equals": "paid"}, "emit": ["ORDER_PENDING"]},
        ],
        "unobservable_features": [f for f in FEATURES if f != "step_fraction"],
    }


RAW = [
    ({"status": "pending"}, "ORDER_PENDING"),
    ({"status": "cancelled"}, "ORDER_CANCELLED"),
    ({"status": "expired"}, "ORDER_EXPIRED"),
]


def test_clean_mapping_has_only_info_findings() -> None:
    findings = audit_mapping(FieldAdapter(order_mapping(), vocabulary=CHECKOUT), RAW, "orders.json")
    assert errors_only(findings) == []
    unproducible = {f.detail.removeprefix("no rule emits ") for f in findings}
    assert unproducible == set(TOKENS) - {"ORDER_PENDING", "ORDER_CANCELLED", "ORDER_EXPIRED"}
    assert {(f.kind, f.severity, f.file) for f in findings} == {("unproducible_token", "info", "orders.json")}


def test_a_mapping_that_disagrees_with_the_process_names_the_feature_and_the_action() -> None:
    mapping = order_mapping()
    mapping["unobservable_features"].remove("cart_items")
    mapping["unobservable_features"].remove("retries_used")
    mapping["feature_rules"] = [{"id": "f_retries", "feature": "retries_used", "source": "retries", "clip": [0, 5]}]
    mapping["actions"]["CHECKOUT"]["requires"] = {"field": "status", "equals": "cancelled"}
    findings = errors_only(audit_mapping(FieldAdapter(mapping, vocabulary=CHECKOUT), RAW, "orders.json"))
    details = sorted(f.detail for f in findings if f.kind == "feature_disagrees")
    assert len(details) == 2 and "feature cart_items: no rule reads it" in details[0]
    assert "feature retries_used: clipped to [0, 5]" in details[1]
    (mask,) = [f for f in findings if f.kind == "mask_disagrees"]
    assert mask.rule == "actions.CHECKOUT" and "action CHECKOUT: the process says not legal" in mask.detail


def test_unmapped_and_wrong_token_are_located() -> None:
    raw = [*RAW, ({"status": "refunded"}, "ORDER_CANCELLED"), ({"status": "paid"}, "PAYMENT_SUCCESS")]
    findings = errors_only(audit_mapping(FieldAdapter(order_mapping(), vocabulary=CHECKOUT), raw, "orders.json"))
    by_kind = {f.kind: f for f in findings}
    assert sorted(by_kind) == ["collapsed_meaning", "unmapped_raw_state", "wrong_token"] and len(findings) == 3
    assert (
        "RAW_STATES[3]" in by_kind["unmapped_raw_state"].detail and "refunded" in by_kind["unmapped_raw_state"].detail
    )
    assert (
        by_kind["wrong_token"].rule_ids == ("R_PAID",)
        and "should carry PAYMENT_SUCCESS" in by_kind["wrong_token"].detail
    )
    # the paid order reads exactly like the pending one: a collapse of two meanings
    assert set(by_kind["collapsed_meaning"].rule_ids) == {"R_PENDING", "R_PAID"}
    assert (
        "(ORDER_PENDING)" in by_kind["collapsed_meaning"].detail
        and "(PAYMENT_SUCCESS)" in by_kind["collapsed_meaning"].detail
    )


def test_collapse_names_both_rules() -> None:
    findings = errors_only(
        audit_mapping(FieldAdapter(order_mapping("ORDER_CANCELLED"), vocabulary=CHECKOUT), RAW, "orders.json")
    )
    collapsed = [f for f in findings if f.kind == "collapsed_meaning"]
    assert len(collapsed) == 1
    assert set(collapsed[0].rule_ids) == {"R_CANCELLED", "R_EXPIRED"} and collapsed[0].file == "orders.json"
    assert "ORDER_CANCELLED" in collapsed[0].detail and "ORDER_EXPIRED" in collapsed[0].detail


def test_identical_readings_of_different_states_collapse_even_when_each_keeps_its_token() -> None:
    mapping = order_mapping()
    mapping["token_rules"][1]["when"] = {
        "any": [{"field": "status", "equals": "cancelled"}, {"field": "status", "equals": "expired"}]
    }
    mapping["token_rules"][2]["when"] = mapping["token_rules"][1]["when"]
    findings = errors_only(audit_mapping(FieldAdapter(mapping, vocabulary=CHECKOUT), RAW, "orders.json"))
    assert [(f.kind, set(f.rule_ids)) for f in findings] == [("collapsed_meaning", {"R_CANCELLED", "R_EXPIRED"})]


def test_identical_readings_with_compatible_meanings_are_not_a_collapse() -> None:
    mapping = order_mapping()
    mapping["token_rules"].append(
        {"id": "R_SESSION", "when": {"field": "session", "equals": "on"}, "emit": ["LOGGED_IN"]}
    )
    mapping["token_rules"].append({"id": "R_CART", "when": {"field": "cart", "equals": 0}, "emit": ["CART_EMPTY"]})
    raw = [
        ({"session": "on", "cart": 0}, "LOGGED_IN"),  # just logged in
        ({"session": "on", "cart": 0, "error": "empty cart"}, "CART_EMPTY"),  # checkout refused: cart empty
    ]
    assert errors_only(audit_mapping(FieldAdapter(mapping, vocabulary=CHECKOUT), raw, "orders.json")) == []


def test_a_reading_holding_exclusive_meanings_is_a_collapse() -> None:
    mapping = order_mapping()
    mapping["token_rules"][0]["emit"] = ["ORDER_PENDING", "ORDER_EXPIRED"]
    findings = errors_only(audit_mapping(FieldAdapter(mapping, vocabulary=CHECKOUT), RAW, "orders.json"))
    collapsed = [f for f in findings if f.kind == "collapsed_meaning"]
    assert [(f.rule_ids, "reads as both ORDER_EXPIRED and ORDER_PENDING" in f.detail) for f in collapsed] == [
        (("R_PENDING",), True)
    ]


# ---------------------------------------------------------------- the shipped families
@pytest.fixture(params=ENTRIES, ids=[e.env_id for e in ENTRIES])
def entry(request: pytest.FixtureRequest) -> EnvEntry:
    return request.param


def test_shipped_mapping_audits_clean(entry: EnvEntry) -> None:
    findings = audit_entry(entry)
    assert [str(f) for f in errors_only(findings)] == []
    assert all(f.kind == "unproducible_token" and f.file == entry.mapping_path for f in findings)
    intended = {token for _, token in raw_states_of(entry)}
    assert {"ORDER_CANCELLED", "ORDER_EXPIRED", "PAYMENT_SUCCESS", "LOGGED_OUT"} <= intended


def _rules_emitting(mapping: dict[str, Any], token: str) -> list[dict[str, Any]]:
    return [rule for rule in mapping["token_rules"] if token in rule["emit"]]


def test_planted_collapse_is_found_in_a_copied_mapping(entry: EnvEntry, tmp_path: Path) -> None:
    planted = copy.deepcopy(entry.mapping)
    cancelled_rules = _rules_emitting(planted, "ORDER_CANCELLED")
    expired_rules = _rules_emitting(planted, "ORDER_EXPIRED")
    assert cancelled_rules and expired_rules
    for rule in expired_rules:
        rule["emit"] = ["ORDER_CANCELLED" if t == "ORDER_EXPIRED" else t for t in rule["emit"]]
    mapping_file = tmp_path / "planted.json"
    mapping_file.write_text(json.dumps(planted))
    config = {
        "env_id": entry.env_id,
        "process": entry.process,
        "class_path": entry.class_path,
        "adapter": entry.adapter,
        "mapping": "planted.json",
        "params": entry.params,
        "kwargs": entry.kwargs,
    }
    (tmp_path / "planted.yaml").write_text(yaml.safe_dump(config))

    findings = errors_only(audit_entry(load_entry(tmp_path / "planted.yaml", yaml.safe_load)))
    collapsed = [
        f
        for f in findings
        if f.kind == "collapsed_meaning"
        and {"ORDER_CANCELLED", "ORDER_EXPIRED"} <= set(f.detail.replace("(", " ").replace(")", " ").split())
    ]
    assert collapsed, [str(f) for f in findings]
    assert collapsed[0].file == str(mapping_file.resolve())
    assert {r["id"] for r in expired_rules} <= set(collapsed[0].rule_ids)
    assert {r["id"] for r in cancelled_rules} & set(collapsed[0].rule_ids)
    assert any(f.kind == "wrong_token" and "should carry ORDER_EXPIRED" in f.detail for f in findings)
