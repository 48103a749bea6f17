"""The generic HTTP channel: any JSON service driven by data -- requests per action, a reset, the client's resilience.

An env config names ``agentflow_core.envs.http_channel:HttpChannelEnv`` with the ``api`` adapter and
gives the channel's document as ``spec`` (inline, or a file inside the config directory, read by the
registry); ``configs/refund/envs/refund_api_v1.yaml`` is one::

    kwargs:
      base_url: http://127.0.0.1:8765   # optional: a running service (else the document's service)
    spec:
      service: refund                   # an installed entry point (group agentflow.services) started in-process
      openapi_url: /openapi.json        # the service's spec, fetched from it
      client: {timeout_s: 5.0, max_retries: 0, failure_threshold: 5, cooldown_s: 0.5}
      reset:                            # the request that opens an episode; its reply is the first observation
        method: POST
        path: /episodes
        body: {scenario: "${scenario}", seed: "${seed}"}
        save: {episode_id: $.episode_id, client_token: $.client_token}
        hide: [episode_id, client_token]
      headers: {X-Episode-Id: "${saved.episode_id}"}   # sent with every later request
      reply: {reward: $.reward, done: $.done, failure_reason: $.failure_reason, default_reward: -0.05}
      audit: {base: {...reply body...}, states: [{token: SIGNED_OUT, status: 401}, ...]}   # the audit's samples

The document may instead be the service's OpenAPI spec itself (a file beside the env config), with
the settings above under its top-level ``x-agentflow-channel``: its ``paths`` are then the operations
every request is checked against when the registry loads the config.

The requests of the semantic actions are the ``api`` mapping's native actions, in the same form as
``reset``: ``{"type": "http", "method": "POST", "path": "/refunds/{order_id}", "body": {...}}`` or
``{"type": "http", "operation": "submitRequest"}`` (an operationId of the spec), and
``{"type": "retry"}``, which re-sends the last request when it failed (5xx, timeout, refused, open
breaker). Values in bodies, queries, headers and paths are templates over the scenario, a seed and
fields saved from earlier replies (:mod:`~agentflow_core.envs.http_channel_spec`); nothing in the
document is code. With a spec, a request that is none of its operations is refused.

Transport is :class:`~agentflow_core.envs.http_client.ResilientClient` on real time: per-request
timeout, automatic retries of idempotent methods with backoff (``client.max_retries``) and a circuit
breaker. The raw observation is the last exchange, in the shape the ``api`` mapping reads::

    {"status_code": 422, "json": {...reply body...}, "endpoint": "/refunds/submit",
     "client": {"retries": 0, "outcome": "client_error", "breaker": "closed"}}

(``status_code`` None and ``json`` empty when no reply came.) ``client.retries`` counts the episode's
re-sends (the RETRY action's and the client's own). The step reward is the reply's ``reply.reward``
field, else ``reply.default_reward``; an action with no request to make (a RETRY with nothing failed)
earns :data:`~agentflow_core.envs.base.INAPPLICABLE_REWARD`. A step is ``applied`` when the reply is
2xx and its failure reason is none or one of ``reply.applied_reasons``.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote

import numpy as np

from agentflow_core.envs.base import INAPPLICABLE_REWARD, StepResult
from agentflow_core.envs.http_channel_spec import (
    OperationTable,
    ReplySpec,
    RequestSpec,
    TemplateContext,
    audit_samples,
    check_service_name,
    check_template,
    client_config,
    fill_path,
    parse_request,
    read_path,
    render,
)
from agentflow_core.envs.http_client import HttpResult, Outcome, ResilientClient
from agentflow_core.semantics import Vocabulary

FAMILY = "http_channel"
VERSION = 1
SERVICE_ENTRY_POINTS = "agentflow.services"
SETTINGS = frozenset({"service", "openapi_url", "client", "reset", "headers", "reply", "audit"})
CHANNEL_ANNOTATION = "x-agentflow-channel"  # the settings inside an OpenAPI document used as the channel
RETRYABLE = frozenset({Outcome.SERVER_ERROR, Outcome.TIMEOUT, Outcome.CONNECTION_ERROR, Outcome.CIRCUIT_OPEN})
FAILURE_REASONS = {
    Outcome.TIMEOUT: "network_timeout",
    Outcome.CONNECTION_ERROR: "connection_error",
    Outcome.CIRCUIT_OPEN: "circuit_open",
    Outcome.SERVER_ERROR: "server_error",
}
SEED_HIGH = 2**62
ERROR_CHARS = 80


class ScenarioLike(Protocol):
    """What the channel reads of a scenario (checkout's ``Scenario`` and any process's ``ScenarioValues``)."""

    @property
    def max_episode_steps(self) -> int:
        """The step limit."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain data."""


