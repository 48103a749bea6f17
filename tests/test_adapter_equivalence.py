"""The compiled adapter engine against the reference interpreter, bit for bit, on every registered env.

The compiled path (closures, shared per-step reads, dict dispatch of equality leaves, cached token
blocks and masks) is what every env step runs; the reference path (``holds``/``match``/``extract``/
``available`` interpreting the mapping document) is what the mapping means. For each family they
must agree on every hand-written ``RAW_STATES`` sample and on a few hundred random-policy steps:
tokens, features (values and order), encoded vectors (bytes), masks, and the env's info.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml

from agentflow_core.adapters.audit import raw_states_of
from agentflow_core.adapters.base import BaseSemanticAdapter
from agentflow_core.adapters.db import DBAdapter
from agentflow_core.registry import EnvEntry, EnvRegistry
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, N_TOKENS, TOKEN_INDEX, SemanticAction, SemanticObs, encode

REPO = Path(__file__).resolve().parents[1]
ENTRIES = EnvRegistry(REPO / "configs/envs", yaml.safe_load).entries()
RANDOM_STEPS = 300
CONTEXT = {"step_fraction": 0.375}


def _reference_tokens(adapter: BaseSemanticAdapter, raw: Any) -> frozenset[str]:
    """The generic engine: every rule through ``holds`` (combinators) and the template's ``match``, then the
    process's superseded tokens dropped."""
    emitted = frozenset(t for r in adapter.token_rules if adapter.holds(r["when"], raw) for t in r["emit"])
    return adapter.contract.canonical(emitted)


def assert_equivalent(adapter: BaseSemanticAdapter, raw: Any, context: Mapping[str, float] = CONTEXT) -> None:
    """Compiled vs reference on one raw observation; fails with the raw state on any difference."""
    reference = adapter.reference_observation(raw, context)
    assert reference.tokens == _reference_tokens(adapter, raw), raw
    step = adapter.adapt_step(raw, context)
    fast = adapter.adapt_observation(raw, context)
    for obs in (step.obs, fast):
        assert obs.tokens == reference.tokens, raw
        assert repr(list(obs.features.items())) == repr(list(reference.features.items())), (
            raw
        )  # values, types, order (NaN too)
    assert step.tokens == reference.tokens and step.ordered == tuple(sorted(reference.tokens)), raw
    expected_vec = reference.encode()
    assert step.vec.dtype == np.float32 and step.vec.tobytes() == expected_vec.tobytes(), raw
    assert step.finite == bool(np.isfinite(expected_vec).all())
    expected_mask = adapter.reference_action_mask(raw)
    assert np.array_equal(step.mask, expected_mask) and np.array_equal(adapter.action_mask(raw), expected_mask), raw
    assert adapter.action_mask(raw).flags.writeable and not step.mask.flags.writeable


def _raw_states(entry: EnvEntry) -> list[Any]:
    """The family's labelled raw samples, found as the audit finds them (the registry's class path)."""
    return [raw for raw, _ in raw_states_of(entry)]


@pytest.fixture(params=ENTRIES, ids=[e.env_id for e in ENTRIES])
def entry(request: pytest.FixtureRequest) -> EnvEntry:
    return request.param


def test_every_family_has_hand_written_raw_states() -> None:
    families = {e.family: e for e in ENTRIES}
    for family in ("web_checkout", "order_db", "payment_api"):
        assert len(_raw_states(families[family])) >= 20, family


def test_compiled_equals_reference_on_raw_states(entry: EnvEntry) -> None:
    env = entry.make()
    for raw in _raw_states(entry):
        assert_equivalent(env.adapter, raw)
        assert_equivalent(env.adapter, raw, {})
    env.close()


