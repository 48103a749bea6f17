"""Web channel on any site through a real browser, driven by a site description (data), not by code.

:mod:`~agentflow_core.envs.web_browser` drives the project's own storefront, whose pages carry the
channel's raw observation in ``data-*`` attributes. A site nobody here wrote (django-oscar, a shop
in production) carries nothing of the kind, so this channel reads it through a *site description*:
plain data (``configs/oscar/site/site.json`` is one) that says

* ``pages``: which page a URL path is (first ``url_regex`` that matches, else ``other``);
* ``elements``: element keys (``#add-to-cart``) and the CSS selector that finds each; the keys
  present on the page are the raw observation's ``buttons`` (so a mapping's ``selector`` rules and
  the adapter's action availability work as on every web channel);
* ``counts``: values counted by selector (``cart_count``), ``flags``: values that are 1 when an
  element key is present, ``values``: numbers read from an element's attribute (``{"attempts":
  ["#operator-panel", "data-attempts"]}``; absent element: no value); ``banner``: where the site's flash messages are and which CSS class means
  which banner kind; ``text_selector``: whose visible text is the page's ``text``;
* ``actions``: what each native target does, as browser steps (``goto``, ``fill``, ``check``, ``select``,
  ``click`` -- a click is a navigation; its ``fields`` go with the button's form as hidden inputs),
  optionally with ``alternatives`` chosen by element presence. Selectors are plain CSS. A run of form
  steps is set in one evaluate and a click is the element's own activation (one round trip each, no
  actionability waits: the pages are server-rendered forms);
* ``javascript``: false runs the pages without their scripts (a server-rendered shop works without them,
  and a page settles sooner); ``block_resources``: resource types never fetched (images, styles, ...);
* ``start_stages``: the targets played (unobserved) after a reset to reach a scenario's start stage;
* ``reset_url`` / ``outcome_url``: the site's control endpoints: a POST of the scenario restores a
  known state (with the episode's seed under ``seed_field`` when the description names one); at the ``goal_page`` a GET returns the business outcome read from the site's own
  database, whose ``outcome_values`` become raw values (success is judged from those, not page text);
  ``end_pages`` end the episode elsewhere, without the goal (a customer who left, a hand-over);
* ``faults``: per ``network`` value of the scenario, faults injected at the browser's network layer
  (Playwright request routing) on ``fault_resource_types``: ``latency_s`` (lognormal, ``sigma``)
  with the client timeout ``client_timeout_s``, ``drop_rate``, ``server_error_rate`` (a 503 from
  the route), ``slow_paths`` (path regex -> extra seconds: a slow payment step). A request past the
  timeout or dropped is never sent; the page stays and shows ``fault_texts``; the ``retry_target``
  re-issues the failed step. Extra fault settings can be passed to the env (``faults`` kwarg).

The raw observation has the web template's shape (page, url, title, text, fields, buttons, links,
forms, banner, counts at the top level, ``data``), so the same ``web`` adapter turns it into tokens.
On Oscar's basket page, for example::

    {"page": "basket", "url": "/basket/", "title": "Basket | ...", "text": "Basket Featured Kettle ...",
     "fields": {}, "buttons": ["#logout", "#browse", "#remove-item", "#checkout", "#voucher-form"],
     "links": [], "forms": [], "banner": None, "cart_count": 1,
     "data": {"user_logged_in": 1, "payment_page_loaded": 0, "cart_count": 1, "retries_used": 0}}
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentflow_core.envs.base import INAPPLICABLE_REWARD, STEP_REWARD, SUCCESS_REWARD, Scenario, StepResult
from agentflow_core.envs.web_browser import (
    ACTION_TIMEOUT_MS,
    DEFAULT_CHROMIUM,
    BrowserHost,
    acquire_browser,
    forget_browser,
    release_browser,
)
from agentflow_core.scenario import ScenarioValues

FAMILY = "web_site"
VERSION = 1
READ_JS = """([elements, counts, bannerSelector, textSelector, values]) => {
  const present = Object.entries(elements).filter(([, s]) => document.querySelector(s)).map(([key]) => key);
  const counted = {};
  for (const [key, s] of Object.entries(counts)) counted[key] = document.querySelectorAll(s).length;
  for (const [key, [s, attribute]] of Object.entries(values)) {
    const element = document.querySelector(s);
    const number = element ? parseFloat(element.getAttribute(attribute)) : NaN;
    if (!Number.isNaN(number)) counted[key] = number;
  }
  const alerts = Array.from(document.querySelectorAll(bannerSelector)).map(
    (e) => ({classes: e.className, text: e.innerText.replace(/\\s+/g, " ").replace(/^\\u00d7\\s*/, "").trim()}));
  const main = document.querySelector(textSelector);
  return {url: location.pathname, title: document.title, present, counted, alerts,
          text: main ? main.innerText.replace(/\\s+/g, " ").trim() : ""};
}"""
# Sets a run of form steps in one round trip (Playwright's fill/check/select_option cost one each, with
# actionability checks a plain server-rendered form does not need); the selector of a missing element, else null.
FILL_JS = """(steps) => {
  for (const step of steps) {
    const element = document.querySelector(step.selector);
    if (!element) return step.selector;
    if (step.kind === "check") element.checked = true; else element.value = step.value;
    element.dispatchEvent(new Event("input", {bubbles: true}));
    element.dispatchEvent(new Event("change", {bubbles: true}));
  }
  return null;
}"""
# A click as the element's own activation (a submit button submits its form, a link follows): one round trip.
# ``fields`` go with the button's form as hidden inputs (a site's own form posts ``next`` the same way).
CLICK_JS = """([selector, fields]) => {
  const element = document.querySelector(selector);
  if (!element) return false;
  for (const [name, value] of Object.entries(fields)) {
    let input = element.form && element.form.querySelector(`input[type=hidden][name="${name}"]`);
    if (element.form && !input) {
      input = Object.assign(document.createElement("input"), {type: "hidden", name});
      element.form.appendChild(input);
    }
    if (input) input.value = value;
  }
  element.click();
  return true;
}"""
FORM_STEPS = ("fill", "check", "select")


class SiteBrowserEnv:
    """A business process on a website in headless Chromium, read and driven through a site description."""

    family = FAMILY
    version = VERSION

    def __init__(
        self,
        scenario: Scenario | ScenarioValues,
        env_id: str,
        site: Mapping[str, Any],
        base_url: str,
        chromium_path: str = DEFAULT_CHROMIUM,
        faults: Mapping[str, Any] | None = None,
    ) -> None:
        self.scenario, self.env_id, self.site = scenario, env_id, site
        self.base_url = base_url.rstrip("/")
        self.extra_faults = dict(faults or {})
        self.np_random: np.random.Generator | None = None
        self._pages = [(p["name"], re.compile(p["url_regex"])) for p in site["pages"]]
        self._host: BrowserHost | None = acquire_browser(chromium_path)
        self._thread = threading.get_ident()  # Playwright's sync objects belong to the thread that made them
        self._context: Any = None
        self._page: Any = None
        self._obs: dict[str, Any] = {}
        self._pending: tuple[str, list[dict[str, Any]], int] | None = None
        self._fault: str | None = None
        self._faults_on = False
        self._fault_origin = ""
        self._step_id, self._retries = 0, 0
        self._done, self._started = False, False
        self.outcome: dict[str, Any] | None = None

    # ------------------------------------------------------------------ contract
    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore the site's state for this scenario, open a fresh browser context, reach the start stage."""
        self.np_random = np.random.default_rng(seed)
        self._new_context()
        body = _scenario_dict(self.scenario)
        if self.site.get("seed_field"):
            body[str(self.site["seed_field"])] = seed
        response = self._context.request.post(f"{self.base_url}{self.site['reset_url']}", data=body)
        if response.status != 200:
            raise RuntimeError(f"env {self.env_id}: the site refused the reset: {response.status} {response.text()}")
        self._pending, self._fault, self.outcome = None, None, None
        self._step_id, self._retries, self._done, self._started = 0, 0, False, True
        self._faults_on = False  # the start stage is reached on a clean network: faults begin with the episode
        self._goto(self.site["start_url"])
        start_stage = _scenario_dict(self.scenario).get("start_stage", "")
        for target in self.site.get("start_stages", {}).get(start_stage, []):
            self._read()
            self._run_steps(self._resolve(target), 0)
        self._faults_on = True
        self._read()
        return self._obs, self._info(None, applied=True)

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """One semantic action as browser steps; the reward is judged from the page and the site's outcome."""
        if not self._started or self._done:
            raise RuntimeError(
                f"env {self.env_id}: step() called {'before reset()' if not self._started else 'after the episode ended'}"
            )
        self._step_id += 1
        applied = self._dispatch(dict(native_action))
        reward, terminated, failure_reason = STEP_REWARD, False, None
        if applied is None:
            reward, applied = INAPPLICABLE_REWARD, False
        elif applied and self._obs["page"] == self.site["goal_page"]:
            terminated = True
            verified = bool(self._obs["data"].get(self.site.get("success_value", "order_verified")))
            reward, failure_reason = (SUCCESS_REWARD, None) if verified else (STEP_REWARD, "outcome_not_verified")
        elif applied and self._obs["page"] in self.site.get("end_pages", ()):
            terminated, failure_reason = True, f"ended_{self._obs['page']}"
        truncated = not terminated and self._step_id >= self.scenario.max_episode_steps
        self._done = terminated or truncated
        info = self._info(failure_reason or ("max_steps" if truncated else None), bool(applied))
        if truncated and self.outcome is None and self.site.get("outcome_url"):
            self.outcome = self._context.request.get(f"{self.base_url}{self.site['outcome_url']}").json()
        if self.outcome is not None:
            info["outcome"] = self.outcome
            if self._done and self.outcome.get("business_value") is not None:
                info["business_value"] = float(self.outcome["business_value"])  # a site that prices its episodes
        return StepResult(self._obs, reward, terminated, truncated, info)

    def reconfigure(self, scenario: Scenario | ScenarioValues, env_id: str) -> None:
        """Re-target to another variant: the next ``reset`` restores the site for it."""
        self.scenario, self.env_id = scenario, env_id
        self._obs, self._step_id, self._done, self._started = {}, 0, False, False

    def close(self) -> None:
        """Close the browser context and release the shared browser (from another thread: forget them).

        A pool may close its envs from the driver's thread while they were made and stepped on its step
        thread; Playwright's sync objects cannot be touched there, so the env only lets go of them.
        """
        if self._host is None:
            return
        host, self._host = self._host, None
        if threading.get_ident() != self._thread:
            forget_browser(host)
            return
        try:
            if self._context is not None:
                self._context.close()
        finally:
            release_browser(host)

    # ------------------------------------------------------------------ browser
    def _new_context(self) -> None:
        assert self._host is not None
        if self._context is not None:
            self._context.close()
        self._context = self._host.browser.new_context(java_script_enabled=bool(self.site.get("javascript", True)))
        self._context.set_default_timeout(ACTION_TIMEOUT_MS)
        self._page = self._context.new_page()
        self._page.route("**/*", self._route)

    def _route(self, route: Any) -> None:
        """Block unneeded resources; on the fault-prone kinds inject the scenario's network faults."""
        request = route.request
        if request.resource_type in self.site.get("block_resources", ()):
            route.abort()
            return
        if not self._faults_on or request.resource_type not in self.site.get("fault_resource_types", ("document",)):
            route.continue_()
            return
        fault = self._draw_fault(request.url)
        if fault == "server_error":
            self._fault, self._fault_origin = fault, self._page.url  # the document the 503 page replaces
            route.fulfill(status=503, content_type="text/html", body="<h1>503 Service Unavailable</h1>")
        elif fault is not None:
            self._fault = fault
            route.abort("aborted")  # never sent; Chromium keeps the current page
        else:
            route.continue_()

    def _draw_fault(self, url: str) -> str | None:
        """Sleep the drawn latency; the fault kind of this request (None: it goes through)."""
        rng = self.np_random
        assert rng is not None
        network = _scenario_dict(self.scenario).get("network", "normal")
        spec = {**self.site.get("faults", {}).get(network, {}), **self.extra_faults}
        timeout = float(self.site.get("client_timeout_s", 1.0))
        latency = float(spec.get("latency_s", 0.0)) * math.exp(
            float(spec.get("sigma", 0.0)) * float(rng.standard_normal())
        )
        path = url.removeprefix(self.base_url).split("?")[0]
        latency += sum(float(s) for pattern, s in spec.get("slow_paths", {}).items() if re.search(pattern, path))
        if rng.random() < float(spec.get("drop_rate", 0.0)):
            time.sleep(timeout)
            return "dropped"
        time.sleep(min(latency, timeout))
        if latency > timeout:
            return "timeout"
        return "server_error" if rng.random() < float(spec.get("server_error_rate", 0.0)) else None

    def _goto(self, path: str) -> None:
        from playwright.sync_api import Error as PlaywrightError

        try:
            self._page.goto(f"{self.base_url}{path}", wait_until="domcontentloaded")
        except PlaywrightError:
            if self._fault is None:
                raise

    def _click(self, selector: str, fields: Mapping[str, str] | None = None) -> None:
        """Click (posting ``fields`` with the button's form) and wait for the new document or a recorded fault.

        One wait for the navigation the click starts (no polling): it ends at the new document's
        DOMContentLoaded, or with an error when the route handler aborted the request (a fault).
        """
        from playwright.sync_api import Error as PlaywrightError

        try:
            with self._page.expect_navigation(wait_until="domcontentloaded"):
                if not self._page.evaluate(CLICK_JS, [selector, dict(fields or {})]):
                    raise RuntimeError(f"env {self.env_id}: nothing to click at {selector!r} on {self._page.url}")
        except PlaywrightError:
            if self._fault is None:
                raise

    def _run_steps(self, steps: list[dict[str, Any]], start: int) -> int | None:
        """Play ``steps`` from ``start``; the index of the step a fault stopped, or None when all ran."""
        index = start
        while index < len(steps):
            step = steps[index]
            self._fault = None
            if "goto" in step:
                self._goto(step["goto"])
            elif "click" in step:
                self._click(step["click"], step.get("fields"))
            elif not set(FORM_STEPS).isdisjoint(step):
                index = self._fill(steps, index)
                continue
            else:
                raise ValueError(
                    f"env {self.env_id}: unknown site step {step!r}; expected goto|fill|check|select|click"
                )
            if self._fault is not None:
                return index
            index += 1
        return None

    def _fill(self, steps: list[dict[str, Any]], start: int) -> int:
        """Set the run of form steps from ``start`` in one evaluate (no request goes out); the index after it."""
        end = start
        batch = []
        while end < len(steps) and not set(FORM_STEPS).isdisjoint(steps[end]):
            kind = next(k for k in FORM_STEPS if k in steps[end])
            batch.append({"kind": kind, "selector": steps[end][kind], "value": str(steps[end].get("value", ""))})
            end += 1
        missing = self._page.evaluate(FILL_JS, batch)
        if missing is not None:
            raise RuntimeError(f"env {self.env_id}: no form element at {missing!r} on {self._page.url}")
        return end

    # ------------------------------------------------------------------ semantic actions
    def _resolve(self, target: str) -> list[dict[str, Any]]:
        """The steps of ``target``: the first alternative whose element is on the page, else the default."""
        action = self.site["actions"][target]
        present = set(self._obs.get("buttons", ()))
        for alternative in action.get("alternatives", ()):
            if alternative["when"] in present:
                return list(alternative["steps"])
        return list(action["steps"])

    def _dispatch(self, action: dict[str, Any]) -> bool | None:
        """True/False: the action ran / was stopped by a fault; None: its element is not on the page."""
        target = action.get("target")
        if action.get("type") == "noop":
            return True
        retry = target == self.site.get("retry_target", "#retry")
        if retry and self._pending is not None:
            target, steps, start = self._pending
            self._retries += 1
        elif target in self._obs["buttons"] and target in self.site["actions"]:
            steps, start = self._resolve(str(target)), 0
        else:
            return None
        failed_at = self._run_steps(steps, start)
        if failed_at is None:
            self._pending = None
            self._read()
            return True
        self._pending = (str(target), steps, self._recover(steps, failed_at))
        return False

    def _recover(self, steps: list[dict[str, Any]], failed_at: int) -> int:
        """After a fault, show the page with the fault banner; the step a retry resumes at.

        A dropped or timed-out request never left the browser, so the page (and what was typed into it)
        is still there: resume at the failed step. A 503 page replaced the document: load it again (as a
        user going back) and resume at the form fills that preceded the failed step.
        """
        fault, resume = self._fault, failed_at
        if fault == "server_error" and self._fault_origin:
            self._faults_on = False
            try:
                self._page.goto(self._fault_origin, wait_until="domcontentloaded")
            finally:
                self._faults_on = True
            while resume > 0 and not {"fill", "check", "select"}.isdisjoint(steps[resume - 1]):
                resume -= 1
        self._read(fault)
        return resume

    # ------------------------------------------------------------------ observation
    def _read(self, fault: str | None = None) -> None:
        """The raw observation from the live DOM (and the site's outcome at the goal page)."""
        site = self.site
        page = self._page.evaluate(
            READ_JS,
            [
                site["elements"],
                site.get("counts", {}),
                site["banner"]["selector"],
                site.get("text_selector", "body"),
                site.get("values", {}),
            ],
        )
        name = next((n for n, pattern in self._pages if pattern.search(page["url"])), "other")
        buttons = list(page["present"])
        banner = _banner(page["alerts"], site["banner"].get("kinds", {}))
        if fault is not None:
            banner = {"kind": "error", "text": site.get("fault_texts", {}).get(fault, f"Request failed ({fault})")}
            buttons.append(site.get("retry_target", "#retry"))
        data: dict[str, Any] = {key: int(key_ in buttons) for key, key_ in site.get("flags", {}).items()}
        data.update(page["counted"])
        data["retries_used"] = self._retries
        if (name == site["goal_page"] or name in site.get("end_pages", ())) and fault is None:
            self.outcome = self._context.request.get(f"{self.base_url}{site['outcome_url']}").json()
            data.update({key: self.outcome.get(source) for key, source in site.get("outcome_values", {}).items()})
        text = " ".join(part for part in (banner["text"] if banner else "", page["text"]) if part)
        self._obs = {
            "page": name,
            "url": page["url"],
            "title": page["title"],
            "text": text,
            "fields": {},
            "buttons": buttons,
            "links": [],
            "forms": [],
            "banner": banner,
            **page["counted"],
            "data": data,
        }

    def _info(self, failure_reason: str | None, applied: bool) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "step_id": self._step_id,
            "failure_reason": failure_reason,
            "page": self._obs.get("page"),
            "applied": applied,
        }


def _scenario_dict(scenario: Any) -> dict[str, Any]:
    """A scenario (checkout's dataclass or another process's values mapping) as plain data."""
    return dict(scenario.to_dict() if hasattr(scenario, "to_dict") else scenario)


def _banner(alerts: list[dict[str, str]], kinds: Mapping[str, str]) -> dict[str, str] | None:
    """The site's first flash message as a banner (kind from its CSS classes); all messages' text."""
    if not alerts:
        return None
    classes = alerts[0]["classes"].split()
    kind = next((k for css, k in kinds.items() if css in classes), "info")
    return {"kind": kind, "text": " ".join(a["text"] for a in alerts)}
