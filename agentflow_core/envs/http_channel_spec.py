"""The generic HTTP channel's document: requests, value templates, reply reading, labelled audit samples.

Everything here is data from an env config's ``spec`` (see :mod:`agentflow_core.envs.http_channel`
for the whole form), parsed once into frozen records; an unknown key, a malformed request or a
template that is not one of the four forms below is a ``ValueError`` naming where it is, raised when
the registry loads the config (:meth:`HttpChannelEnv.check_spec`), not in a worker.

A **value template** is any JSON value; inside it a string ``"${...}"`` is replaced by a value, and
only these placeholders exist (nothing is evaluated, a config holds no code)::

    ${scenario}          the episode's scenario fields, as an object
    ${scenario.FIELD}    one scenario field
    ${seed}              an integer drawn from the episode's generator (seeded by reset)
    ${saved.NAME}        a value an earlier reply of the episode saved (a request's ``save``)

A string that is exactly one placeholder becomes the value with its type; placeholders inside a longer
string are formatted into it. ``{NAME}`` in a request path (OpenAPI's path-template form) is filled
with the saved value ``NAME``, URL-quoted.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from agentflow_core.adapters.api import ParsedPath, parse_path
from agentflow_core.adapters.openapi_spec import operations
from agentflow_core.envs.http_client import BreakerConfig, ClientConfig, Outcome, RetryPolicy

_PLACEHOLDER = re.compile(r"\$\{([^{}]*)\}")
_ALLOWED = re.compile(r"scenario(\.[A-Za-z][A-Za-z0-9_]*)?|seed|saved\.[A-Za-z][A-Za-z0-9_]*")
_PATH_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
REQUEST_KEYS = frozenset({"type", "method", "path", "operation", "body", "query", "headers", "save", "hide"})
NATIVE_KEYS = REQUEST_KEYS | {"requires", "note"}  # an api mapping's action may also carry its availability
CLIENT_KEYS = {
    "timeout_s": float,
    "max_retries": int,
    "backoff_base_s": float,
    "backoff_factor": float,
    "backoff_max_s": float,
    "failure_threshold": int,
    "cooldown_s": float,
    "max_idle_connections": int,
}
REPLY_KEYS = frozenset(
    {"reward", "done", "failure_reason", "error", "default_reward", "applied_reasons", "status_reasons"}
)
AUDIT_KEYS = frozenset({"base", "states"})
STATE_KEYS = frozenset({"token", "status", "set", "outcome"})


# ---------------------------------------------------------------------------------------------- templates
def check_template(value: Any, where: str) -> None:
    """Refuse any ``${...}`` that is not one of the four placeholder forms (recursively through the value)."""
    if isinstance(value, str):
        for match in _PLACEHOLDER.finditer(value):
            if not _ALLOWED.fullmatch(match.group(1)):
                raise ValueError(
                    f"{where}: placeholder {match.group(0)[:60]!r} is not one of ${{scenario}}, ${{scenario.FIELD}}, "
                    "${seed}, ${saved.NAME} (a config holds values, never code)"
                )
        if "${" in _PLACEHOLDER.sub("", value):
            raise ValueError(f"{where}: unclosed placeholder in {value[:60]!r}")
    elif isinstance(value, Mapping):
        for key, item in value.items():
            check_template(item, f"{where}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_template(item, f"{where}[{index}]")
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise ValueError(f"{where}: got {type(value).__name__}, expected JSON data")


@dataclass
class TemplateContext:
    """What placeholders read: the scenario, the saved reply fields, and a seed source."""

    scenario: Mapping[str, Any]
    saved: dict[str, Any]
    draw_seed: Callable[[], int]

    def lookup(self, name: str) -> Any:
        """The value of one placeholder (already checked against the grammar)."""
        if name == "seed":
            return self.draw_seed()
        if name == "scenario":
            return dict(self.scenario)
        source, _, key = name.partition(".")
        values = self.scenario if source == "scenario" else self.saved
        if key not in values:
            raise KeyError(f"${{{name}}}: no {source} value {key!r} (have {sorted(values)[:20]})")
        return values[key]


def render(value: Any, context: TemplateContext) -> Any:
    """The template with every placeholder replaced (see the module docstring)."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value)
        if whole is not None:
            return context.lookup(whole.group(1))
        return _PLACEHOLDER.sub(lambda m: str(context.lookup(m.group(1))), value)
    if isinstance(value, Mapping):
        return {key: render(item, context) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item, context) for item in value]
    return value


