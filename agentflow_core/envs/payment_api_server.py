"""The payment HTTP JSON API that :class:`~agentflow_core.envs.payment_api.PaymentAPIEnv` talks to.

A real server on ``127.0.0.1`` (port 0 = a free port): ``http.server.ThreadingHTTPServer`` in a
daemon thread. One server per process is shared by every env (:func:`acquire_shared_server` /
:func:`release_shared_server`, refcounted), each env holding one *episode* on it, addressed by the
``X-Episode-Id`` header. The business process is the table of ``docs/ARCHITECTURE.md``.
``POST /episodes`` may carry ``"first": {"method": "GET", "path": ...}``: the client's first look
at the new episode, answered in the same reply (``"first": {"status", "body"}``) exactly as a
separate GET at step 0 without faults would be -- a reset then costs one round trip, not two.

Network faults are carried in the request, drawn by the client from its seeded generator, so a
seed fixes them: ``X-Fault: drop | status=<5xx> | none`` and ``X-Fault-Latency: <seconds>``. The
server never sleeps: it echoes the simulated latency in ``X-Sim-Latency``; a dropped request, or
one whose latency exceeds the client's ``X-Request-Timeout`` (deadline propagation), is *not
applied* and is answered with ``X-Sim-Outcome: dropped`` / ``deadline_exceeded`` and no body --
the client reads that as "no response" (a timeout). Business randomness (card declines) comes
from a per-episode generator seeded by the client at episode creation. ``X-Step`` is the agent's
logical clock: session and pending-order ages are counted in steps, as in the other channels.

Hardening (the server is reachable by every local process): it binds loopback only; an episode
id is a 128-bit random bearer token known only to the client that created it (replace and delete
need it too), so a second local client cannot address another env's order; an episode unused for
``episode_ttl_s`` expires and at most ``MAX_EPISODES`` live at once; bodies over
``MAX_BODY_BYTES`` are refused unread; and every malformed request (bad header values, bad JSON,
a fault status outside 500-599, unknown fields) gets a well-formed 4xx reply, never a dropped
connection or an invalid status line.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from agentflow_core.envs.base import Scenario

logger = logging.getLogger("agentflow.payment_api")

ORDER_EXPIRY_STEPS = 15
CART_LIMIT = 10
NEXT_PRODUCT_STOCK = 20
IDEMPOTENCY_CACHE = 8
MAX_BODY_BYTES = 64 * 1024
MAX_EPISODES = 16_384
EPISODE_TTL_S = 600.0
MAX_STEP = 10**9

Response = tuple[int, dict[str, Any] | None, dict[str, str]]


@dataclass
class _Episode:
    """Server-side business state of one env's episode."""

    scenario: Scenario
    rng: np.random.Generator
    session: str = "none"  # none | active | expired | blocked
    login_step: int = 0
    product_index: int | None = None
    stock: list[int] = field(default_factory=list)
    cart_items: int = 0
    order: dict[str, Any] | None = None
    order_seq: int = 0
    payment: str = "none"  # none | form_loaded | declined | failed | insufficient_funds | topped_up | captured
    card: str = "primary"
    balance: float = 0.0
    escalation: dict[str, str] | None = None
    closed: bool = False
    replies: OrderedDict[str, Response] = field(default_factory=OrderedDict)

    @property
    def due(self) -> float:
        if self.order is not None:
            return float(self.order["total"])
        return self.cart_items * self.scenario.unit_price or self.scenario.unit_price


def _new_episode(scenario: Scenario, seed: int) -> _Episode:
    ep = _Episode(
        scenario=scenario,
        rng=np.random.default_rng(seed),
        balance=scenario.balance,
        stock=[scenario.inventory, max(scenario.inventory, NEXT_PRODUCT_STOCK)],
    )
    stage = scenario.start_stage
    if stage == "login":
        return ep
    if scenario.user_tier == "blocked":
        ep.session = "blocked"  # a blocked account never holds a live session
        return ep
    ep.session, ep.product_index = "active", 1
    if stage in ("checkout", "payment"):
        ep.cart_items, ep.stock[1] = 1, ep.stock[1] - 1
    if stage == "payment":
        _create_order(ep, step=0)
        ep.payment = "form_loaded"
    return ep


