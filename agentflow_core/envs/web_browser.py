"""Web channel on a real browser: headless Chromium (Playwright) driving the storefront web app.

The same checkout as :mod:`~agentflow_core.envs.web_checkout`, but the pages are real HTML served
over HTTP by :mod:`~agentflow_core.envs.web_app.server`, the actions are real clicks and form
submits in Chromium (handled by the page's own script, which posts them and swaps the answered page
in), and the raw observation is read back from the live DOM: the same dict shape the simulated
channel renders (page, url, title, text, fields, buttons, links, forms, banner, cart_count,
balance, sim_time_s, data), so the same semantic-adapter contract (the ``web`` template, mapping
``web_browser_v1.json``) turns it into tokens. The reward is judged from what the browser shows
(the page reached, and whether the request was answered 200), not read from the server.

Lifetime: one Chromium per process and thread (:func:`acquire_browser`, refcounted), one browser
context (own cookies: own session) and one page per env; the last env to close shuts Chromium
and Playwright's driver down. Chromium talks to the driver over a pipe, and the driver to this
process over another: a killed process takes its browser with it (``tests/test_env_browser.py``
kills one and checks). Every Playwright wait has a deadline (:data:`ACTION_TIMEOUT_MS`).

What differs from the simulated channel, by design: the server counts requests, so an action
the page does not offer (no request is sent) or a ``type`` into a field (client side) does not age
the session there as a simulated step does; the semantic actions never type, and a masked policy
never picks an action the page lacks. After a ``type`` the page text that quotes the card ("ending
1234") changes only with the next request, and after an action the page lacks the page (a flash
banner included) stays as it was, where the simulator re-renders it at once (without the banner).
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.envs.base import (
    BLOCKED_ESCALATION_REWARD,
    CANCEL_REWARD,
    INAPPLICABLE_REWARD,
    STEP_REWARD,
    SUCCESS_REWARD,
    WRONG_ESCALATION_REWARD,
    Scenario,
    StepResult,
)
from agentflow_core.envs.web_app.server import (
    StorefrontServer,
    acquire_shared_storefront,
    release_shared_storefront,
)
from agentflow_core.envs.web_checkout import CANCEL_RISK
from agentflow_core.envs.web_pages import page_text

FAMILY = "web_browser"
VERSION = 1
DEFAULT_CHROMIUM = "/usr/bin/chromium"
ACTION_TIMEOUT_MS = 10_000
# Marks this project's Chromium processes (Chromium ignores unknown switches): tests find orphans by it.
OWNER_SWITCH = "--agentflow-owner"
_TOP_LEVEL = ("cart_count", "balance", "sim_time_s")
_INT_RE = re.compile(r"^-?\d+$")

# Reads the page the storefront lays out (envs/web_app/html.py) into the channel's raw observation.
READ_PAGE_JS = """() => {
  const body = document.body;
  const all = (selector) => Array.from(document.querySelectorAll(selector));
  const alert = document.querySelector("main [role=alert]");
  const fields = {};
  all("main form input[name]").forEach((input) => { fields[input.name] = input.value; });
  const values = {};
  for (const key of (body.dataset.values || "").split(",").filter(Boolean)) {
    values[key] = body.getAttribute("data-" + key.replaceAll("_", "-"));
  }
  const text = (selector) => { const found = document.querySelector(selector); return found ? found.textContent : ""; };
  return {
    page: body.dataset.page, url: location.pathname, seq: body.dataset.seq || "0",
    status: body.dataset.status || "200", clientError: body.dataset.clientError || null,
    header: all("header p.status").map((e) => e.textContent), title: text("main h1"), lead: text("main p.lead"),
    banner: alert ? {kind: alert.dataset.kind, text: alert.textContent} : null, fields,
    buttons: all("main .actions button[id]").map((e) => "#" + e.id),
    links: all("header nav a[id]").map((e) => "#" + e.id),
    forms: all("main form[name]").map((e) => e.getAttribute("name")), values,
  };
}"""
# Waits (inside the page: no extra round trip) for the answer to request ``seq`` to be swapped in, then reads it.
AWAIT_PAGE_JS = f"""async ([seq, timeoutMs]) => {{
  const ready = () => document.body.dataset.seq === seq || Boolean(document.body.dataset.clientError);
  const deadline = Date.now() + timeoutMs;
  while (!ready()) {{
    if (Date.now() > deadline) throw new Error(`no answer to request ${{seq}} within ${{timeoutMs}} ms`);
    await new Promise((resolve) => setTimeout(resolve, 1));
  }}
  return ({READ_PAGE_JS})();
}}"""


def _number(text: str) -> int | float:
    return int(text) if _INT_RE.match(text) else float(text)


def raw_observation(page: Mapping[str, Any]) -> dict[str, Any]:
    """The channel's raw observation from what :data:`READ_PAGE_JS` read off the DOM."""
    values = {key: _number(value) for key, value in page["values"].items()}
    banner = page["banner"]
    return {
        "page": page["page"],
        "url": page["url"],
        "title": page["title"],
        "text": page_text(tuple(page["header"]), page["title"], page["lead"], banner),
        "fields": dict(page["fields"]),
        "buttons": list(page["buttons"]),
        "links": list(page["links"]),
        "forms": list(page["forms"]),
        "banner": banner,
        **{key: values.pop(key) for key in _TOP_LEVEL},
        "data": values,
    }