def fill_path(path: str, saved: Mapping[str, Any]) -> str:
    """``/orders/{order_id}`` with the saved ``order_id``, URL-quoted."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in saved:
            raise KeyError(f"path {path!r}: no saved value {name!r} (have {sorted(saved)[:20]})")
        return quote(str(saved[name]), safe="")

    return _PATH_PARAM.sub(one, path)


def read_path(parsed: ParsedPath, body: Any) -> Any:
    """The value at a body path (``$.a.b``), None when absent."""
    node = body
    for key in parsed[1]:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return node


# ---------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class RequestSpec:
    """One request: method and path (or an OpenAPI ``operation``), templates, what its reply saves and hides."""

    method: str
    path: str
    body: Any = None
    query: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, Any] = field(default_factory=dict)
    save: tuple[tuple[str, ParsedPath], ...] = ()
    hide: tuple[str, ...] = ()


def _mapping_of(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: got {type(value).__name__}, expected a mapping")
    return value


def _unknown(section: Mapping[str, Any], allowed: frozenset[str] | set[str], where: str) -> None:
    unknown = sorted(set(section) - set(allowed))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}, expected a subset of {sorted(allowed)}")


def parse_request(raw: Any, where: str, operations_by_id: Mapping[str, tuple[str, str]] | None = None) -> RequestSpec:
    """Validate one request (a reset request or a mapping's native ``http`` action) into a :class:`RequestSpec`."""
    section = _mapping_of(raw, where)
    _unknown(section, NATIVE_KEYS, where)
    if "operation" in section:
        if operations_by_id is None:
            raise ValueError(f"{where}.operation: needs the service's OpenAPI spec (kwargs openapi or openapi_url)")
        if section["operation"] not in operations_by_id:
            raise ValueError(f"{where}.operation: {str(section['operation'])[:80]!r} is no operationId of the spec")
        method, path = operations_by_id[section["operation"]]
    else:
        method, path = str(section.get("method", "")).upper(), section.get("path")  # type: ignore[assignment]
    if method not in METHODS:
        raise ValueError(f"{where}.method: got {section.get('method')!r}, expected one of {sorted(METHODS)}")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"{where}.path: got {path!r}, expected a path starting with '/'")
    for key in ("body", "query", "headers", "path"):
        check_template(section.get(key), f"{where}.{key}")
    save = _mapping_of(section.get("save"), f"{where}.save")
    try:
        saved = tuple((str(name), parse_path(str(source))) for name, source in save.items())
    except ValueError as exc:
        raise ValueError(f"{where}.save: {exc}") from None
    hide = section.get("hide") or []
    if not isinstance(hide, list) or not all(isinstance(h, str) for h in hide):
        raise ValueError(f"{where}.hide: expected a list of top-level body keys")
    return RequestSpec(
        method,
        path,
        section.get("body"),
        _mapping_of(section.get("query"), f"{where}.query"),
        _mapping_of(section.get("headers"), f"{where}.headers"),
        saved,
        tuple(hide),
    )


# ---------------------------------------------------------------------------------------------- the spec
@dataclass(frozen=True)
class OperationTable:
    """The operations an OpenAPI spec declares: ids -> (method, path) and path templates per method."""

    by_id: Mapping[str, tuple[str, str]]
    patterns: tuple[tuple[str, re.Pattern[str], str], ...]

    @classmethod
    def of(cls, spec: Mapping[str, Any]) -> OperationTable:
        """Read a spec's ``paths`` (the spec arrives as data: parsed at the edge, or fetched as JSON)."""
        if not isinstance(spec.get("paths"), Mapping) or not str(spec.get("openapi", "")).startswith("3"):
            raise ValueError("openapi: expected an OpenAPI 3 document with paths")
        by_id, patterns = {}, []
        for path, method, operation in operations(spec):
            if isinstance(operation.get("operationId"), str):
                by_id[operation["operationId"]] = (method, path)
            pattern = re.compile("".join(_PATH_PARAM.sub("[^/]+", part) for part in re.split(r"(\{[^}]*\})", path)))
            patterns.append((method, pattern, path))
        return cls(by_id, tuple(patterns))

    def declares(self, method: str, path: str) -> bool:
        """Is ``method path`` (a filled path, query excluded) one of the spec's operations?"""
        return any(m == method and pattern.fullmatch(path) for m, pattern, _ in self.patterns)


