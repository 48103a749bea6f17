"""Web template: match rendered pages (page name, visible text, elements, banner, fields).

Leaf conditions of a ``web`` mapping (exactly one kind per leaf, combined with all/any/not):

* ``{"page": "cart"}``                           -- the page name;
* ``{"text_contains": "..."}``                   -- case-sensitive substring of the visible text;
* ``{"text_regex": "..."}``                      -- ``re.search`` on the visible text (``(?i)`` for case);
* ``{"selector": "#id"}``                        -- element present among buttons, links or form fields;
* ``{"banner": "error"}``                        -- flash banner kind (``any`` / ``none`` also allowed);
* ``{"field": "cart_count", "op": ">", "value": 0}`` -- a named value compared (see :meth:`WebAdapter.extract`).

Speed matters (the adapter runs on every step of every web env): each leaf is compiled once, at
load, into a closure over a precompiled regex, so a step costs no schema checks, no regex
compilation and no per-leaf dispatch on the condition's keys.
"""

from __future__ import annotations

import logging
import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

from agentflow_core.adapters.base import BaseSemanticAdapter, _json_path, logger
from agentflow_core.errors import MappingError
from agentflow_core.semantics import N_ACTIONS, SemanticAction, SemanticObs

Predicate = Callable[[Mapping[str, Any]], bool]

_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
_BANNER_KINDS = ("error", "warning", "success", "info", "any", "none")


def _leaf(key: str) -> dict[str, Any]:
    return {"required": [key], "maxProperties": 1}


