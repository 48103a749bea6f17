"""The ``api`` template: status-code and JSON-path rules over one HTTP exchange.

A raw observation of an API channel is the last exchange (see
:mod:`agentflow_core.envs.payment_api`). Leaf conditions:

* ``{"status": 402}`` or ``{"status": [401, 403]}`` -- the response status code;
* ``{"status_range": [500, 599]}`` -- inclusive range;
* ``{"json_path": "$.order.status", "equals": "paid"}`` / ``"in": [...]`` / ``"exists": true``;
* ``{"json_path": "$.record.attempts", "op": ">=", "value": 2}`` -- a number compared (false when
  the value is absent or not a number).

Paths starting ``$.`` read the response body; paths starting ``@.`` read the exchange envelope
(``@.client.outcome``, ``@.client.retries``, ``@.endpoint``, ``@.latency_s``). Feature sources use
the same paths. Paths are split once, when the mapping is loaded, and every leaf is compiled into a
closure over its path's per-step value (one walk per distinct path per step); :meth:`match` and
:meth:`extract` interpret the rules directly and are the reference the closures are tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from agentflow_core.adapters.base import BaseSemanticAdapter, Predicate, Reader
from agentflow_core.adapters.schema import COMPARISONS
from agentflow_core.semantics import Vocabulary

_PATH_PATTERN = r"^[$@](\.[A-Za-z0-9_\-]+)+$"
_MISSING = object()

ParsedPath = tuple[bool, tuple[str, ...]]  # (reads the body?, keys)


def parse_path(path: str) -> ParsedPath:
    """``"$.order.status"`` -> (True, ("order", "status")); ``"@.client.retries"`` -> (False, ...)."""
    if len(path) < 3 or path[0] not in "$@" or path[1] != ".":
        raise ValueError(f"json path {path!r} must start with '$.' (body) or '@.' (envelope)")
    return path[0] == "$", tuple(path[2:].split("."))


def _lookup(parsed: ParsedPath, raw: Any) -> Any:
    in_body, keys = parsed
    node = raw.get("json") if in_body and isinstance(raw, Mapping) else raw
    for key in keys:
        if not isinstance(node, Mapping) or key not in node:
            return _MISSING
        node = node[key]
    return node


class APISchemaAdapter(BaseSemanticAdapter):
    """Semantic adapter of HTTP JSON API channels (template ``api``)."""

    template: ClassVar[str] = "api"
    SHARED_PLAN: ClassVar[bool] = True
    MEMO_STEPS: ClassVar[bool] = True
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {
        "oneOf": [
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["status"],
                "properties": {
                    "status": {
                        "oneOf": [
                            {"type": "integer", "minimum": 100, "maximum": 599},
                            {
                                "type": "array",
                                "minItems": 1,
                                "items": {"type": "integer", "minimum": 100, "maximum": 599},
                            },
                        ]
                    }
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["status_range"],
                "properties": {
                    "status_range": {
                        "type": "array",
                        "minItems": 2,
                        "maxItems": 2,
                        "items": {"type": "integer", "minimum": 100, "maximum": 599},
                    }
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["json_path"],
                "minProperties": 2,
                "maxProperties": 2,
                "properties": {
                    "json_path": {"type": "string", "pattern": _PATH_PATTERN},
                    "equals": {},
                    "in": {"type": "array"},
                    "exists": {"type": "boolean"},
                },
            },
            {
                "type": "object",
                "additionalProperties": False,
                "required": ["json_path", "op", "value"],
                "properties": {
                    "json_path": {"type": "string", "pattern": _PATH_PATTERN},
                    "op": {"enum": sorted(COMPARISONS)},
                    "value": {"type": "number"},
                },
            },
        ]
    }

    def __init__(self, mapping: Mapping[str, Any], source: str = "<mapping>", *, vocabulary: Vocabulary) -> None:
        self._paths: dict[str, ParsedPath] = {}
        super().__init__(mapping, source, vocabulary=vocabulary)

    def _path(self, path: str) -> ParsedPath:
        parsed = self._paths.get(path)
        if parsed is None:
            parsed = self._paths[path] = parse_path(path)
        return parsed

    # ------------------------------------------------------------------ compiled engine
    def compile_leaf(self, when: Mapping[str, Any], path: list[Any]) -> Predicate:
        """One leaf -> a closure over the status code or its JSON path's per-step value."""
        if "status" in when or "status_range" in when:
            i = self.reader("status_code", _status_code)
            if "status" in when:
                expected = when["status"]
                if isinstance(expected, list):
                    return self.keyed_leaf(i, expected, lambda values: values[i] in expected)
                return self.keyed_leaf(i, (expected,), lambda values: values[i] == expected)
            low, high = when["status_range"]
            return lambda values: (status := values[i]) is not None and low <= status <= high
        json_path = when["json_path"]
        read = _path_reader(self._path(json_path))
        if "exists" in when:  # its own read, a bool: the value may be an object (a step keyed by it is not kept)
            exists = when["exists"]
            i = self.reader(
                ("json_path_present", json_path), lambda raw: (v := read(raw)) is not _MISSING and v is not None
            )
            return lambda values: values[i] == exists
        i = self.reader(("json_path", json_path), read)
        if "op" in when:
            compare, target = COMPARISONS[when["op"]], float(when["value"])
            return lambda values: _is_number(v := values[i]) and compare(v, target)
        if "equals" in when:
            expected = when["equals"]
            return self.keyed_leaf(
                i, (expected,), lambda values: (v := values[i]) is not _MISSING and bool(v == expected)
            )
        allowed = when["in"]
        return self.keyed_leaf(i, allowed, lambda values: (v := values[i]) is not _MISSING and v in allowed)

    def compile_feature(self, source: str) -> Reader:
        """The number at a JSON path as ``extract`` reads it, plain floats without the generic checks."""
        read = _path_reader(self._path(source))
        return lambda raw: _number(read(raw))

    def compile_feature_read(self, source: str) -> tuple[int, Callable[[Any], Any] | None]:
        """A feature source is a JSON path: read once per step with the rules' paths, then taken as a number."""
        return self.reader(("json_path", source), _path_reader(self._path(source))), _number

    # ------------------------------------------------------------------ reference engine
    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Status code, status range or JSON-path condition against one exchange."""
        if "status" in when:
            status = raw.get("status_code")
            expected = when["status"]
            return status in expected if isinstance(expected, list) else status == expected
        if "status_range" in when:
            status = raw.get("status_code")
            low, high = when["status_range"]
            return status is not None and low <= status <= high
        value = _lookup(self._path(when["json_path"]), raw)
        if "exists" in when:
            return (value is not _MISSING and value is not None) == when["exists"]
        if value is _MISSING:
            return False
        if "op" in when:
            return _is_number(value) and COMPARISONS[when["op"]](float(value), float(when["value"]))
        if "equals" in when:
            return bool(value == when["equals"])
        return value in when["in"]

    def extract(self, source: str, raw: Any) -> float | None:
        """The number at a JSON path (booleans read as 0/1); None when absent or not numeric."""
        value = _lookup(self._path(source), raw)
        if value is _MISSING or value is None or isinstance(value, (dict, list, str)):
            return None
        return float(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float))  # booleans included, as ``extract`` reads them


def _number(value: Any) -> Any:
    """A path's value as a feature reads it: ints and floats as they are, absent or non-numeric as None."""
    if value.__class__ is float or value.__class__ is int:
        return value
    if value is _MISSING or value is None or isinstance(value, (dict, list, str)):
        return None
    return float(value)


