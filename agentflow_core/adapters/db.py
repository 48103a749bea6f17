"""The ``db`` template: rules over the columns a SQL channel reads back.

A leaf condition names a dotted column path into the raw observation (``"order.status"``) and one
predicate: ``equals``, ``in``, ``op``+``value`` (numeric comparison) or ``is_null``. At load every
column a rule names becomes one per-step read (shared by all leaves on that column) and every leaf
a closure over it, so a step does one dict walk per column and plain comparisons -- no schema work,
no string splitting, no ABC ``isinstance`` on plain dicts. :meth:`DBAdapter.match` interprets a
leaf directly and is the reference the compiled closures are tested against.

An action entry of the mapping may carry ``requires`` (a condition in the same language); the
action is masked out wherever it does not hold, and the entry handed to the channel drops it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any, ClassVar

from agentflow_core.adapters.base import BaseSemanticAdapter, Predicate, Reader
from agentflow_core.adapters.schema import COMPARISONS
from agentflow_core.errors import MappingError

_COLUMN_PATTERN = r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*$"
_MISSING = object()
_NO_TABLE: dict[str, Any] = {}  # an absent table: every column absent (never written)
_PLAIN_ROWS = frozenset({dict})


def _lookup(keys: tuple[str, ...], raw: Any) -> Any:
    value = raw
    for key in keys:
        if not isinstance(value, Mapping):
            return _MISSING
        value = value.get(key, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def _column_reader(keys: tuple[str, ...]) -> Reader:
    """``_lookup`` for one column, with plain dicts walked without the ABC ``isinstance``."""
    if len(keys) == 2:
        first, second = keys

        def read2(raw: Any) -> Any:
            table = raw.get(first, _MISSING) if raw.__class__ is dict else _lookup((first,), raw)
            if table.__class__ is dict:
                return table.get(second, _MISSING)
            return _lookup((second,), table)

        return read2

    def read(raw: Any) -> Any:
        value = raw
        for key in keys:
            if value.__class__ is not dict and not isinstance(value, Mapping):
                return _MISSING
            value = value.get(key, _MISSING)
            if value is _MISSING:
                return _MISSING
        return value

    return read


def _column_number(first: str, second: str) -> Reader:
    """``extract`` of the column ``first.second``, plain ints and floats without the generic checks."""

    def number(raw: Any) -> Any:
        table = raw.get(first, _MISSING) if raw.__class__ is dict else _lookup((first,), raw)
        value = table.get(second, _MISSING) if table.__class__ is dict else _lookup((second,), table)
        if value.__class__ is float or value.__class__ is int:
            return value
        return None if value is _MISSING else _as_number(value)

    return number


def _number(value: Any) -> Any:
    """A column's value as a feature reads it: ints and floats as they are, booleans as 0/1, else None."""
    if value.__class__ is float or value.__class__ is int:
        return value
    return None if value is _MISSING else _as_number(value)


def _table_reader(columns: tuple[tuple[str, str], ...], readers: tuple[Reader, ...]) -> Callable[[Any], list[Any]]:
    """Every ``table.column`` value at once: two C-level passes over plain dicts, the readers otherwise.

    ``values[0]`` is the raw observation; a table that is absent reads every column as absent, one that
    is not a plain dict (None, a row object, a dict subclass) sends the step to the column readers.
    """
    tables = tuple(dict.fromkeys(t for t, _ in columns))  # each table read once
    rows_of = itemgetter(
        *(tables.index(t) for t, _ in columns), 0
    )  # every column's row (one more: a tuple even for one column)
    names, absent_tables = tuple(c for _, c in columns), (_NO_TABLE,) * len(tables)
    absent_values = (_MISSING,) * len(names)
    get = dict.get

    def read_all(raw: Any) -> list[Any]:
        if raw.__class__ is dict:
            rows = [*map(raw.get, tables, absent_tables)]
            if _PLAIN_ROWS.issuperset(map(type, rows)):
                return [raw, *map(get, rows_of(rows), names, absent_values)]
        return [read(raw) for read in readers]

    return read_all


def _as_number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    return None