def test_compiled_equals_reference_on_random_policy_steps(entry: EnvEntry) -> None:
    """Uniform random actions (illegal ones included) through the env; each step checked against the reference."""
    env, rng = entry.make(), np.random.default_rng(7)
    adapter = env.adapter
    obs, info = env.reset(seed=11)
    seen: set[frozenset[str]] = set()
    for _ in range(RANDOM_STEPS):
        raw = env._raw
        context = {"step_fraction": min(env.step_id / env.max_episode_steps, 1.0)}
        reference = adapter.reference_observation(raw, context)
        assert obs.tobytes() == reference.encode().tobytes()
        assert info["tokens"] == sorted(reference.tokens) and isinstance(info["tokens"], list)
        assert (
            np.array_equal(info["action_mask"], adapter.reference_action_mask(raw))
            and info["action_mask"].flags.writeable
        )
        assert env.last_obs == reference
        assert_equivalent(adapter, raw)
        seen.add(reference.tokens)
        obs, _, terminated, truncated, info = env.step(int(rng.integers(N_ACTIONS)))
        if terminated or truncated:
            obs, info = env.reset(seed=int(rng.integers(1 << 30)))
    env.close()
    assert len(seen) >= 4  # the walk left the start state: the comparison covered several token sets


def test_debug_logging_runs_the_reference_engine_with_the_same_result(caplog: pytest.LogCaptureFixture) -> None:
    entry = next(e for e in ENTRIES if e.family == "order_db")
    env = entry.make()
    raws = _raw_states(entry)
    fast = [env.adapter.adapt_step(raw, CONTEXT) for raw in raws]
    with caplog.at_level(logging.DEBUG, logger="agentflow.adapter"):
        logged = [env.adapter.adapt_step(raw, CONTEXT) for raw in raws]
    assert any("family=order_db rule=" in r.getMessage() for r in caplog.records)
    for a, b in zip(fast, logged, strict=True):
        assert a.obs == b.obs and a.vec.tobytes() == b.vec.tobytes() and np.array_equal(a.mask, b.mask)
    env.close()


# ---------------------------------------------------------------- edge cases of the compiled engine
EDGE_MAPPING: dict[str, Any] = {
    "family": "edge",
    "template": "db",
    "version": 1,
    "token_rules": [
        {"id": "pending", "when": {"column": "order.status", "equals": "pending"}, "emit": ["ORDER_PENDING"]},
        {"id": "open", "when": {"column": "order.status", "in": ["pending", "paid"]}, "emit": ["CHECKOUT_STARTED"]},
        {"id": "flag_true", "when": {"column": "flag", "equals": True}, "emit": ["VIP_USER"]},
        {"id": "flag_one", "when": {"column": "flag", "equals": 1}, "emit": ["LOGGED_IN"]},
        {"id": "flag_null", "when": {"column": "flag", "is_null": True}, "emit": ["LOGGED_OUT"]},
        {"id": "many", "when": {"column": "cart.items", "op": ">=", "value": 2}, "emit": ["CART_FILLED"]},
        {"id": "not_paid", "when": {"not": {"column": "order.status", "equals": "paid"}}, "emit": ["CART_EMPTY"]},
    ],
    "feature_rules": [
        {"id": "f_items", "feature": "cart_items", "source": "cart.items", "scale": 0.5},
        {"id": "f_wide", "feature": "balance_ratio", "source": "wallet.ratio", "clip": [-1e39, 1e39]},
        {"id": "f_int_clip", "feature": "price_factor", "source": "price", "clip": [0, 1]},
    ],
    "actions": {
        "CHECKOUT": {
            "type": "sql",
            "op": "create_order",
            "requires": {"column": "order.status", "in": ["pending", "new"]},
        },
        "ESCALATE": {"type": "sql", "op": "escalate", "requires": {"column": "flag", "equals": True}},
    },
}
EDGE_RAWS: list[Any] = [
    {"order": {"status": "pending"}, "flag": True, "cart": {"items": 3}, "wallet": {"ratio": 0.5}, "price": 2.0},
    {"order": {"status": "paid"}, "flag": 1, "cart": {"items": True}, "price": -3},
    {"order": {"status": ["pending"]}, "flag": 1.0, "cart": {"items": "2"}},  # unhashable column value
    {"order": {"status": {"k": 1}}, "flag": None, "cart": None},
    {"order": None, "flag": 0, "cart": {"items": float("nan")}, "wallet": {"ratio": 1e39}},
    {"order": "pending", "cart": {"items": float("inf")}, "price": float("nan")},
    {"order": {"status": "new"}, "flag": np.int64(1), "cart": {"items": np.float64(4.0)}, "wallet": {"ratio": 3e38}},
    {},
]


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # 1e39 -> float32, both engines
@pytest.mark.parametrize("raw", EDGE_RAWS, ids=range(len(EDGE_RAWS)))
def test_edge_values_agree(raw: Any) -> None:
    """Unhashable values, bool/int/float keys, NaN/inf features, wide clips, numpy scalars, missing tables."""
    assert_equivalent(DBAdapter(EDGE_MAPPING, "edge.json", vocabulary=CHECKOUT), raw)