_specs: dict[tuple[str, str], OperationTable] = {}
_specs_lock = threading.Lock()


@functools.cache
def _service_starter(name: str) -> Callable[[], Any]:
    """The entry point ``name`` of group ``agentflow.services``, looked up once per process."""
    from importlib.metadata import entry_points

    found = {ep.name: ep for ep in entry_points(group=SERVICE_ENTRY_POINTS)}
    if name not in found:
        raise ValueError(f"service: {name!r} is not an installed {SERVICE_ENTRY_POINTS} entry point: {sorted(found)}")
    starter: Callable[[], Any] = found[name].load()
    return starter


def start_service(name: str) -> str:
    """The base URL of the installed service ``name`` (entry point of group ``agentflow.services``), started once.

    The entry point is a callable returning the running service (an object with ``url``) or its URL; it
    runs in this process (a pool worker starts its own), and is expected to start the service only once.
    """
    running = _service_starter(name)()
    return str(running if isinstance(running, str) else running.url)


def fetch_operations(client: ResilientClient, path: str) -> OperationTable:
    """The service's own spec (JSON at ``path``), read once per base URL in this process."""
    key = (client.base_url, path)
    with _specs_lock:
        table = _specs.get(key)
    if table is None:
        reply = client.request("GET", path, faults=False)
        if not reply.ok or reply.json is None:
            raise RuntimeError(f"openapi_url: GET {client.base_url}{path} gave {reply.outcome} {reply.status_code}")
        table = OperationTable.of(reply.json)
        with _specs_lock:
            _specs[key] = table
    return table


def channel_document(spec: Any) -> tuple[Mapping[str, Any], OperationTable | None]:
    """(the channel's settings, the spec's operations) of a document: the settings themselves, or an OpenAPI
    spec carrying them under ``x-agentflow-channel``; every setting checked (a ``ValueError`` names it)."""
    if not isinstance(spec, Mapping):
        raise ValueError(f"expected the channel's document (a mapping), got {type(spec).__name__}")
    table = None
    if "openapi" in spec:
        table = OperationTable.of(spec)
        spec = spec.get(CHANNEL_ANNOTATION)
        if not isinstance(spec, Mapping):
            raise ValueError(
                f"{CHANNEL_ANNOTATION}: an OpenAPI document used as the channel says how to drive it there"
            )
    unknown = sorted(set(spec) - SETTINGS)
    if unknown:
        raise ValueError(f"unknown key(s) {unknown}, expected a subset of {sorted(SETTINGS)}")
    if "service" in spec:
        check_service_name(spec["service"], "service")
    parse_request(spec.get("reset"), "reset", table.by_id if table else None)
    check_template(spec.get("headers"), "headers")
    ReplySpec.parse(spec.get("reply"), "reply")
    client_config(spec.get("client"), "client")
    audit_samples(spec.get("audit"), "audit")
    return spec, table


