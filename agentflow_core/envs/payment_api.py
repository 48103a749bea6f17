"""The HTTP API channel: the online-order process as JSON requests against a real local server.

Raw observation = the last HTTP exchange::

    {"status_code": 402, "json": {...body...}, "endpoint": "/payment", "latency_s": 0.02,
     "sim_time_s": 1.3, "client": {"outcome": "client_error", "retries": 0, "breaker": "closed"}}

(``status_code`` and ``json`` are None when no answer came: timeout or open circuit.) Native
action: ``{"type": "http", "method": "POST", "path": "/payment", "body": {...}}``, or
``{"type": "retry"}`` (re-send the last request with its ``Idempotency-Key``, so a retried
payment can never charge twice). ``{order_id}`` in a path is filled with the current order's id.

Network faults are drawn here, from the generator created in ``reset``, once per attempt, and
sent to the server as headers (see :mod:`payment_api_server`): identical seeds give identical
episodes. Latency advances a simulated clock; nothing sleeps.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentflow_core.envs.base import (
    BLOCKED_ESCALATION_REWARD,
    CANCEL_REWARD,
    INAPPLICABLE_REWARD,
    NETWORK_DROP_RATE,
    NETWORK_LATENCY_S,
    STEP_REWARD,
    SUCCESS_REWARD,
    WRONG_ESCALATION_REWARD,
    Scenario,
    StepResult,
)
from agentflow_core.envs.http_client import (
    CircuitBreaker,
    ClientConfig,
    HttpResult,
    Outcome,
    ResilientClient,
    RetryPolicy,
    SimulatedClock,
)
from agentflow_core.envs.payment_api_server import PaymentAPIServer, acquire_shared_server, release_shared_server

FAMILY = "payment_api"
VERSION = 1

# 5xx share of requests per network condition (an overloaded upstream behind a lossy network).
NETWORK_5XX_RATE = {"normal": 0.0, "latency_500ms": 0.01, "packet_loss_5%": 0.03}
LATENCY_JITTER_SIGMA = 0.3  # log-normal jitter around the condition's base latency
THINK_TIME_S = 0.25  # simulated time between two agent actions (lets an open breaker cool down)

CANCEL_RISK = 0.5  # the declared risk of CANCEL_ORDER (semantics.ACTION_RISK), realised only when it applies

# The reset exchange per start stage: what the client fetches to see where it stands.
START_REQUEST = {
    "login": ("GET", "/cart"),
    "product_detail": ("GET", "/product"),
    "checkout": ("GET", "/cart"),
    "payment": ("GET", "/payment"),
}


def default_client_config() -> ClientConfig:
    """Env-mode client: 1 s timeout, breaker after 5 consecutive failures, safe methods (GET,
    DELETE) retried twice with backoff. Business POSTs are not retried by the client: their
    failure reaches the policy (NETWORK_TIMEOUT / SERVER_ERROR), whose RETRY re-sends them under
    the same ``Idempotency-Key``."""
    return ClientConfig(retry=RetryPolicy(retry_with_idempotency_key=False))


class PaymentAPIEnv:
    """Physical env of the ``payment_api`` family (see the module docstring)."""

    family = FAMILY
    version = VERSION

    def __init__(
        self, scenario: Scenario, env_id: str, server_url: str | None = None, client_config: ClientConfig | None = None
    ) -> None:
        self.scenario, self.env_id = scenario, env_id
        self._scenario_fields = scenario.to_dict()  # the frozen scenario as sent with every new episode
        self._server: PaymentAPIServer | None = None
        if server_url is None:
            self._server = acquire_shared_server()
            server_url = self._server.url
        self.server_url = server_url
        self.clock = SimulatedClock()
        self.client = ResilientClient(
            server_url, client_config or default_client_config(), self.clock, fault_source=self._draw_fault
        )
        self.np_random = np.random.default_rng()
        self.episode_id: str | None = None
        self.step_id = 0
        self.order_id: str | None = None
        self._last_request: tuple[str, str, dict[str, Any] | None, str | None] | None = None
        self._last_failed = False
        self._last_raw: dict[str, Any] = {}
        self._closed = False

    def reconfigure(self, scenario: Scenario, env_id: str) -> None:
        """Re-target this env to another variant; afterwards it behaves exactly like a fresh
        ``PaymentAPIEnv(scenario, env_id, ...)`` (the next ``reset`` replaces the server episode)."""
        if self._closed:
            raise RuntimeError(f"env {self.env_id}: reconfigure after close")
        self.scenario, self.env_id = scenario, env_id
        self._scenario_fields = scenario.to_dict()
        self.np_random = np.random.default_rng()
        self.step_id = 0
        self.order_id = None
        self._last_request = None
        self._last_failed = False
        self._last_raw = {}
        self.client.default_headers.pop("X-Episode-Id", None)  # a fresh client has none before reset

    # ------------------------------------------------------------------ faults
    def _draw_fault(self) -> dict[str, str]:
        """One attempt's network conditions, always three draws so the stream stays aligned."""
        network = self.scenario.network
        latency = NETWORK_LATENCY_S[network] * float(self.np_random.lognormal(0.0, LATENCY_JITTER_SIGMA))
        u = float(self.np_random.random())
        self.np_random.random()  # reserved draw (keeps the stream fixed if a fault kind is added)
        drop, error = NETWORK_DROP_RATE[network], NETWORK_5XX_RATE[network]
        fault = "drop" if u < drop else "status=503" if u < drop + error else "none"
        return {"X-Fault": fault, "X-Fault-Latency": f"{latency:.6f}"}

    # ------------------------------------------------------------------ episode
    def _register(self) -> None:
        """This env's client token (``X-Client-Token``): the server's episodes answer only their own client."""
        if self._server is not None:  # the process-wide server: no round trip needed
            token = self._server.state.register_client()
        else:
            reply = self.client.request("POST", "/clients", {}, faults=False)
            if reply.json is None or not isinstance(reply.json.get("client_token"), str):
                raise ConnectionError(
                    f"payment API at {self.server_url} did not register a client: {reply.outcome.value} {reply.status_code}"
                )
            token = reply.json["client_token"]
        self.client.default_headers["X-Client-Token"] = token

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """New server episode (replacing this env's previous one) and the first exchange."""
        self.np_random = np.random.default_rng(seed)
        server_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.clock.t = 0.0
        self.client.breaker = CircuitBreaker(self.client.config.breaker, self.clock)
        method, path = START_REQUEST[self.scenario.start_stage]
        # The first exchange (step 0, no faults) comes back with the new episode: one round trip per reset.
        request = {
            "scenario": self._scenario_fields,
            "seed": server_seed,
            "replace": self.episode_id,
            "first": {"method": method, "path": path},
        }
        if "X-Client-Token" not in self.client.default_headers:
            self._register()
        created = self.client.request("POST", "/episodes", request, faults=False)
        if created.status_code == 401:  # this env sat idle past the server's TTL: its client expired
            self._register()
            created = self.client.request("POST", "/episodes", request, faults=False)
        first = (created.json or {}).get("first")
        if created.json is None or "episode_id" not in created.json or not isinstance(first, dict):
            raise ConnectionError(
                f"payment API at {self.server_url} did not create an episode: {created.outcome.value} {created.status_code}"
            )
        self.episode_id = str(created.json["episode_id"])
        self.client.default_headers["X-Episode-Id"] = self.episode_id
        self.step_id, self.order_id, self._last_failed = 0, None, False
        self.clock.t = 0.0
        status = int(first["status"])
        result = HttpResult(
            Outcome.of_status(status), status, first["body"], {}, 0.0, 0.0, 1, 0, self.client.breaker.state
        )
        self.client.breaker.record(result.outcome.is_failure)
        self._last_request = (method, path, None, None)
        self._last_raw = self._raw(result, path)
        return self._last_raw, self._info(None)

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Send one native request; reward and termination follow the shared business table."""
        self.step_id += 1
        self.clock.elapse(THINK_TIME_S)
        kind = native_action.get("type")
        not_applicable = False
        if kind == "retry" and self._last_request is not None:
            not_applicable = not self._last_failed  # nothing to retry: a harmless replay
            method, path, body, key = self._last_request
        elif kind == "http":
            method = str(native_action["method"]).upper()
            path = str(native_action["path"]).replace("{order_id}", self.order_id or "none")
            body = copy.deepcopy(native_action.get("body"))
            key = f"{self.episode_id}-{self.step_id}" if method == "POST" else None
        else:
            return self._noop()
        headers = {"X-Step": str(self.step_id)}
        if key:
            headers["Idempotency-Key"] = key
        self._last_request = (method, path, body, key)
        result = self.client.request(method, path, body, headers)
        self._last_failed = result.outcome.is_failure or result.outcome is Outcome.CIRCUIT_OPEN
        raw = self._last_raw = self._raw(result, path)
        reward, terminated, failure = self._judge(result, path, not_applicable)
        truncated = not terminated and self.step_id >= self.scenario.max_episode_steps
        if truncated:
            failure = "max_steps"
        info = self._info(failure)
        info["applied"] = result.status_code is not None and 200 <= result.status_code < 300
        if failure == "order_cancelled":
            info["risk"] = CANCEL_RISK  # a paid-for order was really cancelled
        return StepResult(raw, reward, terminated, truncated, info)

    def _noop(self) -> StepResult:
        """An unknown native action: nothing is sent, the state is unchanged, the step is wasted."""
        truncated = self.step_id >= self.scenario.max_episode_steps
        return StepResult(
            copy.deepcopy(self._last_raw),
            INAPPLICABLE_REWARD,
            False,
            truncated,
            self._info("max_steps" if truncated else None),
        )

    def _judge(self, result: HttpResult, path: str, not_applicable: bool) -> tuple[float, bool, str | None]:
        """(reward, terminated, failure_reason) of one exchange, from status code and body."""
        body = result.json or {}
        status = result.status_code
        if status == 200 and path == "/payment" and (body.get("order") or {}).get("status") == "paid":
            return SUCCESS_REWARD, True, None
        if status == 200 and path == "/order/cancel":
            return CANCEL_REWARD, True, "order_cancelled"
        if status == 200 and path == "/escalate":
            if (body.get("escalation") or {}).get("reason") == "user_blocked":
                return BLOCKED_ESCALATION_REWARD, True, "user_blocked"
            return WRONG_ESCALATION_REWARD, True, "escalated"
        code = (body.get("error") or {}).get("code")
        refused = status in (403, 409) and path != "/session" or code == "unauthenticated" or status == 404
        return (INAPPLICABLE_REWARD if refused or not_applicable else STEP_REWARD), False, None

    def _raw(self, result: HttpResult, path: str) -> dict[str, Any]:
        order = (result.json or {}).get("order")
        if isinstance(order, dict) and order.get("id"):
            self.order_id = str(order["id"])
        return {
            "status_code": result.status_code,
            "json": result.json,
            "endpoint": path,
            "latency_s": round(result.latency_s, 6),
            "sim_time_s": round(self.clock.now(), 6),
            "client": {"outcome": result.outcome.value, "retries": result.retries, "breaker": result.breaker.value},
        }

    def _info(self, failure_reason: str | None) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "step_id": self.step_id,
            "failure_reason": failure_reason,
            "sim_time_s": round(self.clock.now(), 6),
        }

    def close(self) -> None:
        """Delete the server episode, release the connection pool and (last env) the shared server."""
        if self._closed:
            return
        self._closed = True
        if self.episode_id is not None:
            self.client.request("DELETE", f"/episodes/{self.episode_id}", faults=False)
        self.client.close()
        if self._server is not None:
            release_shared_server(self._server)
            self._server = None


def _exchange(
    status: int | None,
    body: dict[str, Any] | None,
    endpoint: str,
    outcome: str | None = None,
    retries: int = 0,
    breaker: str = "closed",
) -> dict[str, Any]:
    if outcome is None:
        outcome = (
            "ok"
            if status is not None and status < 400
            else "client_error"
            if status is not None and status < 500
            else "server_error"
        )
    return {
        "status_code": status,
        "json": body,
        "endpoint": endpoint,
        "latency_s": 0.02,
        "sim_time_s": 1.0,
        "client": {"outcome": outcome, "retries": retries, "breaker": breaker},
    }


def _body(
    session: str = "active",
    tier: str = "standard",
    cart: int = 0,
    order: str | None = None,
    payment: str = "none",
    **extra: Any,
) -> dict[str, Any]:
    """A response body of the server's shape (kept in step with ``payment_api_app._view``)."""
    if session != "active":
        return {"session": {"status": session, "logged_in": False}, **extra}
    return {
        "session": {"status": "active", "logged_in": True, "tier": tier, "is_vip": tier == "vip"},
        "cart": {"status": "filled" if cart else "empty", "items": cart, "total": 100.0 * cart},
        "order": None if order is None else {"id": "ord-1", "status": order, "total": 100.0},
        "payment": {"status": payment, "form_loaded": payment not in ("none", "captured"), "card": "primary"},
        "account": {"balance": 500.0, "balance_ratio": 1.0},
        "pricing": {"list_price": 100.0, "unit_price": 100.0},
        **extra,
    }