class WebAdapter(BaseSemanticAdapter):
    """Semantic adapter for the DOM-like pages of the web channel."""

    template: ClassVar[str] = "web"
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "additionalProperties": False,
        "minProperties": 1,
        "properties": {
            "page": {"type": "string", "minLength": 1},
            "text_contains": {"type": "string", "minLength": 1},
            "text_regex": {"type": "string", "minLength": 1},
            "selector": {"type": "string", "minLength": 1},
            "banner": {"enum": list(_BANNER_KINDS)},
            "field": {"type": "string", "minLength": 1},
            "op": {"enum": list(_OPS)},
            "value": {"type": ["number", "string", "boolean"]},
        },
        "oneOf": [
            _leaf("page"),
            _leaf("text_contains"),
            _leaf("text_regex"),
            _leaf("selector"),
            _leaf("banner"),
            {"required": ["field", "op", "value"], "maxProperties": 3},
        ],
    }

    def __init__(self, mapping: Mapping[str, Any], source: str = "<mapping>") -> None:
        super().__init__(mapping, source)
        # id(condition) -> (condition, compiled predicate); the condition is kept so an id reused
        # by another object can never hit a stale entry.
        self._compiled: dict[int, tuple[Mapping[str, Any], Predicate]] = {}
        self._token_plan: list[tuple[Predicate, tuple[str, ...]]] = [
            (self._compile_tree(rule["when"], ["token_rules", i, "when"]), tuple(rule["emit"]))
            for i, rule in enumerate(self.token_rules)
        ]
        self._feature_plan: list[tuple[str, str, float, float, float, float]] = [
            (
                r["feature"],
                r["source"],
                float(r.get("scale", 1.0)),
                float(r.get("default", 0.0)),
                *map(float, r.get("clip", (0.0, 1.0))),
            )
            for r in self.feature_rules
        ]
        _click_key = {"click": "target", "submit": "form", "type": "field"}
        self._mask_plan: list[tuple[int, str, Any]] = [
            (action, native.get("type", ""), native.get(_click_key.get(native.get("type", ""), ""), None))
            for action, native in sorted(self.native_actions.items())
        ]

    # ------------------------------------------------------------------ compilation
    def _compile_tree(self, when: Mapping[str, Any], path: list[Any]) -> Predicate:
        """Compile a condition (combinators included) into one closure, cached by identity."""
        if "all" in when or "any" in when:
            combinator = "all" if "all" in when else "any"
            subs = tuple(self._compile_tree(s, [*path, combinator, j]) for j, s in enumerate(when[combinator]))
            fn: Predicate = _conjunction(subs) if combinator == "all" else _disjunction(subs)
        elif "not" in when:
            inner = self._compile_tree(when["not"], [*path, "not"])
            fn = lambda raw: not inner(raw)  # noqa: E731
        else:
            fn = self._compile_leaf(when, path)
        self._compiled[id(when)] = (when, fn)
        return fn

    def _compile_leaf(self, when: Mapping[str, Any], path: list[Any]) -> Predicate:
        """One leaf condition as a closure; a bad regex fails here with the rule's JSON path."""
        if "page" in when:
            page = when["page"]
            return lambda raw: raw.get("page") == page
        if "text_contains" in when:
            needle = when["text_contains"]
            return lambda raw: needle in raw.get("text", "")
        if "text_regex" in when:
            try:
                search = re.compile(when["text_regex"]).search
            except re.error as exc:
                raise MappingError(self.source, _json_path([*path, "text_regex"]), f"invalid regex: {exc}") from exc
            return lambda raw: search(raw.get("text", "")) is not None
        if "selector" in when:
            selector = when["selector"]
            name = selector[1:] if selector.startswith("#") else selector
            return lambda raw: (
                selector in raw.get("buttons", ()) or selector in raw.get("links", ()) or name in raw.get("fields", {})
            )
        if "banner" in when:
            kind = when["banner"]
            if kind == "any":
                return lambda raw: raw.get("banner") is not None
            if kind == "none":
                return lambda raw: raw.get("banner") is None
            return lambda raw: (raw.get("banner") or {}).get("kind") == kind
        return self._compile_field(when)

    def _compile_field(self, when: Mapping[str, Any]) -> Predicate:
        name, compare, value = when["field"], _OPS[when["op"]], when["value"]
        if isinstance(value, str):  # string comparison on the raw value (e.g. a form field)
            return lambda raw: (found := _lookup(name, raw)) is not None and compare(str(found), value)
        target = float(value)
        extract = self.extract

        def numeric(raw: Mapping[str, Any]) -> bool:
            found = raw.get(name)
            if found.__class__ is not int and found.__class__ is not float:  # fast path: a top-level number
                found = extract(name, raw)
            return found is not None and compare(found, target)

        return numeric

    # ------------------------------------------------------------------ step-time fast path
    def adapt_observation(self, raw: Any, context: Mapping[str, float] | None = None) -> SemanticObs:
        """Same result as the shared engine, through the compiled rules; the engine itself when logging.

        With DEBUG on for ``agentflow.adapter`` the base implementation runs, so every decision is
        logged exactly as for the other templates; ``tests/test_env_web.py`` checks both agree.
        """
        if logger.isEnabledFor(logging.DEBUG):
            return super().adapt_observation(raw, context)
        tokens: set[str] = set()
        for predicate, emit in self._token_plan:
            if predicate(raw):
                tokens.update(emit)
        features: dict[str, float] = dict(context) if context else {}
        data = raw.get("data") or {}
        for name, source, scale, default, lo, hi in self._feature_plan:
            found = raw[source] if source in raw else data.get(source)
            if found.__class__ is not float and found.__class__ is not int:  # strings, bools, fields, absent
                found = self.extract(source, raw)
            value = default if found is None else found * scale
            features[name] = min(max(value, lo), hi) if math.isfinite(value) else value
        return SemanticObs(frozenset(tokens), features)

    def action_mask(self, raw: Any) -> np.ndarray:
        """The shared mask rule (mapped and available, ESCALATE if nothing is) with one element lookup set."""
        clickable = {*raw.get("buttons", ()), *raw.get("links", ())}
        forms, fields = raw.get("forms", ()), raw.get("fields", {})
        mask = np.zeros(N_ACTIONS, dtype=bool)
        for action, kind, key in self._mask_plan:
            if kind == "click":
                mask[action] = key in clickable
            elif kind == "submit":
                mask[action] = key in forms
            elif kind == "type":
                mask[action] = key in fields
            else:
                mask[action] = kind in ("navigate", "noop")
        if not mask.any():
            mask[int(SemanticAction.ESCALATE)] = True
        return mask

    # ------------------------------------------------------------------ template hooks
    def holds(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Evaluate a condition through its compiled closure (the base engine for unknown ones)."""
        entry = self._compiled.get(id(when))
        if entry is not None and entry[0] is when:
            return entry[1](raw)
        return super().holds(when, raw)

    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Does one leaf condition hold on this page?"""
        entry = self._compiled.get(id(when))
        if entry is not None and entry[0] is when:
            return entry[1](raw)
        return self._compile_leaf(when, ["<when>"])(raw)

    def extract(self, source: str, raw: Any) -> float | None:
        """A number read by name: top-level page value, then ``data`` attribute, then form field."""
        value = _lookup(source, raw)
        if value is None or isinstance(value, bool | int | float):
            return None if value is None else float(value)
        try:
            return float(value)
        except (TypeError, ValueError):
            return None

    def available(self, native_action: Mapping[str, Any], raw: Any) -> bool:
        """A click/submit/type is possible only when its element is on the page; navigation always is."""
        kind = native_action.get("type")
        if kind == "click":
            target = native_action.get("target")
            return target in raw.get("buttons", ()) or target in raw.get("links", ())
        if kind == "submit":
            return native_action.get("form") in raw.get("forms", ())
        if kind == "type":
            return native_action.get("field") in raw.get("fields", {})
        return kind in ("navigate", "noop")


def _conjunction(subs: tuple[Predicate, ...]) -> Predicate:
    """``all`` without a generator per call: the common 1-3 term cases unrolled (a step-time hot path)."""
    if len(subs) == 1:
        return subs[0]
    if len(subs) == 2:
        a, b = subs
        return lambda raw: a(raw) and b(raw)
    if len(subs) == 3:
        a, b, c = subs
        return lambda raw: a(raw) and b(raw) and c(raw)
    return lambda raw: all(p(raw) for p in subs)


def _disjunction(subs: tuple[Predicate, ...]) -> Predicate:
    """``any``, unrolled like :func:`_conjunction`."""
    if len(subs) == 1:
        return subs[0]
    if len(subs) == 2:
        a, b = subs
        return lambda raw: a(raw) or b(raw)
    return lambda raw: any(p(raw) for p in subs)


def _lookup(name: str, raw: Mapping[str, Any]) -> Any:
    value = raw.get(name)
    if value is not None and not isinstance(value, Mapping | list):
        return value
    data = raw.get("data")
    if data is not None and name in data:
        return data[name]
    fields = raw.get("fields")
    return fields.get(name) if fields is not None else None