def test_equal_keys_share_a_dispatch_entry_and_both_rules_fire() -> None:
    adapter = DBAdapter(EDGE_MAPPING, "edge.json", vocabulary=CHECKOUT)
    for flag in (True, 1, 1.0):
        assert {"VIP_USER", "LOGGED_IN"} <= adapter.adapt_observation({"flag": flag}).tokens


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_non_finite_features_are_flagged() -> None:
    adapter = DBAdapter(EDGE_MAPPING, "edge.json", vocabulary=CHECKOUT)
    assert not adapter.adapt_step({"cart": {"items": float("inf")}}).finite
    # finite float64, inf as float32 (balance_ratio is presented only in a live session: the flag signs in)
    assert not adapter.adapt_step({"flag": True, "wallet": {"ratio": 1e39}}).finite
    assert adapter.adapt_step({"flag": True, "wallet": {"ratio": 3e38}}).finite
    assert not adapter.adapt_step({}, {"step_fraction": float("nan")}).finite


def test_cached_token_blocks_and_masks_are_shared_and_read_only() -> None:
    adapter = DBAdapter(EDGE_MAPPING, "edge.json", vocabulary=CHECKOUT)
    a, b = adapter.adapt_step(EDGE_RAWS[0]), adapter.adapt_step(dict(EDGE_RAWS[0]))
    assert a.mask is b.mask and a.ordered is b.ordered and a.vec is not b.vec
    with pytest.raises(ValueError):
        a.mask[0] = True
    a.vec[0] = 5.0  # the vector is the caller's own
    assert b.vec[0] == 0.0 and adapter.adapt_step(EDGE_RAWS[0]).vec[TOKEN_INDEX["LOGGED_OUT"]] == 0.0


class _Shouting(DBAdapter):
    """A template that overrides ``adapt_observation``/``action_mask``: adapt_step honours the first, and the
    mask stays the process's legal actions in the tokens it reports (a channel never widens or narrows it)."""

    template: ClassVar[str] = "db"

    def adapt_observation(self, raw: Any, context: Mapping[str, float] | None = None) -> SemanticObs:
        base = super().adapt_observation(raw, context)
        return SemanticObs(base.tokens | {"ESCALATED"}, base.features)

    def action_mask(self, raw: Any) -> np.ndarray:
        mask = np.zeros(N_ACTIONS, dtype=bool)
        mask[int(SemanticAction.RETRY)] = True
        return mask


def test_template_overrides_are_honoured_by_adapt_step() -> None:
    step = _Shouting(EDGE_MAPPING, "edge.json", vocabulary=CHECKOUT).adapt_step(EDGE_RAWS[0], CONTEXT)
    assert "ESCALATED" in step.tokens and step.vec[TOKEN_INDEX["ESCALATED"]] == 1.0
    assert np.array_equal(step.mask, CHECKOUT.state_contract.legal_mask(step.tokens))
    assert step.vec.tobytes() == encode(step.tokens, step.obs.features).tobytes() and math.isfinite(
        float(step.vec[N_TOKENS])
    )


# ---------------------------------------------------------------- the step plan: shared per mapping, outcomes kept per values
class _RowDict(dict):  # type: ignore[type-arg]
    """A table that is a dict subclass: read through the column readers, not the plain-dict pass."""