def _create_order(ep: _Episode, step: int) -> None:
    ep.order_seq += 1
    total = round(ep.cart_items * ep.scenario.unit_price, 2)
    ep.order = {"id": f"ord-{ep.order_seq}", "status": "pending", "total": total, "created_step": step}
    ep.payment = "none"


def _age(ep: _Episode, step: int) -> None:
    """Lazy expiry on the agent's logical clock: sessions and pending orders time out."""
    if ep.session == "active" and step - ep.login_step > ep.scenario.session_timeout_steps:
        ep.session = "expired"
    if (
        ep.order is not None
        and ep.order["status"] == "pending"
        and step - ep.order["created_step"] > ORDER_EXPIRY_STEPS
    ):
        ep.order["status"] = "expired"
        ep.payment = "none"


def _view(ep: _Episode, **extra: Any) -> dict[str, Any]:
    """The resource state every business response carries (the client's view of its account)."""
    session: dict[str, Any] = {"status": ep.session, "logged_in": ep.session == "active"}
    body: dict[str, Any] = {"session": session}
    if ep.session != "active":
        body.update(extra)
        return body
    tier = ep.scenario.user_tier
    session.update(tier=tier, is_vip=tier == "vip")
    order = None if ep.order is None else {k: ep.order[k] for k in ("id", "status", "total")}
    body.update(
        cart={
            "status": "filled" if ep.cart_items else "empty",
            "items": ep.cart_items,
            "total": round(ep.cart_items * ep.scenario.unit_price, 2),
        },
        order=order,
        payment={"status": ep.payment, "form_loaded": ep.payment not in ("none", "captured"), "card": ep.card},
        account={"balance": round(ep.balance, 2), "balance_ratio": round(ep.balance / ep.due, 4)},
        pricing={"list_price": round(100.0 * ep.scenario.price_factor, 2), "unit_price": ep.scenario.unit_price},
    )
    body.update(extra)
    return body


def _error(ep: _Episode, status: int, code: str, **extra: Any) -> Response:
    return status, _view(ep, error={"code": code}, **extra), {}


def _product(ep: _Episode) -> dict[str, Any]:
    index = ep.product_index or 0
    stock = ep.stock[index]
    return {
        "id": f"sku-{index + 1}",
        "status": "in_stock" if stock > 0 else "out_of_stock",
        "stock": stock,
        "price": ep.scenario.unit_price,
    }


def _authorised(ep: _Episode) -> Response | None:
    if ep.session == "blocked":
        return _error(ep, 403, "account_blocked")
    if ep.session == "expired":
        return _error(ep, 401, "session_expired")
    if ep.session != "active":
        return _error(ep, 401, "unauthenticated")
    return None


def _pending_order(ep: _Episode) -> Response | None:
    if ep.order is None or ep.order["status"] in ("paid", "cancelled"):
        return _error(ep, 409, "no_pending_order")
    if ep.order["status"] == "expired":
        return _error(ep, 409, "order_expired")
    return None


