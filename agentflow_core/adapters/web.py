"""Web template: match rendered pages (page name, visible text, elements, banner, fields).

Leaf conditions of a ``web`` mapping (exactly one kind per leaf, combined with all/any/not):

* ``{"page": "cart"}``                           -- the page name;
* ``{"text_contains": "..."}``                   -- case-sensitive substring of the visible text;
* ``{"text_regex": "..."}``                      -- regex search on the visible text (``(?i)`` for case);
* ``{"selector": "#id"}``                        -- element present among buttons, links or form fields;
* ``{"banner": "error"}``                        -- flash banner kind (``any`` / ``none`` also allowed);
* ``{"field": "cart_count", "op": ">", "value": 0}`` -- a named value compared (see :meth:`WebAdapter.extract`).

Speed matters (the adapter runs on every step of every web env): each leaf is compiled once, at
load, into a closure over a precompiled regex and the page values it reads (page name, text,
element lists -- each read once per step and shared by all leaves), so a step costs no schema
checks, no regex compilation and no per-leaf dispatch on the condition's keys. :meth:`WebAdapter.match`
interprets a leaf directly and is the reference the closures are tested against.

A ``text_regex`` runs on the ``regex`` package, not ``re``: a thread stuck in a catastrophic
backtrack cannot be stopped (it holds the GIL), so every search carries ``timeout=`` and a rule
that exceeds :data:`REGEX_TIMEOUT_S` raises :class:`MappingError` naming the rule instead of
hanging the step. ``regex`` also avoids the blow-up of patterns like ``(.*.*)*XQZ`` outright.
Compiling is bounded too: :func:`~agentflow_core.adapters.regex_bound.check_regex` refuses a
pattern whose counted repetition would unroll into millions of nodes before it reaches the compiler.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar

import regex

from agentflow_core.adapters.base import BaseSemanticAdapter, Predicate, Reader
from agentflow_core.adapters.regex_bound import check_regex
from agentflow_core.adapters.schema import COMPARISONS, _json_path
from agentflow_core.errors import MappingError

_BANNER_KINDS = ("error", "warning", "success", "info", "any", "none")
REGEX_TIMEOUT_S = 0.05
_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})
# What a page value reads as when the page lacks it (the same defaults ``match`` uses).
_PAGE_DEFAULTS: dict[str, Any] = {"text": "", "buttons": (), "links": (), "forms": (), "fields": frozenset()}
_MEMBER_VALUES = frozenset({"buttons", "links", "forms", "fields"})


def _leaf(key: str) -> dict[str, Any]:
    return {"required": [key], "maxProperties": 1}


class WebAdapter(BaseSemanticAdapter):
    """Semantic adapter for the DOM-like pages of the web channel."""

    template: ClassVar[str] = "web"
    SHARED_PLAN: ClassVar[bool] = True
    MEMO_STEPS: ClassVar[bool] = True
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
            "op": {"enum": list(COMPARISONS)},
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

    # ------------------------------------------------------------------ compiled engine
    def _value(self, key: str) -> int:
        default = _PAGE_DEFAULTS.get(key)
        if key in _MEMBER_VALUES:  # read for membership only: as a tuple / the dict's keys, so a step can be keyed
            return self.reader(key, lambda raw: _members(raw.get(key, default)))
        return self.reader(key, lambda raw: raw.get(key, default))

    def _bounded_search(self, pattern: str, path: list[Any]) -> Callable[[str], bool]:
        """``pattern`` compiled once; each search stops after :data:`REGEX_TIMEOUT_S` with a MappingError."""
        where = _json_path(path)
        refused = check_regex(pattern)  # before compiling: the compiler cannot be interrupted
        if refused is not None:
            raise MappingError(self.source, where, refused)
        try:
            compiled = regex.compile(pattern)
        except (regex.error, OverflowError, RecursionError, MemoryError) as exc:
            raise MappingError(self.source, where, f"invalid regex: {exc}") from None
        source = self.source

        def search(text: str) -> bool:
            try:
                return compiled.search(text, timeout=REGEX_TIMEOUT_S) is not None
            except TimeoutError:
                raise MappingError(source, where, f"regex {pattern[:80]!r} ran past {REGEX_TIMEOUT_S}s") from None

        return search

    def compile_leaf(self, when: Mapping[str, Any], path: list[Any]) -> Predicate:
        """One leaf condition as a closure; a bad regex fails here with the rule's JSON path."""
        if "page" in when:
            page, i = when["page"], self._value("page")
            return self.keyed_leaf(i, (page,), lambda values: values[i] == page)
        if "text_contains" in when:
            needle, i = when["text_contains"], self._value("text")
            return lambda values: needle in values[i]
        if "text_regex" in when:
            search = self._bounded_search(when["text_regex"], [*path, "text_regex"])
            i = self._value("text")
            return lambda values: search(values[i])
        if "selector" in when:
            selector = when["selector"]
            name = selector[1:] if selector.startswith("#") else selector
            b, li, f = self._value("buttons"), self._value("links"), self._value("fields")
            return lambda values: selector in values[b] or selector in values[li] or name in values[f]
        if "banner" in when:
            kind = when["banner"]
            if kind in ("any", "none"):
                shown = kind == "any"
                i = self.reader("banner_shown", lambda raw: raw.get("banner") is not None)
                return lambda values: values[i] is shown
            i = self.reader("banner_kind", _banner_kind)

            def banner_is(values: list[Any]) -> bool:
                found = values[i]
                if found.__class__ is _Banner:
                    return (found.banner or _NO_FIELDS).get("kind") == kind
                return bool(found == kind)

            return banner_is
        return self._compile_field(when)

    def _compile_field(self, when: Mapping[str, Any]) -> Predicate:
        name, compare, value = when["field"], COMPARISONS[when["op"]], when["value"]
        if isinstance(value, str):  # string comparison on the raw value (e.g. a form field)
            i = self.reader(("lookup", name), lambda raw: _lookup(name, raw))
            return lambda values: (found := values[i]) is not None and compare(str(found), value)
        target = float(value)
        i = self.reader(("number", name), self.compile_feature(name))
        return lambda values: (found := values[i]) is not None and compare(found, target)

    def compile_feature(self, source: str) -> Reader:
        """``extract`` with a fast path for a number at the top level or in ``data``."""
        extract = self.extract

        def number(raw: Mapping[str, Any]) -> Any:
            found = raw[source] if source in raw else (raw.get("data") or _NO_FIELDS).get(source)
            if found.__class__ is not float and found.__class__ is not int:  # strings, bools, fields, absent
                found = extract(source, raw)
            return found

        return number

    def compile_available(self, native_action: Mapping[str, Any], path: list[Any]) -> Predicate | None:
        """Element presence on the page, from the same per-step reads as the selector leaves."""
        kind = native_action.get("type")
        if kind == "click":
            target = native_action.get("target")
            b, li = self._value("buttons"), self._value("links")
            return lambda values: target in values[b] or target in values[li]
        if kind == "submit":
            form, i = native_action.get("form"), self._value("forms")
            return lambda values: form in values[i]
        if kind == "type":
            field, i = native_action.get("field"), self._value("fields")
            return lambda values: field in values[i]
        return None if kind in ("navigate", "noop") else (lambda values: False)

    # ------------------------------------------------------------------ reference engine
    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Does one leaf condition hold on this page? (interpreted: the reference for the closures)"""
        if "page" in when:
            return raw.get("page") == when["page"]
        if "text_contains" in when:
            return when["text_contains"] in raw.get("text", "")
        if "text_regex" in when:
            return self._bounded_search(when["text_regex"], ["<when>", "text_regex"])(raw.get("text", ""))
        if "selector" in when:
            selector = when["selector"]
            name = selector[1:] if selector.startswith("#") else selector
            return (
                selector in raw.get("buttons", ()) or selector in raw.get("links", ()) or name in raw.get("fields", {})
            )
        if "banner" in when:
            kind = when["banner"]
            if kind == "any":
                return raw.get("banner") is not None
            if kind == "none":
                return raw.get("banner") is None
            return (raw.get("banner") or {}).get("kind") == kind
        name, compare, value = when["field"], COMPARISONS[when["op"]], when["value"]
        if isinstance(value, str):
            found = _lookup(name, raw)
            return found is not None and compare(str(found), value)
        number = self.extract(name, raw)
        return number is not None and compare(number, float(value))

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


def _members(value: Any) -> Any:
    """A page list as a tuple, a dict as the frozenset of its keys (``x in`` answers the same); else as it is."""
    if value.__class__ is list:
        return tuple(value)
    if value.__class__ is dict:
        return frozenset(value)
    return value


class _Banner:
    """A banner that is not a plain dict, carried to the leaf that reads its kind (as the reference engine does)."""

    __slots__ = ("banner",)

    def __init__(self, banner: Any) -> None:
        self.banner = banner


def _banner_kind(raw: Mapping[str, Any]) -> Any:
    banner = raw.get("banner")
    if banner is None:
        return None
    if banner.__class__ is dict:
        return banner.get("kind")
    return _Banner(banner)


def _lookup(name: str, raw: Mapping[str, Any]) -> Any:
    value = raw.get(name)
    if value is not None and not isinstance(value, Mapping | list):
        return value
    data = raw.get("data")
    if data is not None and name in data:
        return data[name]
    fields = raw.get("fields")
    return fields.get(name) if fields is not None else None
