"""The ``api`` template: status-code and JSON-path rules over one HTTP exchange.

A raw observation of an API channel is the last exchange (see
:mod:`agentflow_core.envs.payment_api`). Leaf conditions:

* ``{"status": 402}`` or ``{"status": [401, 403]}`` -- the response status code;
* ``{"status_range": [500, 599]}`` -- inclusive range;
* ``{"json_path": "$.order.status", "equals": "paid"}`` / ``"in": [...]`` / ``"exists": true``.

Paths starting ``$.`` read the response body; paths starting ``@.`` read the exchange envelope
(``@.client.outcome``, ``@.client.retries``, ``@.endpoint``, ``@.latency_s``). Feature sources use
the same paths. Paths are split once, when the mapping is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from agentflow_core.adapters.base import BaseSemanticAdapter

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
        ]
    }

    def __init__(self, mapping: Mapping[str, Any], source: str = "<mapping>") -> None:
        super().__init__(mapping, source)
        self._paths: dict[str, ParsedPath] = {}
        for rule in self.token_rules:
            self._collect(rule["when"])
        for rule in self.feature_rules:
            self._paths[rule["source"]] = parse_path(rule["source"])

    def _collect(self, when: Mapping[str, Any]) -> None:
        for combinator in ("all", "any"):
            for sub in when.get(combinator, ()):
                self._collect(sub)
        if "not" in when:
            self._collect(when["not"])
        if "json_path" in when:
            self._paths[when["json_path"]] = parse_path(when["json_path"])

    def _path(self, path: str) -> ParsedPath:
        parsed = self._paths.get(path)
        if parsed is None:
            parsed = self._paths[path] = parse_path(path)
        return parsed

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
        if "equals" in when:
            return bool(value == when["equals"])
        return value in when["in"]

    def extract(self, source: str, raw: Any) -> float | None:
        """The number at a JSON path (booleans read as 0/1); None when absent or not numeric."""
        value = _lookup(self._path(source), raw)
        if value is _MISSING or value is None or isinstance(value, (dict, list, str)):
            return None
        return float(value)