class BrowserHost:
    """One Playwright driver and one headless Chromium, shared by the browser envs of a thread."""

    def __init__(self, executable_path: str = DEFAULT_CHROMIUM) -> None:
        from playwright.sync_api import sync_playwright  # a channel driver: imported only when a browser is asked for

        if not os.path.isfile(executable_path):
            raise FileNotFoundError(
                f"Chromium not found at {executable_path}: install the OS package (apt-get install -y chromium) "
                "or point the env's chromium_path at a Chromium binary"
            )
        self._playwright = sync_playwright().start()
        try:
            self.browser = self._playwright.chromium.launch(
                executable_path=executable_path,
                headless=True,
                args=["--no-sandbox", f"{OWNER_SWITCH}={os.getpid()}"],
            )
        except Exception:
            self._playwright.stop()
            raise

    def close(self) -> None:
        """Close Chromium, then stop the driver."""
        try:
            self.browser.close()
        finally:
            self._playwright.stop()


@dataclass
class _HostRef:
    host: BrowserHost
    refs: int = 0


_hosts: dict[tuple[int, int], _HostRef] = {}
_hosts_lock = threading.Lock()
_atexit_registered = False


def _host_key() -> tuple[int, int]:
    return os.getpid(), threading.get_ident()  # Playwright's sync objects belong to the thread that made them


def acquire_browser(executable_path: str = DEFAULT_CHROMIUM) -> BrowserHost:
    """This thread's browser, launched on first use; every acquire needs one :func:`release_browser`."""
    global _atexit_registered
    key = _host_key()
    with _hosts_lock:
        ref = _hosts.get(key)
        if ref is None:
            ref = _hosts[key] = _HostRef(BrowserHost(executable_path))
            if not _atexit_registered:
                atexit.register(close_all_browsers)
                _atexit_registered = True
        ref.refs += 1
        return ref.host


def release_browser(host: BrowserHost) -> bool:
    """Drop one reference; the last one closes the browser. Returns whether it closed."""
    with _hosts_lock:
        key = next((k for k, ref in _hosts.items() if ref.host is host), None)
        if key is None:
            return False
        ref = _hosts[key]
        ref.refs -= 1
        if ref.refs > 0:
            return False
        del _hosts[key]
    host.close()
    return True


