"""The refund process's HTTP channel: JSON requests against the refund service (:mod:`agentflow_refund.service`).

Raw observation = the last exchange, in the shape the ``api`` mapping template reads::

    {"status_code": 422, "json": {...reply body...}, "endpoint": "/refunds/submit", "client": {"retries": 0}}

Native actions: ``{"type": "http", "method": "POST", "path": "/refunds"}`` and ``{"type": "retry"}``
(send the request that timed out again). ``reset`` opens a case with ``POST /episodes`` (the
scenario and a seed drawn from the env's generator) and keeps the episode id and client token the
service bound to it. The business reward is the service's (``reward`` in the reply). ``base_url``
(env config kwargs) points at a running service; without it the env starts one in-process.
Registered through the ``agentflow.envs`` entry point ``refund_api``; nothing here is in the core.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx
import numpy as np

from agentflow_core.envs.base import StepResult
from agentflow_refund.case import INAPPLICABLE_REWARD, RefundCase, Scenario
from agentflow_refund.service import case_body

FAMILY = "refund_api"
VERSION = 1
TIMEOUT_S = 5.0


class RefundAPIEnv:
    """Physical env of the ``refund_api`` family (see the module docstring)."""

    family = FAMILY
    version = VERSION

    def __init__(self, scenario: Scenario, env_id: str, base_url: str | None = None) -> None:
        self.scenario, self.env_id = scenario, env_id
        if base_url is None:
            from agentflow_refund.service import shared_service

            base_url = shared_service().url
        self.base_url = base_url
        self.http = httpx.Client(base_url=base_url, timeout=TIMEOUT_S)
        self.np_random = np.random.default_rng()
        self.step_id = 0
        self.retries = 0
        self._headers: dict[str, str] = {}
        self._last: tuple[str, str] | None = None
        self._last_timed_out = False

    def reconfigure(self, scenario: Scenario, env_id: str) -> None:
        """Re-target to another variant; the next reset opens a case for it."""
        self.scenario, self.env_id = scenario, env_id

    def _raw(self, response: httpx.Response, endpoint: str) -> dict[str, Any]:
        body = response.json() if response.headers.get("content-type", "").startswith("application/json") else {}
        return {
            "status_code": response.status_code,
            "json": body,
            "endpoint": endpoint,
            "client": {"retries": self.retries},
        }

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Open a new case on the service (the previous one is left to expire there)."""
        self.np_random = np.random.default_rng(seed)
        self.step_id, self.retries, self._last, self._last_timed_out = 0, 0, None, False
        episode_seed = int(self.np_random.integers(0, 2**62))
        response = self.http.post("/episodes", json={"scenario": dict(self.scenario), "seed": episode_seed})
        response.raise_for_status()
        body = response.json()
        self._headers = {"X-Episode-Id": body.pop("episode_id"), "X-Client-Token": body.pop("client_token")}
        raw = {"status_code": response.status_code, "json": body, "endpoint": "/episodes", "client": {"retries": 0}}
        return raw, {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Send one request (or re-send the one that timed out) and read the case back."""
        self.step_id += 1
        request: tuple[str, str] | None = None
        if native_action.get("type") == "http":
            request = (str(native_action["method"]), str(native_action["path"]))
        elif native_action.get("type") == "retry" and self._last_timed_out:
            request, self.retries = self._last, self.retries + 1
        if request is None:
            idle: dict[str, Any] = {
                "status_code": None,
                "json": {},
                "endpoint": None,
                "client": {"retries": self.retries},
            }
            return self._result(idle, INAPPLICABLE_REWARD, False, "not_applicable", applied=False)
        method, path = request
        response = self.http.request(method, path, headers=self._headers)
        self._last, self._last_timed_out = request, response.status_code == 504
        raw = self._raw(response, path)
        body: dict[str, Any] = raw["json"]
        reward = float(body.get("reward", INAPPLICABLE_REWARD))
        reason: str | None = "network_timeout" if response.status_code == 504 else body.get("failure_reason")
        if response.status_code >= 400 and reason is None:
            reason = str(body.get("error", "client_error"))[:80]
        applied = response.status_code == 200 and reason in (None, "escalated", "withdrawn")
        return self._result(raw, reward, bool(body.get("done", False)), reason, applied)

    def _result(self, raw: dict[str, Any], reward: float, done: bool, reason: str | None, applied: bool) -> StepResult:
        truncated = not done and self.step_id >= self.scenario["max_episode_steps"]
        info = {"env_id": self.env_id, "step_id": self.step_id, "failure_reason": reason, "applied": applied}
        if truncated and reason is None:
            info["failure_reason"] = "max_steps"
        return StepResult(raw, reward, done, truncated, info)

    def close(self) -> None:
        """Close the HTTP client (the service drops the case when it expires)."""
        self.http.close()


def _exchange(case: RefundCase, status: int = 200) -> dict[str, Any]:
    """One exchange as :meth:`RefundAPIEnv.step` records it (labelled audit samples)."""
    body = {**case_body(case), **({"error": "upstream_timeout"} if status == 504 else {})}
    return {"status_code": status, "json": body, "endpoint": "/refunds/status", "client": {"retries": 0}}


# Labelled raw states for the mapping audit (agentflow_core/adapters/audit.py): one per meaning.
RAW_STATES: list[tuple[dict[str, Any], str]] = [
    (_exchange(RefundCase(), 401), "SIGNED_OUT"),
    (_exchange(RefundCase(session="expired", order_found=True)), "SESSION_EXPIRED"),
    (_exchange(RefundCase(session="active")), "SIGNED_IN"),
    (_exchange(RefundCase(session="active", account="flagged"), 403), "ACCOUNT_FLAGGED"),
    (_exchange(RefundCase(session="active", order_found=True)), "ORDER_FOUND"),
    (_exchange(RefundCase(session="active", order_found=True, request="draft")), "REQUEST_DRAFT"),
    (
        _exchange(RefundCase(session="active", order_found=True, request="draft", evidence_required=True), 422),
        "EVIDENCE_REQUIRED",
    ),
    (_exchange(RefundCase(session="active", order_found=True, request="draft", evidence=True)), "EVIDENCE_ATTACHED"),
    (_exchange(RefundCase(session="active", order_found=True, request="submitted")), "UNDER_REVIEW"),
    (_exchange(RefundCase(session="active", order_found=True, request="issued")), "REFUND_ISSUED"),
    (_exchange(RefundCase(session="active", order_found=True, request="withdrawn")), "REQUEST_WITHDRAWN"),
    (_exchange(RefundCase(session="active", order_found=True), 504), "SERVICE_TIMEOUT"),
    (_exchange(RefundCase(session="active", account="flagged", ticket=True)), "ESCALATED"),
]
