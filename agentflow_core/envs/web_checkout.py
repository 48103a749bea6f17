"""Web channel: a simulated storefront whose observations are rendered pages and actions are UI events.

The raw observation is a DOM-like dict (page name, title, visible text, form fields, buttons,
links, forms, a flash banner, cart count, balance, simulated clock and ``data`` attributes the page
carries for scripts). Native actions are UI events: ``click`` on a target, ``type`` into a field,
``submit`` a form, ``navigate`` to a URL, or ``noop``. The business process and its rewards are
exactly the table of ``docs/architecture.md``; network conditions are simulated by advancing
``sim_time_s`` (never by sleeping), and a lost or too-slow request shows a "Request timed out"
banner without being applied. All randomness comes from the generator made in :meth:`reset`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
from agentflow_core.envs.web_pages import (
    DECLINED_TEXT,
    INVALID_CVV_TEXT,
    LOGIN_ERROR_TEXT,
    PAYMENT_FAILED_TEXT,
    SESSION_EXPIRED_TEXT,
    TIMEOUT_TEXT,
    WebState,
    _labelled_raw_states,
    _money,
    _top_up_amount,
    initial_state,
    render,
)

FAMILY = "web_checkout"
VERSION = 2

CLIENT_TIMEOUT_S = 1.0
# Response times are lognormal around the condition's latency: with a 0.5 s median a spread of
# 0.45 puts ~6% of responses past the 1.0 s client timeout (the "latency_500ms" variant, docs/design.md §3.3).
LATENCY_SIGMA = 0.45
ORDER_TTL_STEPS = 15
CANCEL_RISK = 0.5
BACKUP_CARD = {"card_number": "4242 4242 4242 4242", "card_cvv": "456", "card_holder": "Demo User"}
_CARD_NUMBER_RE = re.compile(r"^\d{16}$")
_CVV_RE = re.compile(r"^\d{3}$")
_PRODUCT_URL_RE = re.compile(r"^/product/(\d+)$")


@dataclass(frozen=True)
class _Outcome:
    reward: float = STEP_REWARD
    banner: dict[str, str] | None = None
    terminated: bool = False
    failure_reason: str | None = None
    applied: bool = True
    risk: float | None = None


_INAPPLICABLE = _Outcome(reward=INAPPLICABLE_REWARD, applied=False)


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

    @property
    def state(self) -> WebState | None:
        """The server-side state behind the page (None before ``reset``); the real web app renders it as HTML."""
        return self._state

    @property
    def last_banner(self) -> dict[str, str] | None:
        """The flash banner of the page last rendered."""
        return self._obs.get("banner")

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


@functools.cache
def _raw_states_cached() -> tuple[tuple[dict[str, Any], str], ...]:
    return tuple(_labelled_raw_states())


RAW_STATES: list[tuple[dict[str, Any], str]]  # built on first access (module __getattr__): no work at import

# Tokens the mapping can emit (RAW_STATES) that no semantic action leads to: the exploration coverage
# denominator leaves them out (docs/design.md §2.2). The 404 page is reached only by navigating to an
# unknown URL, and the semantic action set (mappings/web_checkout_v2.json) has no navigate action.
UNREACHABLE_TOKENS: dict[str, str] = {
    "PAGE_NOT_FOUND": "only an unknown URL renders the 404 page; no semantic action navigates to a URL",
}


def __getattr__(name: str) -> Any:
    """Lazily provide ``RAW_STATES`` so importing the module renders nothing."""
    if name == "RAW_STATES":
        return list(_raw_states_cached())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
