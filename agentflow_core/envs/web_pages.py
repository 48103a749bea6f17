"""The storefront's pages: what a browser session holds (:class:`WebState`), how each page renders as
the DOM-like raw observation, and one rendered sample per raw state with the token it means."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from agentflow_core.envs.base import (
    Scenario,
)

ALTERNATIVE_STOCK = 20
TOP_UP_MIN = 100.0


USERNAME = "demo"
PRIMARY_CARD = {"card_number": "4000 0000 0000 0002", "card_cvv": "123", "card_holder": "Demo User"}
PRODUCT_NAMES = {1: "Espresso machine", 2: "Espresso machine (refurbished)"}
FIRST_ORDER_ID = 1001

TIMEOUT_TEXT = "Request timed out. Check your connection and retry."
SESSION_EXPIRED_TEXT = "Your session has expired. Please sign in again."
DECLINED_TEXT = "Your card was declined (code 05). Try another card."
INVALID_CVV_TEXT = "Invalid CVV: the security code must be 3 digits."
PAYMENT_FAILED_TEXT = "Payment failed: the card number is incomplete. Check your card details or use another card."
LOGIN_ERROR_TEXT = "Please enter your username and password."
_TERMINAL_PAGES = ("confirmation", "order_cancelled", "support")


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


def _money(value: float) -> str:
    return f"${value:,.2f}"


@dataclass(frozen=True)
class PageParts:
    """A rendered page before it is flattened: what the HTML storefront lays out and the dict joins.

    ``text`` of the raw observation is ``header`` lines, ``title + "."``, ``body`` and the banner text
    joined by spaces (:func:`render`); the real web app (``envs/web_app``) puts each part in its own
    element, so a DOM reader can rebuild the same text.
    """

    page: str
    url: str
    header: tuple[str, ...]
    title: str
    body: str
    banner: dict[str, str] | None
    fields: dict[str, str]
    buttons: tuple[str, ...]
    links: tuple[str, ...]
    forms: tuple[str, ...]
    data: dict[str, Any]


def page_parts(st: WebState, scenario: Scenario, banner: dict[str, str] | None = None) -> PageParts:
    """The current page's parts (a pure function of the state)."""
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
    total = st.order_total if st.order_status == "pending" else price * max(st.cart_count, 1)
    return PageParts(
        page=page,
        url=f"/product/{st.product_id}" if page == "product_detail" else _URLS[page],
        header=tuple(header),
        title=title,
        body=body,
        banner=banner,
        fields=fields,
        buttons=tuple(buttons),
        links=tuple(links),
        forms=tuple(forms),
        data={
            "user_logged_in": int(st.logged_in),
            "is_vip": int(st.logged_in and scenario.user_tier == "vip"),
            "payment_page_loaded": int(page == "payment"),
            "price_factor": scenario.price_factor,
            "unit_price": price,
            "order_total": round(st.order_total, 2) if st.order_status == "pending" else 0.0,
            "balance_ratio": round(st.balance / total, 4) if total > 0 else 0.0,
            "retries_used": st.retries_used,
        },
    )


def page_text(header: tuple[str, ...], title: str, body: str, banner: dict[str, str] | None) -> str:
    """The visible text of a page, from its parts (shared by :func:`render` and the browser's DOM reader)."""
    return " ".join([*header, title + ".", body, banner["text"] if banner else ""]).strip()


def render(st: WebState, scenario: Scenario, banner: dict[str, str] | None = None) -> dict[str, Any]:
    """Render the current page as the DOM-like dict the agent observes (a pure function of the state)."""
    parts = page_parts(st, scenario, banner)
    return {
        "page": parts.page,
        "url": parts.url,
        "title": parts.title,
        "text": page_text(parts.header, parts.title, parts.body, banner),
        "fields": parts.fields,
        "buttons": list(parts.buttons),
        "links": list(parts.links),
        "forms": list(parts.forms),
        "banner": banner,
        "cart_count": st.cart_count,
        "balance": round(st.balance, 2),
        "sim_time_s": round(st.sim_time_s, 6),
        "data": parts.data,
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
        return _cart_body(st, price, buttons)
    if page == "checkout":
        buttons.extend(("#proceed-to-payment", "#cancel-order"))
        return "Checkout", f"Order #{st.order_id} created. Total {_money(st.order_total)}."
    if page == "payment":
        return _payment_body(st, fields, buttons, forms)
    if page == "top_up":
        return _top_up_body(st, fields, buttons, forms)
    if page == "confirmation":
        return "Thank you", f"Payment received. Order #{st.order_id} is paid: {_money(st.order_total)} charged."
    if page == "order_cancelled":
        return "Order cancelled", f"Order #{st.order_id} has been cancelled."
    if page == "support":
        return "Support", "A support agent will contact you shortly."
    buttons.append("#retry")
    return "Page not found", "404: the page you requested does not exist. Go back and try again."


def _cart_body(st: WebState, price: float, buttons: list[str]) -> tuple[str, str]:
    """The cart: checkout and removal only when it holds something."""
    if st.cart_count == 0:
        return "Your cart", "Your cart is empty."
    buttons.extend(("#checkout", "#remove-item"))
    return "Your cart", f"{st.cart_count} item(s), subtotal {_money(price * st.cart_count)}."


def _payment_body(st: WebState, fields: dict[str, str], buttons: list[str], forms: list[str]) -> tuple[str, str]:
    """The payment page: the card form, and the wallet's top-up form after a funds error."""
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


def _top_up_body(st: WebState, fields: dict[str, str], buttons: list[str], forms: list[str]) -> tuple[str, str]:
    """The wallet page: the top-up form prefilled, and paying the pending order from there."""
    fields["amount"] = f"{_top_up_amount(st):.2f}"
    buttons.append("#top-up")
    forms.append("top_up")
    if st.order_status == "pending":
        buttons.append("#pay-now")
    return "Wallet", f"Add funds to your wallet. Balance {_money(st.balance)}."


def _product_detail_body(st: WebState, scenario: Scenario, price: float, buttons: list[str]) -> tuple[str, str]:
    """The product page: its text depends on tier and stock, and only a product in stock can be added."""
    name, stock = PRODUCT_NAMES[st.product_id], st.stock[st.product_id]
    vip_note = f" VIP price ({round((1 - scenario.vip_discount) * 100)}% off)." if scenario.user_tier == "vip" else ""
    if stock > 0:
        buttons.append("#add-to-cart")
        return name, f"Price {_money(price)}.{vip_note} In stock ({stock} left)."
    return name, f"Price {_money(price)}.{vip_note} Out of stock. See an alternative product."


def _top_up_amount(st: WebState) -> float:
    """The shortfall of the pending order (as the SQL and API channels top up), else TOP_UP_MIN."""
    shortfall = st.order_total - st.balance if st.order_status == "pending" else 0.0
    return round(shortfall, 2) if shortfall > 0 else TOP_UP_MIN


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