def _status_code(raw: Any) -> Any:
    return raw.get("status_code")


def _path_reader(parsed: ParsedPath) -> Reader:
    """``_lookup`` of one parsed path, with plain dicts walked without the ABC ``isinstance``."""
    in_body, keys = parsed
    if in_body and len(keys) <= 2:  # "$.order" / "$.order.status": the common shapes, unrolled
        return _short_body_reader(parsed)
    return _walking_reader(parsed)


def _short_body_reader(parsed: ParsedPath) -> Reader:
    """The reader of a body path one or two keys deep."""
    keys = parsed[1]
    first, second = keys[0], keys[-1]
    depth2 = len(keys) == 2

    def read_body(raw: Any) -> Any:
        if raw.__class__ is dict:
            body = raw.get("json")
            if body.__class__ is dict:
                node = body.get(first, _MISSING)
                if not depth2 or node is _MISSING:
                    return node
                if node.__class__ is dict:
                    return node.get(second, _MISSING)
                if node is None:
                    return _MISSING
        return _lookup(parsed, raw)

    return read_body


def _walking_reader(parsed: ParsedPath) -> Reader:
    """The reader of any path: the body or the response, walked key by key."""
    in_body, keys = parsed

    def read(raw: Any) -> Any:
        if raw.__class__ is dict:
            node = raw.get("json") if in_body else raw
        else:
            node = raw.get("json") if in_body and isinstance(raw, Mapping) else raw
        for key in keys:
            if node.__class__ is not dict and (node is None or not isinstance(node, Mapping)):
                return _MISSING
            if key not in node:
                return _MISSING
            node = node[key]
        return node

    return read