def forget_browser(host: BrowserHost) -> None:
    """Drop one reference from a thread that does not own ``host``: Playwright's sync objects cannot be used
    there, so nothing is closed; the last reference dropped forgets the browser, which then ends with this
    process (its driver's pipe closes, and Chromium with it)."""
    with _hosts_lock:
        key = next((k for k, ref in _hosts.items() if ref.host is host), None)
        if key is not None:
            _hosts[key].refs -= 1
            if _hosts[key].refs <= 0:
                del _hosts[key]


def live_browsers() -> int:
    """Browsers this process holds open."""
    with _hosts_lock:
        return len(_hosts)


def close_all_browsers() -> None:
    """Close every browser this process launched on this thread's side (at exit, or after a failed test)."""
    with _hosts_lock:
        refs = [ref for key, ref in _hosts.items() if key[0] == os.getpid()]
        _hosts.clear()
    for ref in refs:
        try:
            ref.host.close()
        except Exception:  # noqa: BLE001 - best effort at exit: the driver may be gone already
            continue


class BrowserCheckoutEnv:
    """The checkout process through a real browser: native actions are UI events, observations the DOM."""

    family = FAMILY
    version = VERSION

    def __init__(self, scenario: Scenario, env_id: str, chromium_path: str = DEFAULT_CHROMIUM) -> None:
        self.scenario = scenario
        self.env_id = env_id
        self.np_random: np.random.Generator | None = None
        self._server: StorefrontServer | None = acquire_shared_storefront()
        try:
            self._host: BrowserHost | None = acquire_browser(chromium_path)
        except Exception:
            release_shared_storefront(self._server)
            raise
        self._context = self._host.browser.new_context()
        self._context.set_default_timeout(ACTION_TIMEOUT_MS)
        self._page = self._context.new_page()
        self._obs: dict[str, Any] = {}
        self._seq = 0
        self._step_id = 0
        self._done = False
        self._started = False

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """A new session on the server for this scenario and seed, then load its first page."""
        assert self._server is not None
        self.np_random = np.random.default_rng(seed)
        response = self._context.request.post(
            f"{self._server.url}/api/session",
            data={"scenario": self.scenario.to_dict(), "seed": seed, "env_id": self.env_id},
        )
        if response.status != 201:
            raise RuntimeError(
                f"env {self.env_id}: storefront refused the session: {response.status} {response.text()}"
            )
        self._page.goto(f"{self._server.url}/app")
        self._step_id, self._done, self._started = 0, False, True
        self._read()
        return self._obs, self._info(None, applied=True, sim_time=self._obs["sim_time_s"])

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """One UI event in the browser; the reward is judged from the page it leads to."""
        if not self._started or self._done:
            raise RuntimeError(
                f"env {self.env_id}: step() called {'before reset()' if not self._started else 'after the episode ended'}"
            )
        self._step_id += 1
        action = dict(native_action)
        before = self._obs["page"]
        applied = self._dispatch(action)
        reward, terminated, failure_reason, risk = STEP_REWARD, False, None, None
        if applied is None:
            reward, applied = INAPPLICABLE_REWARD, False
        elif applied:
            reward, terminated, failure_reason, risk = _judge(self._obs["page"], before)
        truncated = not terminated and self._step_id >= self.scenario.max_episode_steps
        self._done = terminated or truncated
        info = self._info(failure_reason or ("max_steps" if truncated else None), applied, self._obs["sim_time_s"])
        if risk is not None:
            info["risk"] = risk
        return StepResult(self._obs, reward, terminated, truncated, info)

    def reconfigure(self, scenario: Scenario, env_id: str) -> None:
        """Re-target to another variant: the next ``reset`` opens a new session (the browser context stays)."""
        self.scenario, self.env_id = scenario, env_id
        self.np_random = None
        self._obs, self._step_id, self._done, self._started = {}, 0, False, False

    def close(self) -> None:
        """Close the page and context, end the session, and release the shared browser and server."""
        if self._host is None:
            return
        host, server, self._host, self._server = self._host, self._server, None, None
        try:
            if server is not None and self._started:
                self._context.request.delete(f"{server.url}/api/session")
            self._context.close()
        finally:
            release_browser(host)
            if server is not None:
                release_shared_storefront(server)

    # ------------------------------------------------------------------ internals
    def _read(self, after_seq: str | None = None) -> None:
        """The raw observation from the DOM (after the answer to request ``after_seq`` arrived, if given)."""
        page = (
            self._page.evaluate(READ_PAGE_JS)
            if after_seq is None
            else self._page.evaluate(AWAIT_PAGE_JS, [after_seq, ACTION_TIMEOUT_MS])
        )
        if page.get("clientError"):
            raise RuntimeError(f"env {self.env_id}: the page's script failed: {page['clientError']}")
        self._seq = int(page["seq"])
        self._status = int(page["status"])
        self._obs = raw_observation(page)

    def _on_page(self, kind: str, action: Mapping[str, Any]) -> bool:
        obs = self._obs
        if kind == "click":
            return action.get("target") in obs["buttons"] or action.get("target") in obs["links"]
        if kind == "submit":
            return action.get("form") in obs["forms"]
        return action.get("field") in obs["fields"]

    def _dispatch(self, action: Mapping[str, Any]) -> bool | None:
        """Perform the event; True/False: a request went out and was (not) applied; None: nothing to act on."""
        kind = action.get("type")
        if kind == "noop":
            return True
        if kind not in ("click", "type", "submit", "navigate"):
            raise ValueError(
                f"unknown web action type {kind!r} in {dict(action)!r}; expected click|type|submit|navigate|noop"
            )
        if kind != "navigate" and not self._on_page(kind, action):
            return None
        page = self._page
        if kind == "type":  # client side: the value travels with the next click or submit
            page.locator(f'main form input[name="{action["field"]}"]').fill(str(action.get("text", "")))
            self._read()
            return True
        if kind == "navigate":
            assert self._server is not None
            response = page.goto(f"{self._server.url}{action.get('url', '')}")
            self._read()
            return response is not None and response.status == 200
        expected = str(self._seq + 1)
        if kind == "click":
            page.locator(f'[id="{str(action["target"]).lstrip("#")}"]').first.click()
        else:
            page.locator(f'main form[name="{action["form"]}"]').evaluate("form => form.requestSubmit()")
        self._read(after_seq=expected)
        return self._status == 200

    def _info(self, failure_reason: str | None, applied: bool, sim_time: float) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "step_id": self._step_id,
            "failure_reason": failure_reason,
            "sim_time_s": sim_time,
            "page": self._obs["page"],
            "applied": applied,
        }