# ---------------------------------------------------------------------------------------------- replies
@dataclass(frozen=True)
class ReplySpec:
    """How a reply reads as a step: body paths of the reward, done and failure reason, and the defaults."""

    reward: ParsedPath | None = None
    done: ParsedPath | None = None
    failure_reason: ParsedPath | None = None
    error: ParsedPath | None = None
    default_reward: float = -0.01
    applied_reasons: frozenset[str] = frozenset()
    status_reasons: Mapping[int, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Any, where: str) -> ReplySpec:
        """Validate the ``reply`` section."""
        section = _mapping_of(raw, where)
        _unknown(section, REPLY_KEYS, where)
        try:
            paths = {
                key: parse_path(str(section[key])) if key in section else None
                for key in ("reward", "done", "failure_reason", "error")
            }
            status_reasons = {int(k): str(v) for k, v in _mapping_of(section.get("status_reasons"), where).items()}
            default_reward = float(section.get("default_reward", cls.default_reward))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        applied = section.get("applied_reasons") or []
        if not isinstance(applied, list):
            raise ValueError(f"{where}.applied_reasons: expected a list of failure reasons")
        return cls(**paths, default_reward=default_reward, applied_reasons=frozenset(map(str, applied)),
                   status_reasons=status_reasons)  # fmt: skip


def client_config(raw: Any, where: str) -> ClientConfig:
    """The ``client`` section as the resilient client's config (timeouts, retries, breaker)."""
    section = _mapping_of(raw, where)
    _unknown(section, set(CLIENT_KEYS), where)
    try:
        values = {key: kind(section[key]) for key, kind in CLIENT_KEYS.items() if key in section}
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: {exc}") from None
    retry_keys = ("max_retries", "backoff_base_s", "backoff_factor", "backoff_max_s")
    breaker_keys = ("failure_threshold", "cooldown_s")
    return ClientConfig(
        timeout_s=values.get("timeout_s", ClientConfig.timeout_s),
        retry=RetryPolicy(**{k: values[k] for k in retry_keys if k in values}),
        breaker=BreakerConfig(**{k: values[k] for k in breaker_keys if k in values}),
        max_idle_connections=values.get("max_idle_connections", ClientConfig.max_idle_connections),
    )


def check_service_name(name: Any, where: str) -> str:
    """A service is named by its entry point (lower_snake_case), never by a module path."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{where}: got {str(name)[:80]!r}, expected the name of an installed entry point of group "
            "'agentflow.services' (lower_snake_case; a config never names code)"
        )
    return name


def audit_samples(raw: Any, where: str) -> list[tuple[dict[str, Any], str]]:
    """The ``audit`` section as the mapping audit's labelled exchanges: the ``base`` body with each state's ``set``."""
    section = _mapping_of(raw, where)
    _unknown(section, AUDIT_KEYS, where)
    base = _mapping_of(section.get("base"), f"{where}.base")
    states = section.get("states") or []
    if not isinstance(states, list):
        raise ValueError(f"{where}.states: expected a list")
    samples = []
    for index, state in enumerate(states):
        state = _mapping_of(state, f"{where}.states[{index}]")
        _unknown(state, STATE_KEYS, f"{where}.states[{index}]")
        if not isinstance(state.get("token"), str):
            raise ValueError(f"{where}.states[{index}].token: expected the token this exchange means")
        status = state.get("status", 200)
        if status is not None and (isinstance(status, bool) or not isinstance(status, int)):
            raise ValueError(f"{where}.states[{index}].status: expected an HTTP status code or null (no reply)")
        outcome = state.get("outcome") or (str(Outcome.of_status(status)) if status is not None else "timeout")
        body = _overlay(base, _mapping_of(state.get("set"), f"{where}.states[{index}].set"))
        exchange = {"status_code": status, "json": body if status is not None else {}, "endpoint": None,
                    "client": {"retries": 0, "outcome": outcome, "breaker": "closed"}}  # fmt: skip
        samples.append((exchange, state["token"]))
    return samples


def _overlay(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``top`` merged in, objects key by key."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        merged[key] = _overlay(below, value) if isinstance(below, Mapping) and isinstance(value, Mapping) else value
    return merged
