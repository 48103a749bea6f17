"""Reading an OpenAPI 3 spec for the mapping generator (``openapi``): its operations, refs and properties.

The spec arrives as a dict (YAML parsing happens at the CLI edge) from elsewhere, so every walk
here tolerates what a spec may hold: local ``$ref``s are followed with cycles cut at the first
repeat, remote refs read as empty, and :func:`check_shape` turns a container of the wrong type
into one :class:`~agentflow_core.errors.MappingError` naming the key before generation walks it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from agentflow_core.errors import MappingError

HTTP_METHODS = ("get", "post", "put", "patch", "delete")


def words_of(text: str) -> set[str]:
    """``createSession`` / ``/payment/top_up`` / ``{order_id}`` -> lower-case words (joined forms too)."""
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", text.lower()) if p]
    return set(parts) | {"".join(parts[i : i + 2]) for i in range(len(parts) - 1)}


def resolve_ref(
    spec: Mapping[str, Any], schema: Any, seen: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], frozenset[str]]:
    """Follow local ``$ref``s (``#/components/...``); cycles stop at the first repeat."""
    while isinstance(schema, Mapping) and "$ref" in schema:
        ref = str(schema["$ref"])
        if ref in seen or not ref.startswith("#/"):
            return {}, seen
        seen = seen | {ref}
        node: Any = spec
        for part in ref[2:].split("/"):
            node = node.get(part, {}) if isinstance(node, Mapping) else {}
        schema = node
    return (dict(schema) if isinstance(schema, Mapping) else {}), seen


def schema_properties(
    spec: Mapping[str, Any], schema: Any, path: tuple[str, ...] = (), seen: frozenset[str] = frozenset()
) -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """Every (property path from the body root, property schema), through refs and combinators."""
    schema, seen = resolve_ref(spec, schema, seen)
    for combinator in ("allOf", "oneOf", "anyOf"):
        for sub in schema.get(combinator, ()):
            yield from schema_properties(spec, sub, path, seen)
    for name, sub in (schema.get("properties") or {}).items():
        resolved, sub_seen = resolve_ref(spec, sub, seen)
        yield (*path, name), resolved
        yield from schema_properties(spec, resolved, (*path, name), sub_seen)


def operations(spec: Mapping[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every (path, upper-case method, operation) of the spec, in spec order."""
    for path, item in (spec.get("paths") or {}).items():
        for method in HTTP_METHODS:
            if isinstance(item, Mapping) and isinstance(item.get(method), Mapping):
                yield str(path), method.upper(), dict(item[method])


def example_body(spec: Mapping[str, Any], operation: Mapping[str, Any]) -> dict[str, Any] | None:
    """The documented request example, else required properties from their example/default/enum."""
    request, _ = resolve_ref(spec, operation.get("requestBody"))
    media = (request.get("content") or {}).get("application/json")
    if not isinstance(media, Mapping):
        return None
    if isinstance(media.get("example"), Mapping):
        return dict(media["example"])
    schema, _ = resolve_ref(spec, media.get("schema"))
    if isinstance(schema.get("example"), Mapping):
        return dict(schema["example"])
    body: dict[str, Any] = {}
    for name in schema.get("required", ()):
        prop, _ = resolve_ref(spec, (schema.get("properties") or {}).get(name, {}))
        for key in ("example", "default"):
            if key in prop:
                body[name] = prop[key]
                break
        else:
            if prop.get("enum"):
                body[name] = prop["enum"][0]
    return body


def response_schemas(spec: Mapping[str, Any]) -> Iterator[Any]:
    """The schema of every JSON response any operation documents."""
    for _, _, operation in operations(spec):
        for response in (operation.get("responses") or {}).values():
            resolved, _ = resolve_ref(spec, response)
            media = (resolved.get("content") or {}).get("application/json")
            if isinstance(media, Mapping) and "schema" in media:
                yield media["schema"]


def body_properties(spec: Mapping[str, Any]) -> dict[tuple[str, ...], dict[str, Any]]:
    """Every property any JSON response documents, first description wins, in spec order."""
    found: dict[tuple[str, ...], dict[str, Any]] = {}
    for schema in response_schemas(spec):
        for path, prop in schema_properties(spec, schema):
            found.setdefault(path, prop)
    return found


def check_shape(spec: Mapping[str, Any]) -> None:
    """The containers generation walks are mappings: ``paths: [..]`` is one MappingError naming the key."""
    parts: list[tuple[str, Any]] = [
        ("$.paths", spec.get("paths") or {}),
        ("$.components", spec.get("components") or {}),
    ]
    paths = spec.get("paths")
    if isinstance(paths, Mapping):
        for path, item in paths.items():
            parts.append((f"$.paths[{str(path)[:80]!r}]", item))
            for method in HTTP_METHODS:
                operation = item.get(method) if isinstance(item, Mapping) else None
                if isinstance(operation, Mapping) and "responses" in operation:
                    parts.append((f"$.paths[{str(path)[:80]!r}].{method}.responses", operation["responses"] or {}))
    for where, value in parts:
        if not isinstance(value, Mapping):
            raise MappingError("<openapi>", where, f"got {type(value).__name__}, expected a mapping")