def _judge(page: str, before: str) -> tuple[float, bool, str | None, float | None]:
    """(reward, terminated, failure_reason, risk) of an applied request, from the page it showed."""
    if page == "confirmation":
        return SUCCESS_REWARD, True, None, None
    if page == "order_cancelled":
        return CANCEL_REWARD, True, "order_cancelled", CANCEL_RISK
    if page == "support":
        if before == "account_blocked":
            return BLOCKED_ESCALATION_REWARD, True, "user_blocked", None
        return WRONG_ESCALATION_REWARD, True, "escalated", None
    return STEP_REWARD, False, None, None


# The browser shows the simulated storefront's pages (the DOM reader rebuilds the same dict), so its
# labelled raw states and unreachable tokens are the simulated channel's (the audit and coverage use them).
UNREACHABLE_TOKENS: dict[str, str] = {
    "PAGE_NOT_FOUND": "only an unknown URL renders the 404 page; no semantic action navigates to a URL",
}
RAW_STATES: list[tuple[dict[str, Any], str]]  # built on first access (module __getattr__): no work at import


def __getattr__(name: str) -> Any:
    """Lazily provide ``RAW_STATES`` (the storefront's rendered samples) so importing renders nothing."""
    if name == "RAW_STATES":
        from agentflow_core.envs import web_checkout

        return web_checkout.RAW_STATES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
