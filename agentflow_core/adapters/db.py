"""The ``db`` template: rules over the columns a SQL channel reads back.

A leaf condition names a dotted column path into the raw observation (``"order.status"``) and one
predicate: ``equals``, ``in``, ``op``+``value`` (numeric comparison) or ``is_null``. Leaves are
compiled once into small closures keyed by the rule object, so a step does dict lookups and
comparisons only -- no schema work, no string splitting.

An action entry of the mapping may carry ``requires`` (a condition in the same language); the
action is masked out wherever it does not hold, and the entry handed to the channel drops it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from agentflow_core.adapters.base import BaseSemanticAdapter
from agentflow_core.errors import MappingError
from agentflow_core.semantics import SemanticAction

_COLUMN_PATTERN = r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$"
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}
_MISSING = object()

Predicate = Callable[[Any], bool]


def _lookup(keys: tuple[str, ...], raw: Any) -> Any:
    value = raw
    for key in keys:
        if not isinstance(value, Mapping):
            return _MISSING
        value = value.get(key, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


def _compile_leaf(when: Mapping[str, Any]) -> Predicate:
    """One leaf -> a closure over the pre-split column path."""
    keys = tuple(str(when["column"]).split("."))
    if "equals" in when:
        expected = when["equals"]
        return lambda raw: (v := _lookup(keys, raw)) is not _MISSING and v == expected
    if "in" in when:
        allowed = list(when["in"])
        return lambda raw: (v := _lookup(keys, raw)) is not _MISSING and v in allowed
    if "is_null" in when:
        want_null = bool(when["is_null"])
        return lambda raw: (_lookup(keys, raw) in (None, _MISSING)) == want_null
    compare, threshold = _OPERATORS[when["op"]], float(when["value"])

    def numeric(raw: Any) -> bool:
        value = _as_number(_lookup(keys, raw))
        return value is not None and compare(value, threshold)

    return numeric


class DBAdapter(BaseSemanticAdapter):
    """Semantic adapter for SQL channels: column/value rules over the rows read back."""

    template: ClassVar[str] = "db"
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "required": ["column"],
        "additionalProperties": False,
        "properties": {
            "column": {"type": "string", "pattern": _COLUMN_PATTERN},
            "equals": {"type": ["string", "number", "boolean", "null"]},
            "in": {"type": "array", "minItems": 1, "items": {"type": ["string", "number", "boolean", "null"]}},
            "op": {"enum": list(_OPERATORS)},
            "value": {"type": "number"},
            "is_null": {"type": "boolean"},
        },
        "oneOf": [
            {"required": ["equals"]},
            {"required": ["in"]},
            {"required": ["op", "value"]},
            {"required": ["is_null"]},
        ],
    }

    def __init__(self, mapping: Mapping[str, Any], source: str = "<mapping>") -> None:
        super().__init__(mapping, source)
        self._leaves: dict[int, tuple[Mapping[str, Any], Predicate]] = {}
        self._paths: dict[str, tuple[str, ...]] = {}
        for rule in self.token_rules:
            self._precompile(rule["when"])
        for action, native in self.native_actions.items():
            requires = native.get("requires")
            if requires is None:
                continue
            path = ["actions", SemanticAction(action).name, "requires"]
            if not isinstance(requires, Mapping):
                raise MappingError(self.source, "$." + ".".join(path), "'requires' must be a condition object")
            self._check_when(requires, path)
            self._precompile(requires)
        for rule in self.feature_rules:
            self._paths[rule["source"]] = tuple(rule["source"].split("."))

    def _precompile(self, when: Mapping[str, Any]) -> None:
        for combinator in ("all", "any"):
            if combinator in when:
                for sub in when[combinator]:
                    self._precompile(sub)
                return
        if "not" in when:
            self._precompile(when["not"])
            return
        self._leaves[id(when)] = (when, _compile_leaf(when))

    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Evaluate one leaf; leaves of the loaded mapping are compiled once, others on the fly."""
        cached = self._leaves.get(id(when))
        if cached is not None and cached[0] is when:
            return cached[1](raw)
        return _compile_leaf(when)(raw)

    def extract(self, source: str, raw: Any) -> float | None:
        """Read a dotted column path as a float (booleans as 0/1; NULL or text as absent)."""
        keys = self._paths.get(source)
        if keys is None:
            keys = self._paths[source] = tuple(source.split("."))
        value = _lookup(keys, raw)
        return None if value is _MISSING else _as_number(value)

    def available(self, native_action: Mapping[str, Any], raw: Any) -> bool:
        """An action is legal where its mapping ``requires`` condition holds (always, without one)."""
        requires = native_action.get("requires")
        return requires is None or self.holds(requires, raw)

    def adapt_action(self, action: int) -> dict[str, Any]:
        """The channel-native op, without the mask-only ``requires`` condition."""
        native = super().adapt_action(action)
        native.pop("requires", None)
        return native
