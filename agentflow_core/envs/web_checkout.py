"""Web channel: a simulated storefront whose observations are rendered pages and actions are UI events.

The raw observation is a DOM-like dict (page name, title, visible text, form fields, buttons,
links, forms, a flash banner, cart count, balance, simulated clock and ``data`` attributes the page
carries for scripts). Native actions are UI events: ``click`` on a target, ``type`` into a field,
``submit`` a form, ``navigate`` to a URL, or ``noop``. The business process and its rewards are
exactly the table of ``docs/ARCHITECTURE.md``; network conditions are simulated by advancing
``sim_time_s`` (never by sleeping), and a lost or too-slow request shows a "Request timed out"
banner without being applied. All randomness comes from the generator made in :meth:`reset`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
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

FAMILY = "web_checkout"
VERSION = 2

CLIENT_TIMEOUT_S = 1.0
# Response times are lognormal around the condition's latency: with a 0.5 s median a spread of
# 0.45 puts ~6% of responses past the 1.0 s client timeout (the "latency_500ms" variant, docs/design.md §3.3).
LATENCY_SIGMA = 0.45
ORDER_TTL_STEPS = 15
ALTERNATIVE_STOCK = 20
TOP_UP_MIN = 100.0

CANCEL_RISK = 0.5

USERNAME = "demo"
PRIMARY_CARD = {"card_number": "4000 0000 0000 0002", "card_cvv": "123", "card_holder": "Demo User"}
BACKUP_CARD = {"card_number": "4242 4242 4242 4242", "card_cvv": "456", "card_holder": "Demo User"}
PRODUCT_NAMES = {1: "Espresso machine", 2: "Espresso machine (refurbished)"}
FIRST_ORDER_ID = 1001
_CARD_NUMBER_RE = re.compile(r"^\d{16}$")
_CVV_RE = re.compile(r"^\d{3}$")
_PRODUCT_URL_RE = re.compile(r"^/product/(\d+)$")

TIMEOUT_TEXT = "Request timed out. Check your connection and retry."
SESSION_EXPIRED_TEXT = "Your session has expired. Please sign in again."
DECLINED_TEXT = "Your card was declined (code 05). Try another card."
INVALID_CVV_TEXT = "Invalid CVV: the security code must be 3 digits."
PAYMENT_FAILED_TEXT = "Payment failed: the card number is incomplete. Check your card details or use another card."
LOGIN_ERROR_TEXT = "Please enter your username and password."


@dataclass
class WebState:
    """The server and browser state behind the rendered page (mutable, one per episode)."""

    page: str = "login"
    logged_in: bool = False
    login_step: int = 0
    product_id: int = 1
    stock: dict[int, int] = field(default_factory=lambda: {1: 20, 2: ALTERNATIVE_STOCK})
    cart_count: int = 0
    order_status: str | None = None  # None | "pending" | "paid" | "cancelled" | "expired"
    order_id: int = FIRST_ORDER_ID - 1
    order_step: int = 0
    order_total: float = 0.0
    balance: float = 500.0
    card: str = "primary"
    card_fields: dict[str, str] = field(default_factory=lambda: dict(PRIMARY_CARD))
    login_fields: dict[str, str] = field(default_factory=lambda: {"username": USERNAME, "password": "hunter2"})
    funds_error: bool = False
    return_page: str | None = None
    last_good_page: str = "login"
    pending_action: dict[str, Any] | None = None
    retries_used: int = 0
    sim_time_s: float = 0.0


@dataclass(frozen=True)
class _Outcome:
    reward: float = STEP_REWARD
    banner: dict[str, str] | None = None
    terminated: bool = False
    failure_reason: str | None = None
    applied: bool = True
    risk: float | None = None


_INAPPLICABLE = _Outcome(reward=INAPPLICABLE_REWARD, applied=False)
_TERMINAL_PAGES = ("confirmation", "order_cancelled", "support")


def _money(value: float) -> str:
    return f"${value:,.2f}"


def render(st: WebState, scenario: Scenario, banner: dict[str, str] | None = None) -> dict[str, Any]:
    """Render the current page as the DOM-like dict the agent observes (a pure function of the state)."""
    price = scenario.unit_price
    page = st.page
    pending = st.logged_in and st.order_status == "pending"
    header: list[str] = []
    links: list[str] = ["#contact-support"]
    if st.logged_in:
        vip = " · VIP member" if scenario.user_tier == "vip" else ""
        header.append(f"Signed in as {USERNAME}{vip} · Cart: {st.cart_count} item(s) · Wallet {_money(st.balance)}")
        links = ["#home", "#browse-products", "#view-cart", "#wallet", "#logout", "#contact-support"]
        if pending:
            header.append(f"Order #{st.order_id} awaiting payment ({_money(st.order_total)}).")
            links.append("#proceed-to-payment")
    fields: dict[str, str] = {}
    buttons: list[str] = []
    forms: list[str] = []
    title, body = _page_body(st, scenario, price, fields, buttons, forms)
    if page in _TERMINAL_PAGES:  # the episode is over: a bare result page, no navigation
        header, links = [], []
    if st.pending_action is not None and banner is not None and banner.get("text") == TIMEOUT_TEXT:
        buttons.append("#retry")
    text = " ".join([*header, title + ".", body, banner["text"] if banner else ""]).strip()
    total = st.order_total if st.order_status == "pending" else price * max(st.cart_count, 1)
    return {
        "page": page,
        "url": f"/product/{st.product_id}" if page == "product_detail" else _URLS[page],
        "title": title,
        "text": text,
        "fields": fields,
        "buttons": buttons,
        "links": links,
        "forms": forms,
        "banner": banner,
        "cart_count": st.cart_count,
        "balance": round(st.balance, 2),
        "sim_time_s": round(st.sim_time_s, 6),
        "data": {
            "user_logged_in": int(st.logged_in),
            "is_vip": int(st.logged_in and scenario.user_tier == "vip"),
            "payment_page_loaded": int(page == "payment"),
            "price_factor": scenario.price_factor,
            "unit_price": price,
            "order_total": round(st.order_total, 2) if st.order_status == "pending" else 0.0,
            "balance_ratio": round(st.balance / total, 4) if total > 0 else 0.0,
            "retries_used": st.retries_used,
        },
    }


_URLS = {
    "login": "/login",
    "account_blocked": "/account/blocked",
    "home": "/",
    "cart": "/cart",
    "checkout": "/checkout",
    "payment": "/payment",
    "top_up": "/account/top-up",
    "confirmation": "/order/confirmation",
    "order_cancelled": "/order/cancelled",
    "support": "/support",
    "not_found": "/404",
}


def _page_body(
    st: WebState, scenario: Scenario, price: float, fields: dict[str, str], buttons: list[str], forms: list[str]
) -> tuple[str, str]:
    """Title and main text of the page; fills its fields, buttons and forms in place."""
    page = st.page
    if page == "login":
        fields.update(st.login_fields)
        buttons.append("#login-btn")
        forms.append("login")
        return "Sign in", "Sign in to continue shopping. Username and password."
    if page == "account_blocked":
        buttons.append("#contact-support")
        return "Account blocked", "Your account has been blocked. Please contact support to restore access."
    if page == "home":
        return "Welcome back", "Browse our products to start an order."
    if page == "product_detail":
        return _product_detail_body(st, scenario, price, buttons)
    if page == "cart":
        if st.cart_count == 0:
            return "Your cart", "Your cart is empty."
        buttons.extend(("#checkout", "#remove-item"))
        return "Your cart", f"{st.cart_count} item(s), subtotal {_money(price * st.cart_count)}."
    if page == "checkout":
        buttons.extend(("#proceed-to-payment", "#cancel-order"))
        return "Checkout", f"Order #{st.order_id} created. Total {_money(st.order_total)}."
    if page == "payment":
        fields.update(st.card_fields)
        buttons.extend(("#pay-now", "#use-backup-card", "#cancel-order"))
        forms.append("payment")
        if st.funds_error:
            buttons.append("#top-up")
            forms.append("top_up")
        last4 = st.card_fields.get("card_number", "")[-4:]
        return (
            "Payment",
            f"Pay for order #{st.order_id}: {_money(st.order_total)} with your {st.card} card ending {last4}.",
        )
    if page == "top_up":
        fields["amount"] = f"{_top_up_amount(st):.2f}"
        buttons.append("#top-up")
        forms.append("top_up")
        if st.order_status == "pending":
            buttons.append("#pay-now")
        return "Wallet", f"Add funds to your wallet. Balance {_money(st.balance)}."
    if page == "confirmation":
        return "Thank you", f"Payment received. Order #{st.order_id} is paid: {_money(st.order_total)} charged."
    if page == "order_cancelled":
        return "Order cancelled", f"Order #{st.order_id} has been cancelled."
    if page == "support":
        return "Support", "A support agent will contact you shortly."
    buttons.append("#retry")
    return "Page not found", "404: the page you requested does not exist. Go back and try again."


def _product_detail_body(st: WebState, scenario: Scenario, price: float, buttons: list[str]) -> tuple[str, str]:
    """The product page: its text depends on tier and stock, and only a product in stock can be added."""
    name, stock = PRODUCT_NAMES[st.product_id], st.stock[st.product_id]
    vip_note = f" VIP price ({round((1 - scenario.vip_discount) * 100)}% off)." if scenario.user_tier == "vip" else ""
    if stock > 0:
        buttons.append("#add-to-cart")
        return name, f"Price {_money(price)}.{vip_note} In stock ({stock} left)."
    return name, f"Price {_money(price)}.{vip_note} Out of stock. See an alternative product."


def _top_up_amount(st: WebState) -> float:
    """Enough to cover the pending order with a margin, at least TOP_UP_MIN (rounded to 50)."""
    shortfall = st.order_total - st.balance if st.order_status == "pending" else 0.0
    return max(TOP_UP_MIN, math.ceil(max(shortfall, 0.0) / 50.0) * 50.0 + 50.0)


def initial_state(scenario: Scenario) -> WebState:
    """The state an episode starts in, from ``start_stage`` (blocked users always start signed out)."""
    st = WebState(stock={1: scenario.inventory, 2: ALTERNATIVE_STOCK}, balance=float(scenario.balance))
    if scenario.user_tier == "blocked" or scenario.start_stage == "login":
        return st
    st.logged_in, st.page = True, "product_detail"
    if scenario.start_stage in ("checkout", "payment"):
        st.cart_count, st.page = 1, "cart"
    if scenario.start_stage == "payment":
        st.order_status, st.order_id, st.order_total, st.page = (
            "pending",
            FIRST_ORDER_ID,
            scenario.unit_price,
            "payment",
        )
    st.last_good_page = st.page
    return st


class WebCheckoutEnv:
    """Simulated storefront implementing the shared order process through web UI events."""

    family = FAMILY
    version = VERSION

    def __init__(self, scenario: Scenario, env_id: str) -> None:
        self.scenario = scenario
        self.env_id = env_id
        self.np_random: np.random.Generator | None = None
        self._state: WebState | None = None
        self._obs: dict[str, Any] = {}
        self._step_id = 0
        self._done = False

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode at the scenario's ``start_stage``; the generator is (re)made here."""
        self.np_random = np.random.default_rng(seed)
        self._state = initial_state(self.scenario)
        self._step_id = 0
        self._done = False
        self._obs = render(self._state, self.scenario)
        return self._obs, self._info(None, applied=True)

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Apply one UI event; latency advances the simulated clock, a lost request is not applied."""
        if self._state is None or self._done:
            raise RuntimeError(
                f"env {self.env_id}: step() called {'before reset()' if self._state is None else 'after the episode ended'}"
            )
        self._step_id += 1
        outcome = self._dispatch(dict(native_action))
        truncated = not outcome.terminated and self._step_id >= self.scenario.max_episode_steps
        failure_reason = outcome.failure_reason or ("max_steps" if truncated else None)
        self._done = outcome.terminated or truncated
        self._obs = render(self._state, self.scenario, outcome.banner)
        info = self._info(failure_reason, applied=outcome.applied)
        if outcome.risk is not None:
            info["risk"] = outcome.risk
        return StepResult(self._obs, outcome.reward, outcome.terminated, truncated, info)

    def reconfigure(self, scenario: Scenario, env_id: str) -> None:
        """Re-target this env to another variant: exactly a fresh ``WebCheckoutEnv(scenario, env_id)``."""
        self.scenario, self.env_id = scenario, env_id
        self.np_random = None
        self._state = None
        self._obs = {}
        self._step_id = 0
        self._done = False

    def close(self) -> None:
        """Nothing to release: the storefront lives in memory."""
        self._state = None

    # ------------------------------------------------------------------ internals
    def _info(self, failure_reason: str | None, applied: bool) -> dict[str, Any]:
        assert self._state is not None
        return {
            "env_id": self.env_id,
            "step_id": self._step_id,
            "failure_reason": failure_reason,
            "sim_time_s": round(self._state.sim_time_s, 6),
            "page": self._state.page,
            "applied": applied,
        }

    def _on_page(self, kind: str, action: dict[str, Any]) -> bool:
        """Is the clicked element / submitted form / typed field on the page the agent is looking at?"""
        obs = self._obs
        if kind == "click":
            target = action.get("target")
            return target in obs["buttons"] or target in obs["links"]
        if kind == "submit":
            return action.get("form") in obs["forms"]
        return action.get("field") in obs["fields"]

    def _dispatch(self, action: dict[str, Any]) -> _Outcome:
        st = self._state
        assert st is not None
        kind = action.get("type")
        if kind == "noop":
            return _Outcome()
        if kind not in ("click", "type", "submit", "navigate"):
            raise ValueError(
                f"unknown web action type {kind!r} in {action!r}; expected click|type|submit|navigate|noop"
            )
        if kind != "navigate" and not self._on_page(kind, action):
            return _INAPPLICABLE
        if kind == "type":  # client side: no request, no latency
            target = st.login_fields if st.page == "login" else st.card_fields
            target[str(action["field"])] = str(action.get("text", ""))
            return _Outcome()
        if not self._request_succeeds():
            if action.get("target") != "#retry":
                st.pending_action = action
            return _Outcome(banner={"kind": "error", "text": TIMEOUT_TEXT}, applied=False)
        if action.get("target") == "#retry":
            st.retries_used += 1
            if st.pending_action is not None:  # re-issue the request the timeout swallowed
                action = st.pending_action
        interrupted = self._server_checks()
        if interrupted is not None:
            st.pending_action = None
            return interrupted
        return self._apply(action)

    def _request_succeeds(self) -> bool:
        """One simulated HTTP round trip: advance the clock; False when dropped or past the client timeout."""
        st, rng = self._state, self.np_random
        assert st is not None and rng is not None
        network = self.scenario.network
        dropped = rng.random() < NETWORK_DROP_RATE[network]
        latency = NETWORK_LATENCY_S[network] * math.exp(LATENCY_SIGMA * float(rng.standard_normal()))
        if dropped or latency > CLIENT_TIMEOUT_S:
            st.sim_time_s += CLIENT_TIMEOUT_S
            return False
        st.sim_time_s += latency
        return True

    def _server_checks(self) -> _Outcome | None:
        """Session and order expiry, checked by the server on every request before the action."""
        st = self._state
        assert st is not None
        if st.logged_in and self._step_id - st.login_step > self.scenario.session_timeout_steps:
            st.logged_in, st.return_page, st.page = False, st.page, "login"
            return _Outcome(banner={"kind": "warning", "text": SESSION_EXPIRED_TEXT}, applied=False)
        if st.logged_in and st.order_status == "pending" and self._step_id - st.order_step > ORDER_TTL_STEPS:
            st.order_status, st.page, st.funds_error = "expired", "cart", False
            text = f"Your order #{st.order_id} has expired. Please check out again."
            return _Outcome(banner={"kind": "error", "text": text}, applied=False)
        return None

    def _apply(self, action: dict[str, Any]) -> _Outcome:
        st = self._state
        assert st is not None
        st.pending_action = None
        kind = action["type"]
        if kind == "navigate":
            return self._navigate(str(action.get("url", "")))
        handler = _SUBMIT_HANDLERS[action["form"]] if kind == "submit" else _CLICK_HANDLERS[action["target"]]
        return handler(self)

    def _goto(self, page: str, banner: dict[str, str] | None = None) -> _Outcome:
        st = self._state
        assert st is not None
        if page != "payment":
            st.funds_error = False
        st.page = page
        if page != "not_found":
            st.last_good_page = page
        return _Outcome(banner=banner)

    # ------------------------------------------------------------------ UI handlers
    def _login(self) -> _Outcome:
        st = self._state
        assert st is not None
        if not st.login_fields.get("username") or not st.login_fields.get("password"):
            return _Outcome(banner={"kind": "error", "text": LOGIN_ERROR_TEXT})
        if self.scenario.user_tier == "blocked":
            return self._goto("account_blocked")
        st.logged_in, st.login_step = True, self._step_id
        page, st.return_page = st.return_page or "home", None
        return self._goto(page)

    def _browse(self) -> _Outcome:
        st = self._state
        assert st is not None
        if st.page == "product_detail" and st.stock[st.product_id] == 0:
            in_stock = [p for p in sorted(st.stock) if st.stock[p] > 0 and p != st.product_id]
            st.product_id = in_stock[0] if in_stock else st.product_id
        return self._goto("product_detail")

    def _add_to_cart(self) -> _Outcome:
        st = self._state
        assert st is not None
        st.stock[st.product_id] -= 1
        st.cart_count += 1
        return self._goto("cart")

    def _remove_item(self) -> _Outcome:
        st = self._state
        assert st is not None
        st.cart_count -= 1
        return self._goto("cart")

    def _checkout(self) -> _Outcome:
        st = self._state
        assert st is not None
        if st.order_status != "pending":
            st.order_id += 1
            st.order_status, st.order_step = "pending", self._step_id
            st.order_total = round(self.scenario.unit_price * st.cart_count, 2)
        return self._goto("checkout")

    def _pay(self) -> _Outcome:
        st, rng = self._state, self.np_random
        assert st is not None and rng is not None
        number = st.card_fields.get("card_number", "").replace(" ", "")
        if not _CARD_NUMBER_RE.match(number):
            return self._goto("payment", {"kind": "error", "text": PAYMENT_FAILED_TEXT})
        if not _CVV_RE.match(st.card_fields.get("card_cvv", "")):
            return self._goto("payment", {"kind": "error", "text": INVALID_CVV_TEXT})
        if st.order_total > st.balance + 1e-9:
            self._goto("payment")
            st.funds_error = True
            text = f"Insufficient funds: your balance {_money(st.balance)} is below the order total {_money(st.order_total)}. Top up your wallet to continue."
            return _Outcome(banner={"kind": "error", "text": text})
        if st.card == "primary" and rng.random() < self.scenario.card_decline_rate:
            return self._goto("payment", {"kind": "error", "text": DECLINED_TEXT})
        st.balance = round(st.balance - st.order_total, 2)
        st.order_status, st.cart_count = "paid", 0
        self._goto("confirmation")
        return _Outcome(reward=SUCCESS_REWARD, terminated=True)

    def _use_backup_card(self) -> _Outcome:
        st = self._state
        assert st is not None
        st.card, st.card_fields = "backup", dict(BACKUP_CARD)
        return self._goto("payment", {"kind": "info", "text": "Backup card selected."})

    def _top_up(self) -> _Outcome:
        st = self._state
        assert st is not None
        amount = _top_up_amount(st)
        st.balance = round(st.balance + amount, 2)
        text = f"Funds added: {_money(amount)}. Your balance is now {_money(st.balance)}."
        return self._goto("top_up", {"kind": "success", "text": text})

    def _cancel_order(self) -> _Outcome:
        st = self._state
        assert st is not None
        st.order_status = "cancelled"
        self._goto("order_cancelled")
        return _Outcome(reward=CANCEL_REWARD, terminated=True, failure_reason="order_cancelled", risk=CANCEL_RISK)

    def _contact_support(self) -> _Outcome:
        st = self._state
        assert st is not None
        blocked = st.page == "account_blocked"
        self._goto("support")
        if blocked:
            return _Outcome(reward=BLOCKED_ESCALATION_REWARD, terminated=True, failure_reason="user_blocked")
        return _Outcome(reward=WRONG_ESCALATION_REWARD, terminated=True, failure_reason="escalated")

    def _retry(self) -> _Outcome:
        st = self._state
        assert st is not None
        if st.page == "not_found":
            return self._goto(st.last_good_page)
        return self._goto(st.page)

    def _logout(self) -> _Outcome:
        st = self._state
        assert st is not None
        st.logged_in = False
        return self._goto("login")

    def _navigate(self, url: str) -> _Outcome:
        """Route a URL; pages that need a session redirect to sign-in, unknown URLs are a 404."""
        st = self._state
        assert st is not None
        path = url.split("?", 1)[0].rstrip("/") or "/"
        product = _PRODUCT_URL_RE.match(path)
        if path == "/login":
            return self._goto("home" if st.logged_in else "login")
        if product is None and path not in _ROUTES:
            return self._goto("not_found")
        if product is not None and int(product.group(1)) not in st.stock:
            return self._goto("not_found")
        if not st.logged_in:
            st.return_page = "home"
            return self._goto("login")
        if product is not None:
            st.product_id = int(product.group(1))
            return self._goto("product_detail")
        page = _ROUTES[path]
        if page in ("checkout", "payment") and st.order_status != "pending":
            page = "cart"
        return self._goto(page)


_ROUTES = {"/": "home", "/cart": "cart", "/checkout": "checkout", "/payment": "payment", "/account/top-up": "top_up"}
_Handler = Callable[[WebCheckoutEnv], _Outcome]
_CLICK_HANDLERS: dict[str, _Handler] = {
    "#login-btn": WebCheckoutEnv._login,
    "#home": lambda env: env._goto("home"),
    "#browse-products": WebCheckoutEnv._browse,
    "#view-cart": lambda env: env._goto("cart"),
    "#wallet": lambda env: env._goto("top_up"),
    "#add-to-cart": WebCheckoutEnv._add_to_cart,
    "#remove-item": WebCheckoutEnv._remove_item,
    "#checkout": WebCheckoutEnv._checkout,
    "#proceed-to-payment": lambda env: env._goto("payment"),
    "#pay-now": WebCheckoutEnv._pay,
    "#use-backup-card": WebCheckoutEnv._use_backup_card,
    "#top-up": WebCheckoutEnv._top_up,
    "#cancel-order": WebCheckoutEnv._cancel_order,
    "#contact-support": WebCheckoutEnv._contact_support,
    "#retry": WebCheckoutEnv._retry,
    "#logout": WebCheckoutEnv._logout,
}
_SUBMIT_HANDLERS: dict[str, _Handler] = {
    "login": WebCheckoutEnv._login,
    "payment": WebCheckoutEnv._pay,
    "top_up": WebCheckoutEnv._top_up,
}


def _error(text: str) -> dict[str, str]:
    return {"kind": "error", "text": text}


def _labelled_raw_states() -> list[tuple[dict[str, Any], str]]:
    """One rendered sample per raw state the storefront can show, with the token it should carry."""
    std, vip, out = Scenario(), Scenario(user_tier="vip"), Scenario(inventory=0)
    signed_in = WebState(logged_in=True, page="home")
    filled = replace(signed_in, cart_count=1)
    pending = replace(filled, order_status="pending", order_id=FIRST_ORDER_ID, order_total=100.0)
    paying = replace(pending, page="payment")
    return [
        (render(WebState(), std), "LOGGED_OUT"),
        (render(WebState(), std, _error(LOGIN_ERROR_TEXT)), "LOGGED_OUT"),
        (render(WebState(), std, {"kind": "warning", "text": SESSION_EXPIRED_TEXT}), "SESSION_EXPIRED"),
        (
            render(replace(WebState(), pending_action={"type": "submit", "form": "login"}), std, _error(TIMEOUT_TEXT)),
            "NETWORK_TIMEOUT",
        ),
        (render(WebState(page="account_blocked"), Scenario(user_tier="blocked")), "USER_BLOCKED"),
        (render(signed_in, std), "LOGGED_IN"),
        (render(replace(signed_in, page="cart"), std), "LOGGED_IN"),
        (render(signed_in, vip), "VIP_USER"),
        (render(replace(signed_in, page="product_detail"), std), "PRODUCT_VIEWED"),
        (render(replace(signed_in, page="product_detail"), vip), "PRODUCT_VIEWED"),
        (render(replace(signed_in, page="product_detail", stock={1: 0, 2: ALTERNATIVE_STOCK}), out), "OUT_OF_STOCK"),
        (render(replace(filled, page="cart"), std), "CART_FILLED"),
        (render(replace(pending, page="checkout"), std), "CHECKOUT_STARTED"),
        (render(pending, std), "ORDER_PENDING"),
        (render(replace(pending, page="top_up"), std), "ORDER_PENDING"),
        (render(paying, std), "PAYMENT_PAGE"),
        (render(paying, std, {"kind": "info", "text": "Backup card selected."}), "PAYMENT_PAGE"),
        (render(paying, std, _error(DECLINED_TEXT)), "INVALID_CARD"),
        (render(paying, std, _error(INVALID_CVV_TEXT)), "INVALID_CARD"),
        (render(paying, std, _error(PAYMENT_FAILED_TEXT)), "PAYMENT_FAILED"),
        (
            render(
                replace(paying, funds_error=True, balance=50.0),
                std,
                _error(
                    "Insufficient funds: your balance $50.00 is below the order total $100.00. Top up your wallet to continue."
                ),
            ),
            "INSUFFICIENT_FUNDS",
        ),
        (
            render(
                replace(pending, page="top_up", balance=200.0),
                std,
                {"kind": "success", "text": "Funds added: $150.00. Your balance is now $200.00."},
            ),
            "FUNDS_TOPPED_UP",
        ),
        (
            render(replace(paying, pending_action={"type": "click", "target": "#pay-now"}), std, _error(TIMEOUT_TEXT)),
            "NETWORK_TIMEOUT",
        ),
        (
            render(
                replace(filled, page="cart", order_status="expired", order_id=FIRST_ORDER_ID),
                std,
                _error(f"Your order #{FIRST_ORDER_ID} has expired. Please check out again."),
            ),
            "ORDER_EXPIRED",
        ),
        (render(replace(signed_in, page="not_found"), std), "PAGE_NOT_FOUND"),
        (render(WebState(page="not_found"), std), "PAGE_NOT_FOUND"),
        (render(replace(pending, page="confirmation", order_status="paid", cart_count=0), std), "PAYMENT_SUCCESS"),
        (render(replace(pending, page="order_cancelled", order_status="cancelled"), std), "ORDER_CANCELLED"),
        (render(replace(signed_in, page="support"), std), "ESCALATED"),
        (render(WebState(page="support"), Scenario(user_tier="blocked")), "ESCALATED"),
    ]


@functools.cache
def _raw_states_cached() -> tuple[tuple[dict[str, Any], str], ...]:
    return tuple(_labelled_raw_states())


RAW_STATES: list[tuple[dict[str, Any], str]]  # built on first access (module __getattr__): no work at import


def __getattr__(name: str) -> Any:
    """Lazily provide ``RAW_STATES`` so importing the module renders nothing."""
    if name == "RAW_STATES":
        return list(_raw_states_cached())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
