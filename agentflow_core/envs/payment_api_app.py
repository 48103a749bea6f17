"""The payment API's business side: episodes, endpoints and their rules, with no HTTP in it.

:class:`PaymentAPIState` answers ``(method, path, headers, body)`` for every episode of one server
(:mod:`agentflow_core.envs.payment_api_server` is the HTTP transport around it). Faults arrive in the
request (``X-Fault``, ``X-Fault-Latency``), business randomness comes from a per-episode generator
seeded at episode creation, and ``X-Step`` is the agent's logical clock.
"""

from __future__ import annotations

import math
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentflow_core.envs.base import Scenario

ORDER_EXPIRY_STEPS = 15
CART_LIMIT = 10
NEXT_PRODUCT_STOCK = 20
IDEMPOTENCY_CACHE = 8
MAX_BODY_BYTES = 64 * 1024
MAX_EPISODES = 16_384
MAX_EPISODES_PER_CLIENT = 256  # a client's own cap: one flooding client cannot take the others' room
MAX_CLIENTS = 1024
UNUSED_EPISODE_TTL_S = 10.0  # an episode nobody has sent a request to since its creation: gone in seconds
EPISODE_TTL_S = 600.0  # an episode in use (and a client) idle this long is gone: an agent may pause mid-episode
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

    Every episode belongs to the client that created it: a client registers first
    (:meth:`register_client`, ``POST /clients``) and sends its random token (``X-Client-Token``)
    with every request; an episode answers only its own client's token, so one local client can
    neither act on nor delete another's episodes even knowing their ids. A client holds at most
    ``MAX_EPISODES_PER_CLIENT`` episodes (429 ``client_quota`` to that client alone). An episode
    no request has reached since its creation expires after ``unused_ttl_s`` (seconds: what a flood
    leaves behind); one in use after ``episode_ttl_s`` (an agent pauses mid-episode for its update
    or an evaluation, and an episode lost to a timer would make a run depend on timing). ``episodes``,
    ``_unused`` and ``clients`` are ordered by last use (creation): expiry pops idle ones from the
    front in O(1) each, and when the server-wide caps are reached the least recently used episode
    (or client) is dropped to make room, never the new request refused -- so a client that keeps
    its episodes busy is never locked out by another that floods.
    """

    def __init__(
        self,
        episode_ttl_s: float = EPISODE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        unused_ttl_s: float = UNUSED_EPISODE_TTL_S,
    ) -> None:
        self.episodes: OrderedDict[str, _Episode] = OrderedDict()
        self._unused: OrderedDict[str, float] = OrderedDict()  # episode id -> creation, until its first request
        self.clients: OrderedDict[str, float] = OrderedDict()  # token -> last use
        self._last_used: dict[str, float] = {}
        self._owner: dict[str, str] = {}  # episode id -> client token
        self._held: dict[str, int] = {}  # client token -> live episodes
        self.episode_ttl_s, self.unused_ttl_s, self.clock = episode_ttl_s, unused_ttl_s, clock
        self.lock = threading.Lock()

    def _remove(self, episode_id: str) -> None:
        del self.episodes[episode_id], self._last_used[episode_id]
        self._unused.pop(episode_id, None)
        client = self._owner.pop(episode_id)
        self._held[client] -= 1

    def _drop_client(self, token: str) -> None:
        for episode_id in [e for e, c in self._owner.items() if c == token] if self._held.get(token) else []:
            self._remove(episode_id)
        del self.clients[token]
        self._held.pop(token, None)

    def _expire(self, now: float) -> None:
        while self._unused:
            oldest, created = next(iter(self._unused.items()))
            if now - created < self.unused_ttl_s:
                break
            self._remove(oldest)
        while self.episodes:
            oldest = next(iter(self.episodes))
            if now - self._last_used[oldest] < self.episode_ttl_s:
                break
            self._remove(oldest)
        while self.clients:  # a client is used whenever its episodes are: idle means none is left
            token, used = next(iter(self.clients.items()))
            if now - used < self.episode_ttl_s:
                return
            self._drop_client(token)

    def _known_client(self, token: str, now: float) -> bool:
        if token not in self.clients:
            return False
        self.clients.move_to_end(token)
        self.clients[token] = now
        return True

    def _touch(self, episode_id: str, client: str) -> _Episode | None:
        """The episode of a bearer id if ``client`` owns it (expired ones first removed), marked as just used."""
        now = self.clock()
        self._expire(now)
        ep = self.episodes.get(episode_id)
        if ep is None or self._owner.get(episode_id) != client or not self._known_client(client, now):
            return None
        self.episodes.move_to_end(episode_id)
        self._last_used[episode_id] = now
        self._unused.pop(episode_id, None)
        return ep

    def register_client(self) -> str:
        """A new client token; at ``MAX_CLIENTS`` the least recently used client (and its episodes) goes."""
        with self.lock:
            now = self.clock()
            self._expire(now)
            while len(self.clients) >= MAX_CLIENTS:
                self._drop_client(next(iter(self.clients)))
            token = f"cl-{secrets.token_urlsafe(16)}"
            self.clients[token], self._held[token] = now, 0
            return token

    def create(self, scenario: Scenario, seed: int, replace: str | None = None, *, client: str) -> str:
        """A new episode of ``client`` under a fresh random id; ``replace`` (its previous id) is deleted."""
        with self.lock:
            if replace and self._touch(replace, client) is not None:
                self._remove(replace)
            now = self.clock()
            self._expire(now)
            if not self._known_client(client, now):
                raise BadRequest("unknown_client", 401)
            if self._held[client] >= MAX_EPISODES_PER_CLIENT:
                raise BadRequest("client_quota", 429)
            while len(self.episodes) >= MAX_EPISODES:
                self._remove(next(iter(self.episodes)))
            episode_id = f"ep-{secrets.token_urlsafe(16)}"
            self.episodes[episode_id] = _new_episode(scenario, seed)
            self._last_used[episode_id], self._owner[episode_id] = now, client
            self._unused[episode_id] = now
            self._held[client] += 1
            return episode_id

    def delete(self, episode_id: str, client: str) -> bool:
        """End an episode now rather than at its TTL; False when unknown, expired or another client's."""
        with self.lock:
            if self._touch(episode_id, client) is None:
                return False
            self._remove(episode_id)
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
            ep = self._touch(headers.get("X-Episode-Id", ""), headers.get("X-Client-Token", ""))
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