def _err(code: str) -> dict[str, Any]:
    return {"error": {"code": code}}


# Tokens the mapping can emit (RAW_STATES) that no semantic action leads to: the exploration coverage
# denominator leaves them out (docs/design.md §2.2). A 404 answers only GET /order/<id> or an unknown path,
# and no semantic action (mappings/payment_api_v1.json) requests either.
UNREACHABLE_TOKENS: dict[str, str] = {
    "PAGE_NOT_FOUND": "a 404 answers only GET /order/<id> or an unknown path; no semantic action requests either",
}

# Every raw state the channel produces, labelled with the token it must carry (mapping audit).
RAW_STATES: list[tuple[dict[str, Any], str]] = [
    (_exchange(401, _body("none", **_err("unauthenticated")), "/cart"), "LOGGED_OUT"),
    (_exchange(401, _body("expired", **_err("session_expired")), "/cart"), "SESSION_EXPIRED"),
    (_exchange(403, _body("blocked", **_err("account_blocked")), "/session"), "USER_BLOCKED"),
    (_exchange(200, _body(), "/session"), "LOGGED_IN"),
    (_exchange(200, _body(tier="vip"), "/session"), "VIP_USER"),
    (
        _exchange(200, _body(product={"id": "sku-1", "status": "in_stock", "stock": 20, "price": 100.0}), "/product"),
        "PRODUCT_VIEWED",
    ),
    (
        _exchange(
            200, _body(product={"id": "sku-1", "status": "out_of_stock", "stock": 0, "price": 100.0}), "/product"
        ),
        "OUT_OF_STOCK",
    ),
    (_exchange(200, _body(cart=1), "/cart"), "CART_FILLED"),
    (_exchange(409, _body(**_err("cart_empty")), "/checkout"), "LOGGED_IN"),
    (_exchange(201, _body(cart=1, order="pending"), "/checkout"), "ORDER_PENDING"),
    (_exchange(200, _body(cart=1, order="pending", payment="form_loaded"), "/payment"), "PAYMENT_PAGE"),
    (_exchange(200, _body(order="paid", payment="captured"), "/payment"), "PAYMENT_SUCCESS"),
    (
        _exchange(422, _body(cart=1, order="pending", payment="declined", **_err("card_declined")), "/payment"),
        "INVALID_CARD",
    ),
    (
        _exchange(422, _body(cart=1, order="pending", payment="failed", **_err("payment_failed")), "/payment"),
        "PAYMENT_FAILED",
    ),
    (
        _exchange(
            402, _body(cart=1, order="pending", payment="insufficient_funds", **_err("insufficient_funds")), "/payment"
        ),
        "INSUFFICIENT_FUNDS",
    ),
    (_exchange(200, _body(cart=1, order="pending", payment="topped_up"), "/payment/topup"), "FUNDS_TOPPED_UP"),
    (_exchange(409, _body(cart=1, order="expired", **_err("order_expired")), "/payment"), "ORDER_EXPIRED"),
    (_exchange(200, _body(cart=1, order="cancelled"), "/order/cancel"), "ORDER_CANCELLED"),
    (_exchange(200, _body(escalation={"status": "open", "reason": "customer_request"}), "/escalate"), "ESCALATED"),
    (
        _exchange(200, _body("blocked", escalation={"status": "open", "reason": "user_blocked"}), "/escalate"),
        "ESCALATED",
    ),
    (_exchange(None, None, "/payment", outcome="timeout"), "NETWORK_TIMEOUT"),
    (_exchange(None, None, "/product", outcome="timeout", retries=2), "NETWORK_TIMEOUT"),
    (_exchange(503, _err("service_unavailable"), "/checkout"), "SERVER_ERROR"),
    (_exchange(None, None, "/payment", outcome="circuit_open", breaker="open"), "SERVER_ERROR"),
    (_exchange(404, _body(**_err("order_not_found")), "/order/none"), "PAGE_NOT_FOUND"),
    (_exchange(404, _body(**_err("not_found")), "/nowhere"), "PAGE_NOT_FOUND"),
]
