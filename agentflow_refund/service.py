"""The refund HTTP JSON service: a second small service for the refund process (its spec: openapi.yaml here).

A real server on ``127.0.0.1`` (``ThreadingHTTPServer`` in a daemon thread, port 0 = a free port).
``POST /episodes`` with ``{"scenario": {...}, "seed": n}`` opens a case and answers its ``episode_id``
and a ``client_token``: two independent 128-bit random values, and every later request must carry
both (``X-Episode-Id``, ``X-Client-Token``), so one local client cannot touch another's case. An
episode unused for ``episode_ttl_s`` expires (410), at most ``MAX_EPISODES`` live at once (oldest
evicted), bodies over ``MAX_BODY_BYTES`` are refused unread (413), and malformed requests -- bad
JSON, a body that is not an object, unknown fields, a bad scenario, missing headers -- get a
well-formed 4xx JSON reply. The business rules are :mod:`agentflow_refund.case`, drawn from the
episode's own seeded generator, so a seed fixes an episode. Every reply carries the case::

    {"session": {"status": "active"}, "account": {"status": "ok"}, "order": {"found": true, "amount": 120.0},
     "refund": {"status": "draft", "evidence": false, "evidence_required": true},
     "ticket": {"open": false}, "error": null, "done": false, "reward": -0.01, "failure_reason": null}

A simulated network drop is answered 504 with ``"error": "upstream_timeout"`` and the case unchanged.
``GET /openapi.json`` answers the service's OpenAPI spec (``openapi.yaml`` here), which the generic HTTP
channel (:mod:`agentflow_core.envs.http_channel`) checks its requests against.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from functools import cache
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from agentflow_core.envs.json_service import JsonRequestHandler, Refusal
from agentflow_refund.case import SCENARIO, RefundCase, Scenario, apply, start_case

MAX_BODY_BYTES = 16 * 1024
MAX_EPISODES = 4096
DEFAULT_TTL_S = 600.0

# (method, path) -> case action
ROUTES: dict[tuple[str, str], str] = {
    ("POST", "/session"): "sign_in",
    ("GET", "/orders/latest"): "find_order",
    ("POST", "/refunds"): "open_request",
    ("POST", "/refunds/evidence"): "attach_evidence",
    ("POST", "/refunds/submit"): "submit_request",
    ("GET", "/refunds/status"): "check_status",
    ("POST", "/refunds/withdraw"): "withdraw",
    ("POST", "/support"): "escalate",
}


SPEC_PATH = Path(__file__).resolve().parent / "openapi.yaml"


@cache
def openapi_spec() -> dict[str, Any]:
    """The service's OpenAPI spec (``openapi.yaml``), as ``GET /openapi.json`` serves it."""
    spec: dict[str, Any] = yaml.safe_load(SPEC_PATH.read_text(encoding="utf-8"))
    return spec


@dataclass
class Episode:
    """One live case with its owner's token, scenario and generator."""

    token: str
    scenario: Scenario
    rng: np.random.Generator
    case: RefundCase
    touched: float = field(default_factory=time.monotonic)


def case_body(case: RefundCase) -> dict[str, Any]:
    """The case as every reply shows it."""
    return {
        "session": {"status": case.session, "signed_in": case.session == "active"},
        "account": {"status": case.account},
        "order": {"found": case.order_found, "amount": case.amount},
        "refund": {"status": case.request, "evidence": case.evidence, "evidence_required": case.evidence_required},
        "ticket": {"open": case.ticket},
        "done": case.done,
    }