class HttpChannelEnv:
    """Physical env of any JSON HTTP service, configured by data (see the module docstring)."""

    family = FAMILY
    version = VERSION

    @classmethod
    def check_spec(cls, spec: Any, vocabulary: Vocabulary, source: str = "<http>") -> None:
        """Validate the channel's document (the registry calls this when it loads the env config)."""
        try:
            settings, _ = channel_document(spec)
            for state in audit_samples(settings.get("audit"), "audit"):
                if state[1] not in vocabulary.tokens:
                    raise ValueError(f"audit: token {state[1]!r} is not one of the process's {list(vocabulary.tokens)}")
        except ValueError as exc:
            raise ValueError(f"{source}: {exc}") from None

    @classmethod
    def check_native(cls, spec: Mapping[str, Any], actions: Mapping[str, Any]) -> None:
        """The mapping's native actions are requests this document can send (and operations of its spec, if any)."""
        _, table = channel_document(spec)
        for name, native in actions.items():
            if native.get("type") == "retry":
                continue
            if native.get("type") != "http":
                raise ValueError(f"{name}: type {native.get('type')!r}, expected 'http' or 'retry'")
            request = parse_request(native, name, table.by_id if table else None)
            if table is not None and not table.declares(request.method, request.path):
                raise ValueError(f"{name}: {request.method} {request.path} is not an operation of the service's spec")

    @classmethod
    def raw_states(cls, spec: Mapping[str, Any], source: str = "<http>") -> list[tuple[dict[str, Any], str]]:
        """The mapping audit's labelled raw exchanges: the document's ``audit`` section."""
        return audit_samples(channel_document(spec)[0].get("audit"), "audit")

    def __init__(
        self, scenario: ScenarioLike, env_id: str, spec: Mapping[str, Any], base_url: str | None = None
    ) -> None:
        settings, self.operations = channel_document(spec)
        self.scenario, self.env_id = scenario, env_id
        if base_url is None and "service" not in settings:
            raise ValueError(f"env {env_id}: name the service: kwargs.base_url (a running one) or spec.service")
        base_url = base_url or start_service(str(settings["service"]))
        self.client = ResilientClient(base_url, client_config(settings.get("client"), "client"))
        if self.operations is None and "openapi_url" in settings:
            self.operations = fetch_operations(self.client, str(settings["openapi_url"]))
        operation_ids = self.operations.by_id if self.operations else None
        self.reset_request = parse_request(settings["reset"], "reset", operation_ids)
        self.headers: Mapping[str, Any] = settings.get("headers") or {}
        self.reply = ReplySpec.parse(settings.get("reply"), "reply")
        self._requests: dict[str, RequestSpec] = {}  # native actions parsed once, by their repr
        self.np_random = np.random.default_rng()
        self.saved: dict[str, Any] = {}
        self.step_id, self.retries = 0, 0
        self._last: RequestSpec | None = None
        self._last_outcome: Outcome | None = None

    def reconfigure(self, scenario: ScenarioLike, env_id: str) -> None:
        """Re-target to another variant; the next reset opens an episode for it."""
        self.scenario, self.env_id = scenario, env_id

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Send the reset request (the previous episode is left to the service) and observe its reply."""
        self.np_random = np.random.default_rng(seed)
        self.saved, self.step_id, self.retries = {}, 0, 0
        self._last, self._last_outcome = None, None
        result, endpoint = self._send(self.reset_request, with_session=False)
        if not result.ok or result.json is None:
            raise RuntimeError(
                f"env {self.env_id}: the service refused the reset: {result.outcome} {result.status_code} "
                f"{str(result.json)[:200]}"
            )
        return self._raw(result, endpoint), {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Send the action's request (or re-send the failed one) and read the reply as a step."""
        self.step_id += 1
        request: RequestSpec | None = None
        if native_action.get("type") == "http":
            request = self._request_of(native_action)
        elif native_action.get("type") == "retry" and self._last_outcome in RETRYABLE:
            request, self.retries = self._last, self.retries + 1
        if request is None:
            idle = {"status_code": None, "json": {}, "endpoint": None, "client": self._client_envelope(None)}
            return self._result(idle, INAPPLICABLE_REWARD, False, "not_applicable", applied=False)
        result, endpoint = self._send(request, with_session=True)
        self._last, self._last_outcome = request, result.outcome
        self.retries += result.retries
        raw = self._raw(result, endpoint)
        body = raw["json"]
        reason = self._failure_reason(result, body)
        reward = self._number(self.reply.reward, body, self.reply.default_reward)
        applied = result.ok and (reason is None or reason in self.reply.applied_reasons)
        done = bool(read_path(self.reply.done, body)) if self.reply.done else False
        return self._result(raw, reward, done, reason, applied)

    def close(self) -> None:
        """Release the client's connections (the service drops the episode when it expires)."""
        self.client.close()

    # ------------------------------------------------------------------ requests
    def _request_of(self, native_action: Mapping[str, Any]) -> RequestSpec:
        key = repr(sorted(native_action.items()))
        request = self._requests.get(key)
        if request is None:
            request = parse_request(native_action, "action", self.operations.by_id if self.operations else None)
            self._requests[key] = request
        return request

    def _send(self, request: RequestSpec, *, with_session: bool) -> tuple[HttpResult, str]:
        context = TemplateContext(self.scenario.to_dict(), self.saved, self._draw_seed)
        path = fill_path(render(request.path, context), self.saved)
        if self.operations is not None and not self.operations.declares(request.method, path):
            raise ValueError(f"env {self.env_id}: {request.method} {path} is not an operation of the service's spec")
        query = render(dict(request.query), context)
        target = path + ("?" + "&".join(f"{k}={v}" for k, v in _quoted(query)) if query else "")
        headers = {
            **(render(dict(self.headers), context) if with_session else {}),
            **render(dict(request.headers), context),
        }
        body = render(request.body, context) if request.body is not None else None
        result = self.client.request(request.method, target, body, {k: str(v) for k, v in headers.items()})
        if result.json is not None:
            for name, source in request.save:
                self.saved[name] = read_path(source, result.json)
            for key in request.hide:
                result.json.pop(key, None)
        return result, path

    def _draw_seed(self) -> int:
        return int(self.np_random.integers(0, SEED_HIGH))

    # ------------------------------------------------------------------ replies
    def _client_envelope(self, result: HttpResult | None) -> dict[str, Any]:
        return {
            "retries": self.retries,
            "outcome": None if result is None else str(result.outcome),
            "breaker": str(self.client.breaker.state),
        }

    def _raw(self, result: HttpResult, endpoint: str) -> dict[str, Any]:
        return {
            "status_code": result.status_code,
            "json": result.json if result.json is not None else {},
            "endpoint": endpoint,
            "client": self._client_envelope(result),
        }

    def _failure_reason(self, result: HttpResult, body: Mapping[str, Any]) -> str | None:
        status = result.status_code
        if status is not None and status in self.reply.status_reasons:
            return self.reply.status_reasons[status]
        reason = read_path(self.reply.failure_reason, body) if self.reply.failure_reason else None
        if reason is not None:
            return str(reason)
        if result.outcome in FAILURE_REASONS:
            return FAILURE_REASONS[result.outcome]
        if result.outcome is Outcome.CLIENT_ERROR:
            error = read_path(self.reply.error, body) if self.reply.error else None
            return str(error or "client_error")[:ERROR_CHARS]
        return None

    @staticmethod
    def _number(path: Any, body: Mapping[str, Any], default: float) -> float:
        value = read_path(path, body) if path else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default

    def _result(self, raw: dict[str, Any], reward: float, done: bool, reason: str | None, applied: bool) -> StepResult:
        truncated = not done and self.step_id >= self.scenario.max_episode_steps
        info = {"env_id": self.env_id, "step_id": self.step_id, "failure_reason": reason, "applied": applied}
        if truncated and reason is None:
            info["failure_reason"] = "max_steps"
        return StepResult(raw, reward, done, truncated, info)


def _quoted(query: Mapping[str, Any]) -> list[tuple[str, str]]:
    return [(quote(str(k), safe=""), quote(str(v), safe="")) for k, v in query.items()]