def _variants(raw: Mapping[str, Any]) -> list[Any]:
    """One recorded order_db state with its numeric columns as equal values of other types (one dict key, but
    a numeric rule reads ``np.int64`` as no number) and signed zeros, plus tables that are not plain dicts."""
    out: list[Any] = []
    for shown in (1, 1.0, True, np.int64(1), np.float64(1.0), "1", None):
        for ratio in (0.0, -0.0, 0, 2.5, float("nan")):
            state = {table: dict(row) if isinstance(row, Mapping) else row for table, row in raw.items()}
            state["product"] = {**state.get("product", {}), "shown": shown, "stock": shown}
            state["wallet"] = {"balance_ratio": ratio}
            state["session"] = {"status": "active", "active": shown}
            out.append(state)
    out.append({**raw, "cart": None})
    out.append({**raw, "cart": _RowDict(items=2)})
    return out


def test_kept_outcomes_tell_equal_values_of_different_types_apart() -> None:
    entry = next(e for e in ENTRIES if e.family == "order_db")
    adapter = entry.build_adapter()
    states = [s for raw in _raw_states(entry)[:6] for s in _variants(raw)]
    for ordering in (states, states[::-1], states):  # each type first once: a kept outcome never leaks across types
        for raw in ordering:
            assert_equivalent(adapter, raw)


def test_adapters_of_one_mapping_share_their_step_plan() -> None:
    entry = next(e for e in ENTRIES if e.family == "order_db")
    first, second = entry.build_adapter(), entry.build_adapter()
    assert first._step_plan is second._step_plan
    other = DBAdapter(EDGE_MAPPING, "edge.json", vocabulary=CHECKOUT)
    assert other._step_plan is not first._step_plan


class _RawLeaf(DBAdapter):
    """A template whose leaves read the raw observation itself: its own plan, and no outcome kept per values."""

    template: ClassVar[str] = "db"
    calls = 0

    def compile_leaf(self, when: Mapping[str, Any], path: list[Any]) -> Any:
        match = self.match

        def leaf(values: list[Any]) -> bool:
            _RawLeaf.calls += 1
            return match(when, values[0])

        return leaf


def test_a_template_overriding_a_compile_hook_gets_its_own_plan_without_kept_outcomes() -> None:
    adapters = [_RawLeaf(EDGE_MAPPING, "edge.json", vocabulary=CHECKOUT) for _ in range(2)]
    assert adapters[0]._step_plan is not adapters[1]._step_plan
    for raw in (EDGE_RAWS[0], EDGE_RAWS[0]):
        before = _RawLeaf.calls
        assert_equivalent(adapters[0], raw)
        assert _RawLeaf.calls > before  # evaluated on every step


def _page_variants(raw: Mapping[str, Any]) -> list[Any]:
    """One recorded web page with its banner, element lists and fields in other shapes: read-only mappings,
    tuples, names that are not strings, absent values (kept outcomes must not leak between them)."""
    banners: tuple[Any, ...] = (None, {"kind": "error"}, MappingProxyType({"kind": "error"}), {}, {"kind": None})
    buttons = (list(raw.get("buttons", [])), tuple(raw.get("buttons", [])), [1, "#x"], None)
    fields = (dict(raw.get("fields", {})), MappingProxyType(dict(raw.get("fields", {}))), {"card": 1})
    out: list[Any] = []
    for banner, button, field in zip(banners * 3, buttons * 4, fields * 5, strict=False):
        page = {**raw, "banner": banner, "fields": field}
        if button is None:
            page.pop("buttons", None)
        else:
            page["buttons"] = button
        out.append(page)
    out.append({k: v for k, v in raw.items() if k not in ("fields", "banner", "links")})
    return out


def test_kept_web_outcomes_tell_page_shapes_apart() -> None:
    entry = next(e for e in ENTRIES if e.family == "web_checkout")
    adapter = entry.build_adapter()
    states = [s for raw in _raw_states(entry)[:8] for s in _page_variants(raw)]
    for ordering in (states, states[::-1]):
        for raw in ordering:
            assert_equivalent(adapter, raw)