class RefundState:
    """The service's episodes (thread-safe); the HTTP handler only parses and replies."""

    def __init__(self, episode_ttl_s: float = DEFAULT_TTL_S) -> None:
        self.episode_ttl_s = episode_ttl_s
        self._episodes: dict[str, Episode] = {}
        self._lock = threading.Lock()

    def open(self, body: dict[str, Any]) -> dict[str, Any]:
        """Start a case from ``{"scenario": {...}, "seed": int}``."""
        unknown = sorted(set(body) - {"scenario", "seed"})
        if unknown:
            raise Refusal(HTTPStatus.BAD_REQUEST, f"unknown field(s) {unknown}")
        seed = body.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise Refusal(HTTPStatus.BAD_REQUEST, "seed: expected an integer in [0, 2**63)")
        raw = body.get("scenario", {})
        if not isinstance(raw, dict):
            raise Refusal(HTTPStatus.BAD_REQUEST, "scenario: expected an object")
        try:
            scenario = SCENARIO.build(raw)
        except (TypeError, ValueError) as exc:
            raise Refusal(HTTPStatus.UNPROCESSABLE_ENTITY, str(exc)[:200]) from None
        episode_id, token = secrets.token_hex(16), secrets.token_hex(16)
        episode = Episode(token, scenario, np.random.default_rng(seed), start_case(scenario))
        with self._lock:
            self._expire()
            while len(self._episodes) >= MAX_EPISODES:
                self._episodes.pop(next(iter(self._episodes)))
            self._episodes[episode_id] = episode
        return {"episode_id": episode_id, "client_token": token, **case_body(episode.case)}

    def close(self, episode_id: str | None, token: str | None) -> dict[str, Any]:
        """End a case early (its owner only)."""
        with self._lock:
            self._owned(episode_id, token)
            self._episodes.pop(str(episode_id))
        return {"closed": True}

    def act(self, episode_id: str | None, token: str | None, action: str) -> tuple[int, dict[str, Any]]:
        """Apply one business action to the caller's case; (status, body)."""
        with self._lock:
            episode = self._owned(episode_id, token)
            episode.touched = time.monotonic()
            case = episode.case
            if case.done:
                raise Refusal(HTTPStatus.CONFLICT, "the case is closed")
            reward, reason = apply(case, action, episode.scenario, episode.rng)
            if case.timed_out:
                return HTTPStatus.GATEWAY_TIMEOUT, {**case_body(case), "error": "upstream_timeout", "reward": reward}
            status = (
                HTTPStatus.OK if reason in (None, "escalated", "withdrawn", "review_pending") else HTTPStatus.CONFLICT
            )
            if reason == "not_signed_in":
                status = HTTPStatus.UNAUTHORIZED
            elif reason == "account_flagged":
                status = HTTPStatus.FORBIDDEN
            elif reason == "evidence_required":
                status = HTTPStatus.UNPROCESSABLE_ENTITY
            return status, {**case_body(case), "reward": reward, "failure_reason": reason}

    def _owned(self, episode_id: str | None, token: str | None) -> Episode:
        if not episode_id or not token:
            raise Refusal(HTTPStatus.BAD_REQUEST, "X-Episode-Id and X-Client-Token headers are required")
        self._expire()
        episode = self._episodes.get(episode_id)
        if episode is None:
            raise Refusal(HTTPStatus.GONE, "no such episode (closed, expired or never opened)")
        if not secrets.compare_digest(episode.token, token):
            raise Refusal(HTTPStatus.FORBIDDEN, "the episode belongs to another client")
        return episode

    def _expire(self) -> None:
        now = time.monotonic()
        for episode_id in [k for k, e in self._episodes.items() if now - e.touched > self.episode_ttl_s]:
            del self._episodes[episode_id]

    def __len__(self) -> int:
        return len(self._episodes)


class _Handler(JsonRequestHandler):
    server: _Server
    max_body_bytes = MAX_BODY_BYTES

    def _dispatch(self, method: str) -> None:
        state = self.server.state
        episode_id, token = self.headers.get("X-Episode-Id"), self.headers.get("X-Client-Token")
        try:
            body = self._body()
            path = self.path.split("?", 1)[0]
            if (method, path) == ("POST", "/episodes"):
                self._reply(HTTPStatus.CREATED, state.open(body))
            elif (method, path) == ("GET", "/openapi.json"):
                self._reply(HTTPStatus.OK, openapi_spec())
            elif (method, path) == ("DELETE", "/episodes/current"):
                self._reply(HTTPStatus.OK, state.close(episode_id, token))
            elif (method, path) in ROUTES:
                if body:
                    raise Refusal(HTTPStatus.BAD_REQUEST, f"{path} takes no body fields, got {sorted(body)[:5]}")
                self._reply(*state.act(episode_id, token, ROUTES[(method, path)]))
            else:
                raise Refusal(HTTPStatus.NOT_FOUND, f"no route {method} {path[:100]}")
        except Refusal as exc:
            self._reply(exc.status, {"error": exc.reason})

    def do_GET(self) -> None:  # noqa: D102 - stdlib hook
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: D102 - stdlib hook
        self._dispatch("POST")

    def do_DELETE(self) -> None:  # noqa: D102 - stdlib hook
        self._dispatch("DELETE")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], state: RefundState) -> None:
        super().__init__(address, _Handler)
        self.state = state


class RefundService:
    """The service on a loopback port, in a daemon thread (``start``/``stop``; ``url`` once started)."""

    def __init__(self, port: int = 0, episode_ttl_s: float = DEFAULT_TTL_S) -> None:
        self.state = RefundState(episode_ttl_s)
        self._server = _Server(("127.0.0.1", port), self.state)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> RefundService:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="refund-service", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._server.shutdown()
        self._server.server_close()


_shared: RefundService | None = None
_shared_lock = threading.Lock()


def shared_service() -> RefundService:
    """One service per process for envs built without a ``base_url`` (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = RefundService().start()
        return _shared


def main() -> None:
    """``python -m agentflow_refund.service [PORT]``: serve on 127.0.0.1 until interrupted."""
    import sys

    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8765
    service = RefundService(port).start()
    sys.stdout.write(f"refund service on {service.url}\n")
    sys.stdout.flush()
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        service.stop()


if __name__ == "__main__":
    main()