# ---------------------------------------------------------------------- business endpoints
def _login(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    if ep.scenario.user_tier == "blocked":
        ep.session = "blocked"
        return _error(ep, 403, "account_blocked")
    if ep.session == "active":
        return _error(ep, 409, "already_authenticated")
    ep.session, ep.login_step = "active", step
    return 200, _view(ep), {}


def _get_product(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    ep.product_index = 0 if ep.product_index is None else (ep.product_index + 1) % len(ep.stock)
    return 200, _view(ep, product=_product(ep)), {}


def _add_to_cart(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    if ep.product_index is None:
        return _error(ep, 409, "no_product_selected")
    if ep.stock[ep.product_index] <= 0:
        return _error(ep, 409, "out_of_stock", product=_product(ep))
    if ep.cart_items >= CART_LIMIT:
        return _error(ep, 409, "cart_full")
    ep.cart_items += 1
    ep.stock[ep.product_index] -= 1
    return 200, _view(ep), {}


def _empty_cart(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    if ep.cart_items == 0:
        return _error(ep, 409, "cart_empty")
    ep.stock[ep.product_index or 0] += ep.cart_items
    ep.cart_items = 0
    return 200, _view(ep), {}


def _get_cart(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    return 200, _view(ep), {}


def _checkout(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    if ep.cart_items == 0:
        return _error(ep, 409, "cart_empty")
    if ep.order is not None and ep.order["status"] == "pending":
        return _error(ep, 409, "order_exists")
    _create_order(ep, step)
    return 201, _view(ep), {}


def _payment_form(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    refused = _pending_order(ep)
    if refused:
        return refused
    ep.payment = "form_loaded"
    return 200, _view(ep), {}


def _submit_payment(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    refused = _pending_order(ep)
    if refused:
        return refused
    assert ep.order is not None
    if ep.payment == "none":
        return _error(ep, 409, "payment_form_not_loaded")
    if ep.payment in ("declined", "failed"):
        ep.payment = "failed"  # the same declined card, submitted again
        return _error(ep, 422, "payment_failed")
    total = float(ep.order["total"])
    if ep.balance < total:
        ep.payment = "insufficient_funds"
        return _error(ep, 402, "insufficient_funds")
    if ep.card == "primary" and ep.rng.random() < ep.scenario.card_decline_rate:
        ep.payment = "declined"
        return _error(ep, 422, "card_declined")
    ep.balance -= total
    ep.order["status"], ep.payment, ep.cart_items, ep.closed = "paid", "captured", 0, True
    return 200, _view(ep), {}


def _top_up(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    refused = _pending_order(ep)
    if refused:
        return refused
    shortfall = ep.due - ep.balance
    if shortfall <= 0:
        return _error(ep, 409, "no_shortfall")
    ep.balance += shortfall
    ep.payment = "topped_up"
    return 200, _view(ep), {}


def _switch_card(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    refused = _pending_order(ep)
    if refused:
        return refused
    if ep.payment == "none":
        return _error(ep, 409, "payment_form_not_loaded")
    ep.card, ep.payment = str(body.get("card", "backup")), "form_loaded"
    return 200, _view(ep), {}


def _cancel(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    if ep.order is None or ep.order["status"] not in ("pending", "expired"):
        return _error(ep, 409, "no_cancellable_order")
    ep.order["status"], ep.payment, ep.closed = "cancelled", "none", True
    return 200, _view(ep), {}


def _escalate(ep: _Episode, step: int, body: dict[str, Any]) -> Response:
    reason = "user_blocked" if ep.session == "blocked" else "customer_request"
    ep.escalation, ep.closed = {"status": "open", "reason": reason}, True
    return 200, _view(ep, escalation=ep.escalation), {}


def _order_status(ep: _Episode, order_id: str) -> Response:
    if ep.order is None or ep.order["id"] != order_id:
        return _error(ep, 404, "order_not_found")
    return 200, _view(ep), {}


# (method, path) -> (handler, needs an authorised session)
ROUTES: dict[tuple[str, str], tuple[Any, bool]] = {
    ("POST", "/session"): (_login, False),
    ("GET", "/product"): (_get_product, True),
    ("GET", "/cart"): (_get_cart, True),
    ("POST", "/cart"): (_add_to_cart, True),
    ("DELETE", "/cart"): (_empty_cart, True),
    ("POST", "/checkout"): (_checkout, True),
    ("GET", "/payment"): (_payment_form, True),
    ("POST", "/payment"): (_submit_payment, True),
    ("POST", "/payment/topup"): (_top_up, True),
    ("POST", "/payment/card"): (_switch_card, True),
    ("POST", "/order/cancel"): (_cancel, True),
    ("POST", "/escalate"): (_escalate, False),
}
ORDER_PREFIX = "/order/"


class BadRequest(ValueError):
    """A malformed request: answered with a 4xx status and an error code, never a dropped connection."""

    def __init__(self, code: str, status: int = 400) -> None:
        self.code, self.status = code, status
        super().__init__(code)


def _number(headers: Any, name: str, default: str, low: float, high: float) -> float:
    try:
        value = float(headers.get(name, default))
    except (TypeError, ValueError):
        raise BadRequest(f"invalid_{name.lower().replace('-', '_')}") from None
    if math.isnan(value) or not low <= value <= high:
        raise BadRequest(f"invalid_{name.lower().replace('-', '_')}")
    return value


class PaymentAPIState:
    """All episodes of one server, behind one lock (the handlers are short and CPU-bound).

    ``episodes`` is ordered by last use, so expiry pops from the front in O(1) per episode.
    """

    def __init__(self, episode_ttl_s: float = EPISODE_TTL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.episodes: OrderedDict[str, _Episode] = OrderedDict()
        self._last_used: dict[str, float] = {}
        self.episode_ttl_s, self.clock = episode_ttl_s, clock
        self.lock = threading.Lock()

    def _expire(self, now: float) -> None:
        while self.episodes:
            oldest = next(iter(self.episodes))
            if now - self._last_used[oldest] < self.episode_ttl_s:
                return
            del self.episodes[oldest], self._last_used[oldest]

    def _touch(self, episode_id: str) -> _Episode | None:
        """The episode of a bearer id (expired ones first removed), marked as just used."""
        now = self.clock()
        self._expire(now)
        ep = self.episodes.get(episode_id)
        if ep is not None:
            self.episodes.move_to_end(episode_id)
            self._last_used[episode_id] = now
        return ep

    def create(self, scenario: Scenario, seed: int, replace: str | None = None) -> str:
        """A new episode under a fresh random id; ``replace`` (the caller's previous id) is deleted."""
        with self.lock:
            if replace and self._touch(replace) is not None:
                del self.episodes[replace], self._last_used[replace]
            self._expire(self.clock())
            if len(self.episodes) >= MAX_EPISODES:
                raise BadRequest("too_many_episodes", 429)
            episode_id = f"ep-{secrets.token_urlsafe(16)}"
            self.episodes[episode_id] = _new_episode(scenario, seed)
            self._last_used[episode_id] = self.clock()
            return episode_id

    def delete(self, episode_id: str) -> bool:
        """End an episode now rather than at its TTL; False when the id is unknown or already expired."""
        with self.lock:
            if self._touch(episode_id) is None:
                return False
            del self.episodes[episode_id], self._last_used[episode_id]
            return True

    def handle(self, method: str, path: str, headers: Any, body: dict[str, Any]) -> Response:
        """Apply faults, then idempotency replay, then the business endpoint."""
        fault = headers.get("X-Fault", "none")
        latency = _number(headers, "X-Fault-Latency", "0", 0.0, 3600.0)
        deadline = _number(headers, "X-Request-Timeout", "inf", 0.0, math.inf)
        step = int(_number(headers, "X-Step", "0", 0, MAX_STEP))
        sim = {"X-Sim-Latency": f"{latency:.6f}"}
        if fault not in ("none", "drop") and not fault.startswith("status="):
            raise BadRequest("invalid_x_fault")
        if fault == "drop":
            return 200, None, {**sim, "X-Sim-Outcome": "dropped"}
        if latency > deadline:
            return 200, None, {**sim, "X-Sim-Outcome": "deadline_exceeded"}
        if fault.startswith("status="):
            code = fault.partition("=")[2]
            if not (code.isdigit() and len(code) == 3 and 500 <= int(code) <= 599):
                raise BadRequest("invalid_x_fault")  # status=0 must not become an invalid status line
            return int(code), {"error": {"code": "service_unavailable"}}, sim
        with self.lock:
            ep = self._touch(headers.get("X-Episode-Id", ""))
            if ep is None:
                return 404, {"error": {"code": "unknown_episode"}}, sim
            key = headers.get("Idempotency-Key")
            if key and key in ep.replies:
                status, reply, extra = ep.replies[key]
                return status, reply, {**extra, **sim, "Idempotent-Replayed": "true"}
            status, reply, extra = self._route(ep, method, path, step, body)
            if key:
                ep.replies[key] = (status, reply, extra)
                while len(ep.replies) > IDEMPOTENCY_CACHE:
                    ep.replies.popitem(last=False)
            return status, reply, {**extra, **sim}

    @staticmethod
    def _route(ep: _Episode, method: str, path: str, step: int, body: dict[str, Any]) -> Response:
        _age(ep, step)
        if method == "GET" and path.startswith(ORDER_PREFIX) and path != ORDER_PREFIX + "cancel":
            return _authorised(ep) or _order_status(ep, path[len(ORDER_PREFIX) :])
        route = ROUTES.get((method, path))
        if route is None:
            return _error(ep, 404, "not_found")
        handler, needs_session = route
        if ep.closed:
            return _error(ep, 409, "episode_closed")
        refused = _authorised(ep) if needs_session else None
        return refused or handler(ep, step, body)


_HTTP_VERSION = re.compile(r"HTTP/(\d{1,10})\.(\d{1,10})")
_HEADER_LINE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*")
MAX_HEADER_LINE = 65536  # the stdlib's limits (http.client._MAXLINE, _MAXHEADERS)
MAX_HEADERS = 100


_DATE_CACHE: list[Any] = [None, ""]  # [second, its Date header value]; one list, swapped whole


class _Headers(dict[str, str]):
    """Request headers by lower-cased name (the first of repeated ones), looked up case-insensitively."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


class _BadHeaders(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(message)


def _read_headers(rfile: Any) -> _Headers:
    """The header block of one request (RFC 9112 §5), up to the empty line."""
    headers = _Headers()
    lines = 0
    while True:
        line = rfile.readline(MAX_HEADER_LINE + 1)
        if len(line) > MAX_HEADER_LINE:
            raise _BadHeaders(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Line too long")
        if line in (b"\r\n", b"\n", b""):
            return headers
        lines += 1
        if lines > MAX_HEADERS:
            raise _BadHeaders(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE, "Too many headers")
        match = _HEADER_LINE.fullmatch(line.decode("iso-8859-1").rstrip("\r\n"))
        if match is None:  # no colon, a space before it, or an obsolete folded line (RFC 9112 §5.2)
            raise _BadHeaders(HTTPStatus.BAD_REQUEST, "Bad header line")
        headers.setdefault(match.group(1).lower(), match.group(2))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one TCP connection serves many requests
    default_request_version = "HTTP/1.1"  # stdlib's HTTP/0.9 default answers garbage with no status line
    disable_nagle_algorithm = True
    # A buffered writer: status line, headers and body leave in one send() when the handler flushes
    # after each request, instead of one for the headers and one for the body. Each segment wakes the
    # client thread, and in one process every wake-up is a GIL hand-off.
    wbufsize = 64 * 1024
    server: _Server
    raw_requestline: bytes  # set by handle_one_request before parse_request

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """The core prints nothing; access logs are off."""

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The ``Date`` header (RFC 9110 §6.6.1) has one-second resolution: format it once per second."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        second = int(time.time())
        cached = _DATE_CACHE
        if cached[0] != second:
            cached[:] = [second, super().date_time_string(second)]
        return str(cached[1])

    def parse_request(self) -> bool:
        """Request line and headers of one HTTP/1.x request; False (error sent) when malformed.

        Why not the stdlib's: it parses every header block with the ``email`` package's feed
        parser, about a third of this server's CPU per request. The checks are the stdlib's, minus
        HTTP/0.9 (a two-word request line is a 400 here) and folded header lines (a 400, RFC 9112 §5.2).
        """
        self.command, self.close_connection = "", True  # no command yet (send_error reads it)
        self.request_version = self.default_request_version
        self.requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if not words:
            return False
        version = _HTTP_VERSION.fullmatch(words[-1])
        if len(words) != 3 or version is None:
            self.send_error(HTTPStatus.BAD_REQUEST, f"Bad request syntax ({self.requestline[:100]!r})")
            return False
        if int(version.group(1)) >= 2:
            self.send_error(HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, f"Invalid HTTP version ({words[-1]})")
            return False
        self.command, self.path, self.request_version = words
        if self.path.startswith("//"):
            self.path = "/" + self.path.lstrip("/")  # as the stdlib: never a scheme-relative URL
        try:
            self.headers = _read_headers(self.rfile)  # type: ignore[assignment]
        except _BadHeaders as exc:
            self.send_error(exc.status, exc.message)
            return False
        connection = self.headers.get("Connection", "").lower()
        self.close_connection = connection == "close" or (
            (int(version.group(1)), int(version.group(2))) < (1, 1) and connection != "keep-alive"
        )
        if self.headers.get("Expect", "").lower() == "100-continue" and self.request_version >= "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def _read_json(self) -> dict[str, Any]:
        if "Transfer-Encoding" in self.headers:
            raise BadRequest("length_required", 411)  # bodies are Content-Length framed, never chunked
        raw = self.headers.get("Content-Length") or "0"
        if not raw.strip().isdigit():
            raise BadRequest("invalid_content_length")
        length = int(raw)
        if length > MAX_BODY_BYTES:
            self.close_connection = True  # the unread body must not be parsed as the next request
            raise BadRequest("body_too_large", 413)
        if not length:
            return {}
        try:
            data = json.loads(self.rfile.read(length))
        except (ValueError, RecursionError):
            raise BadRequest("invalid_json") from None
        if not isinstance(data, dict):
            raise BadRequest("invalid_json")
        return data

    def _reply(self, status: int, body: dict[str, Any] | None, headers: dict[str, str]) -> None:
        payload = b"" if body is None else json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if payload:
            self.wfile.write(payload)

    def _dispatch(self, method: str) -> None:
        try:
            self._reply(*self._respond(method))
        except BadRequest as exc:
            self._reply(exc.status, {"error": {"code": exc.code}}, {})
        except Exception:  # a bug must still answer: a dropped connection reads as a network fault
            logger.exception("payment API: error handling %s %s", method, self.path[:200])
            self._reply(500, {"error": {"code": "internal_error"}}, {})

    def _respond(self, method: str) -> Response:
        body = self._read_json()
        state = self.server.state
        path = self.path.split("?", 1)[0]
        if path == "/episodes" and method == "POST":
            try:
                scenario = Scenario.from_dict(body.get("scenario", {}))
                seed = int(body.get("seed", 0))
            except (TypeError, ValueError, OverflowError, AttributeError, KeyError):
                raise BadRequest("invalid_scenario") from None
            first = body.get("first")
            if first is not None and (
                not isinstance(first, dict) or first.get("method") != "GET" or not isinstance(first.get("path"), str)
            ):
                raise BadRequest("invalid_first")
            replace = body.get("replace")
            episode_id = state.create(scenario, seed % 2**63, replace if isinstance(replace, str) else None)
            if first is None:
                return 201, {"episode_id": episode_id}, {}
            # The client's first look at the new episode, answered with it (one round trip, not two):
            # the same route, at step 0 and without faults, as a separate GET would take.
            status, reply, _ = state.handle("GET", first["path"], {"X-Episode-Id": episode_id, "X-Step": "0"}, {})
            return 201, {"episode_id": episode_id, "first": {"status": status, "body": reply}}, {}
        if path.startswith("/episodes/") and method == "DELETE":
            found = state.delete(path[len("/episodes/") :])
            return 200 if found else 404, {"deleted": found}, {}
        return state.handle(method, path, self.headers, body)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: PaymentAPIState

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-reply is routine here; log it instead of printing a traceback."""
        logger.debug("payment API: error serving %s", client_address, exc_info=True)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # any other host name may resolve anywhere
        return False


class PaymentAPIServer:
    """One threaded HTTP server on 127.0.0.1 serving every episode of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        if not _is_loopback(host):
            raise ValueError(f"the payment API serves loopback only, got host {host!r}")
        self._httpd = _Server((host, port), _Handler)
        self._httpd.state = PaymentAPIState()
        self._thread: threading.Thread | None = None
        self.pid = os.getpid()

    @property
    def url(self) -> str:
        """Base URL the client talks to (the bound port, so port 0 gives the one the OS chose)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    @property
    def state(self) -> PaymentAPIState:
        """The episodes this server holds, for in-process inspection."""
        return self._httpd.state

    @property
    def running(self) -> bool:
        """Is the serving thread alive?"""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> PaymentAPIServer:
        """Serve in a daemon thread (idempotent)."""
        if not self.running:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="payment-api-server", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, close the listening socket and join the serving thread."""
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()


_shared_lock = threading.Lock()
_shared: PaymentAPIServer | None = None
_shared_refs = 0


def acquire_shared_server() -> PaymentAPIServer:
    """The process-wide server, started on first use; every acquire needs one release."""
    global _shared, _shared_refs
    with _shared_lock:
        if _shared is None or _shared.pid != os.getpid():  # a forked child starts its own
            _shared, _shared_refs = PaymentAPIServer().start(), 0
        _shared_refs += 1
        return _shared


def release_shared_server(server: PaymentAPIServer) -> bool:
    """Drop one reference; the last one stops the server. Returns whether it stopped."""
    global _shared, _shared_refs
    with _shared_lock:
        if server is not _shared:
            return False
        _shared_refs -= 1
        if _shared_refs > 0:
            return False
        _shared, _shared_refs = None, 0
    server.stop()
    return True


def shared_server_refs() -> int:
    """How many holders the process-wide server has (0 when none runs)."""
    with _shared_lock:
        return _shared_refs if _shared is not None else 0