class DBAdapter(BaseSemanticAdapter):
    """Semantic adapter for SQL channels: column/value rules over the rows read back."""

    template: ClassVar[str] = "db"
    SHARED_PLAN: ClassVar[bool] = True
    MEMO_STEPS: ClassVar[bool] = True
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "required": ["column"],
        "additionalProperties": False,
        "properties": {
            "column": {"type": "string", "pattern": _COLUMN_PATTERN},
            "equals": {"type": ["string", "number", "boolean", "null"]},
            "in": {"type": "array", "minItems": 1, "items": {"type": ["string", "number", "boolean", "null"]}},
            "op": {"enum": list(COMPARISONS)},
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

    def check_mapping(self) -> None:
        """Every action's ``requires`` must be a condition in the leaf language (checked with its JSON path)."""
        self._clean_actions: dict[int, dict[str, Any]] = {}
        for action, native in self.native_actions.items():
            self._clean_actions[action] = {k: v for k, v in native.items() if k != "requires"}
            requires = native.get("requires")
            if requires is None:
                continue
            path = ["actions", self.vocabulary.actions[action], "requires"]
            if not isinstance(requires, Mapping):
                raise MappingError(self.source, "$." + ".".join(path), "'requires' must be a condition object")
            self._check_when(requires, path)

    # ------------------------------------------------------------------ compiled engine
    def _column(self, column: str) -> int:
        keys = tuple(column.split("."))
        return self.reader(("column", keys), _column_reader(keys))

    def compile_leaf(self, when: Mapping[str, Any], path: list[Any]) -> Predicate:
        """One leaf -> a closure over its column's per-step value."""
        i = self._column(str(when["column"]))
        if "equals" in when:
            expected = when["equals"]
            return self.keyed_leaf(i, (expected,), lambda values: (v := values[i]) is not _MISSING and v == expected)
        if "in" in when:
            allowed = list(when["in"])
            return self.keyed_leaf(i, allowed, lambda values: (v := values[i]) is not _MISSING and v in allowed)
        if "is_null" in when:
            want_null = bool(when["is_null"])
            return lambda values: (values[i] in (None, _MISSING)) == want_null
        compare, threshold = COMPARISONS[when["op"]], float(when["value"])

        def numeric(values: list[Any]) -> bool:
            value = values[i]
            if value.__class__ is not float and value.__class__ is not int:
                value = _as_number(value) if value is not _MISSING else None
                if value is None:
                    return False
            return compare(float(value), threshold)

        return numeric

    def compile_feature(self, source: str) -> Reader:
        """A dotted column read as ``extract`` does, plain ints and floats without the generic checks."""
        keys = tuple(source.split("."))
        if len(keys) == 2:  # "table.column", the common shape: the walk and the number check in one call
            return _column_number(*keys)
        read = _column_reader(keys)

        def number(raw: Any) -> float | None:
            value = read(raw)
            if value.__class__ is float or value.__class__ is int:
                return value
            return None if value is _MISSING else _as_number(value)

        return number

    def compile_feature_read(self, source: str) -> tuple[int, Callable[[Any], Any] | None]:
        """A feature source is a column: read once per step with the rules' columns, then taken as a number."""
        return self._column(source), _number

    def compile_values(self) -> Callable[[Any], list[Any]] | None:
        """All columns in one call when every one is ``table.column`` (the shape every mapping uses)."""
        keys: list[tuple[int, Any]] = sorted((index, key) for key, index in self._reader_index.items())
        columns = tuple(key[1] for _, key in keys)
        if not columns or [i for i, _ in keys] != list(range(1, len(keys) + 1)) or any(len(c) != 2 for c in columns):
            return None
        return _table_reader(columns, tuple(self._readers))

    def compile_available(self, native_action: Mapping[str, Any], path: list[Any]) -> Predicate | None:
        """The action's ``requires`` condition compiled like a token rule (None when it has none)."""
        requires = native_action.get("requires")
        return None if requires is None else self._compile_tree(requires, [*path, "requires"])

    # ------------------------------------------------------------------ reference engine
    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Evaluate one leaf by interpreting it (the reference for the compiled closures)."""
        value = _lookup(tuple(str(when["column"]).split(".")), raw)
        if "equals" in when:
            return value is not _MISSING and value == when["equals"]
        if "in" in when:
            return value is not _MISSING and value in list(when["in"])
        if "is_null" in when:
            return (value in (None, _MISSING)) == bool(when["is_null"])
        number = _as_number(value)
        return number is not None and COMPARISONS[when["op"]](number, float(when["value"]))

    def extract(self, source: str, raw: Any) -> float | None:
        """Read a dotted column path as a float (booleans as 0/1; NULL or text as absent)."""
        value = _lookup(tuple(source.split(".")), raw)
        return None if value is _MISSING else _as_number(value)

    def available(self, native_action: Mapping[str, Any], raw: Any) -> bool:
        """An action is legal where its mapping ``requires`` condition holds (always, without one)."""
        requires = native_action.get("requires")
        return requires is None or self.holds(requires, raw)

    def adapt_action(self, action: int) -> dict[str, Any]:
        """The channel-native op, without the mask-only ``requires`` condition."""
        native = self._clean_actions.get(int(action))
        if native is None:
            return super().adapt_action(action)
        return dict(native)
