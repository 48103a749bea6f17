"""The mapping document: its JSON schema (what a template may add is its own), the comparison operators
of leaf rules, and validation with errors that carry the JSON path."""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Sequence
from typing import Any

import jsonschema

from agentflow_core.errors import MappingError
from agentflow_core.semantics import Vocabulary

# The comparison operators mapping rules may use ("op" in web and db conditions).
COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq,
    "!=": operator.ne,
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}
# The process-independent shape; :func:`mapping_schema` fills in one process's token, feature and action names.
MAPPING_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["family", "template", "version", "token_rules", "actions"],
    "additionalProperties": False,
    "properties": {
        "family": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
        "template": {"enum": ["web", "db", "api"]},
        "version": {"type": "integer", "minimum": 1},
        "description": {"type": "string"},
        "token_rules": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "when", "emit"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "when": {"type": "object"},
                    "emit": {"type": "array", "minItems": 1, "items": {"type": "string"}},
                    "note": {"type": "string"},
                },
            },
        },
        "feature_rules": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "feature", "source"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "feature": {"type": "string"},
                    "source": {"type": "string", "minLength": 1},
                    "scale": {"type": "number"},
                    "default": {"type": "number"},
                    "clip": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                },
            },
        },
        "unobservable_features": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
        "actions": {
            "type": "object",
            "propertyNames": {"type": "string"},
            "additionalProperties": {"type": "object", "required": ["type"]},
        },
        "reward": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"scale": {"type": "number"}},
        },
    },
}


def _json_path(path: Sequence[Any]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


@functools.cache
def mapping_schema(vocabulary: Vocabulary) -> dict[str, Any]:
    """:data:`MAPPING_SCHEMA` with a process's own tokens, features and actions as the allowed names."""
    schema = copy.deepcopy(MAPPING_SCHEMA)
    props = schema["properties"]
    props["token_rules"]["items"]["properties"]["emit"]["items"] = {"enum": list(vocabulary.tokens)}
    props["feature_rules"]["items"]["properties"]["feature"] = {"enum": list(vocabulary.features)}
    props["unobservable_features"]["items"] = {"enum": list(vocabulary.features)}
    props["actions"]["propertyNames"] = {"enum": list(vocabulary.actions)}
    return schema


def validate_mapping(
    mapping: Any, source: str, expected_template: str | None = None, *, vocabulary: Vocabulary
) -> dict[str, Any]:
    """Validate a mapping document against :data:`MAPPING_SCHEMA` (for ``vocabulary``); errors carry the JSON path."""
    validator = jsonschema.Draft202012Validator(mapping_schema(vocabulary))
    errors = sorted(validator.iter_errors(mapping), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        raise MappingError(source, _json_path(list(err.path)), err.message)
    if expected_template and mapping["template"] != expected_template:
        raise MappingError(source, "$.template", f"got {mapping['template']!r}, expected {expected_template!r}")
    ids = [r["id"] for r in mapping["token_rules"]] + [r["id"] for r in mapping.get("feature_rules", [])]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise MappingError(source, "$.token_rules", f"duplicate rule id(s) {dupes}")
    both = sorted(
        set(mapping.get("unobservable_features", [])) & {r["feature"] for r in mapping.get("feature_rules", [])}
    )
    if both:
        raise MappingError(source, "$.unobservable_features", f"{both[0]!r} is both read by a rule and unobservable")
    return dict(mapping)
