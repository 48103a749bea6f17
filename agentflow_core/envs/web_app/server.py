"""The storefront's HTTP server: a real web application on ``127.0.0.1`` for a real browser to drive.

``ThreadingHTTPServer`` in a daemon thread; one server per process is shared by every browser env
(:func:`acquire_shared_storefront` / :func:`release_shared_storefront`, refcounted). Each browser
context holds one *session*, addressed by an ``HttpOnly`` cookie holding a 128-bit random token.
The business logic of a session is the storefront's own state machine
(:class:`~agentflow_core.envs.web_checkout.WebCheckoutEnv`, the same process table as the simulated
channel), so one seed and one scenario mean the same shop on both sides; what this module adds is
the web: routes, cookies, HTML documents, status codes and the JSON the client script swaps in.

Routes::

    POST /api/session  {"scenario": {...}, "seed": 7, "env_id": "..."}  -> 201, Set-Cookie; a new checkout
    GET  /app          the current page as a whole HTML document (what a reset loads)
    POST /api/act      {"type": "click", "target": "#pay-now", "fields": {...}} -> the next page as JSON
    GET  /static/app.js  the client script
    GET  <other path>  a navigation to that URL (the storefront's routes; unknown ones render its 404)

``/api/act`` answers 200 when the request was applied, 504 when the (simulated) network lost it,
401 when the session had expired, 409 when the pending order had expired or the checkout is over,
422 when the page does not offer the element. Form values travel with every click and submit and
replace what the server holds (what the user typed in the browser is what gets paid with).
"""

from __future__ import annotations

import json
import secrets
import threading
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from agentflow_core.envs.base import Scenario
from agentflow_core.envs.web_app.html import SCRIPT_PATH, body_attrs, body_html, document_html, no_session_html
from agentflow_core.envs.web_checkout import WebCheckoutEnv
from agentflow_core.envs.web_pages import SESSION_EXPIRED_TEXT, TIMEOUT_TEXT, page_parts

COOKIE = "sid"
MAX_SESSIONS = 4096  # least recently used sessions are dropped past this
MAX_BODY_BYTES = 64 * 1024
# The server never truncates an episode: the browser env counts the agent's steps and stops it.
_UNBOUNDED_STEPS = 10**9
_ACTION_TYPES = ("click", "submit")


@dataclass
class _Session:
    shop: WebCheckoutEnv
    seq: int = 0
    over: bool = False


def _script() -> bytes:
    return resources.files("agentflow_core.envs.web_app").joinpath("static/app.js").read_bytes()


class StorefrontServer:
    """The storefront web app on a loopback port (port 0: the OS picks a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._sessions: OrderedDict[str, _Session] = OrderedDict()
        self._lock = threading.Lock()
        self.script = _script()
        self._httpd = _Server((host, port), _Handler)
        self._httpd.app = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Base URL of the app (the bound port)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host.decode() if isinstance(host, bytes) else host}:{port}"

    def start(self) -> StorefrontServer:
        """Serve in a daemon thread; returns self."""
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="storefront", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with self._lock:
            self._sessions.clear()

    # ------------------------------------------------------------------ session logic
    def create_session(self, body: dict[str, Any], old_token: str | None) -> str:
        """A new checkout from the posted scenario and seed; the caller's old session is dropped."""
        params = dict(body.get("scenario") or {})
        params["max_episode_steps"] = _UNBOUNDED_STEPS
        scenario = Scenario.from_dict(params)
        seed = body.get("seed")
        if seed is not None and not isinstance(seed, int):
            raise ValueError(f"seed: got {seed!r}, expected an int or null")
        shop = WebCheckoutEnv(scenario, str(body.get("env_id", "storefront")))
        shop.reset(seed=seed)
        token = secrets.token_hex(16)
        with self._lock:
            if old_token is not None:
                self._sessions.pop(old_token, None)
            self._sessions[token] = _Session(shop)
            while len(self._sessions) > MAX_SESSIONS:
                self._sessions.popitem(last=False)
        return token

    def drop_session(self, token: str | None) -> None:
        """Forget one session (a closed browser env)."""
        with self._lock:
            if token is not None:
                self._sessions.pop(token, None)

    def session(self, token: str | None) -> _Session | None:
        """The session behind a cookie, marked most recently used."""
        with self._lock:
            found = self._sessions.get(token) if token is not None else None
            if found is not None and token is not None:
                self._sessions.move_to_end(token)
            return found

    def act(self, session: _Session, action: dict[str, Any]) -> HTTPStatus:
        """Apply one UI request to the session's checkout; the status says what happened to it."""
        session.seq += 1  # every answered request is a new page for the client, even a refused one
        if session.over:
            return HTTPStatus.CONFLICT
        state = session.shop.state
        assert state is not None
        fields = action.pop("fields", None) or {}
        for target in (state.login_fields, state.card_fields):
            for name in target.keys() & fields.keys():
                target[name] = str(fields[name])
        result = session.shop.step(action)
        session.over = result.terminated
        if result.info["applied"]:
            return HTTPStatus.OK
        banner = session.shop.last_banner
        text = banner["text"] if banner else ""
        if text == TIMEOUT_TEXT:
            return HTTPStatus.GATEWAY_TIMEOUT
        if text == SESSION_EXPIRED_TEXT:
            return HTTPStatus.UNAUTHORIZED
        return HTTPStatus.CONFLICT if banner else HTTPStatus.UNPROCESSABLE_ENTITY

    def page(self, session: _Session) -> tuple[str, str, dict[str, str], str]:
        """(title, body HTML, body attributes, URL) of the session's current page."""
        shop = session.shop
        state = shop.state
        assert state is not None
        parts = page_parts(state, shop.scenario, shop.last_banner)
        attrs = body_attrs(parts, state.cart_count, round(state.balance, 2), round(state.sim_time_s, 6), session.seq)
        return parts.title, body_html(parts), attrs, parts.url

    def document(self, session: _Session) -> str:
        """The session's current page as a whole document."""
        shop = session.shop
        state = shop.state
        assert state is not None
        parts = page_parts(state, shop.scenario, shop.last_banner)
        attrs = body_attrs(parts, state.cart_count, round(state.balance, 2), round(state.sim_time_s, 6), session.seq)
        return document_html(parts, attrs)


class _Server(ThreadingHTTPServer):
    """The stdlib server, carrying the app its handlers answer for."""

    daemon_threads = True
    app: StorefrontServer


class _Handler(BaseHTTPRequestHandler):
    """One request of the storefront (the app is ``self.server.app``)."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        """Quiet: the server prints nothing."""

    def _token(self) -> str | None:
        try:
            cookie = SimpleCookie(self.headers.get("Cookie", ""))
        except CookieError:
            return None
        morsel = cookie.get(COOKIE)
        return morsel.value if morsel is not None else None

    def _send(self, status: HTTPStatus, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: HTTPStatus, payload: Any, extra: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", extra)

    def _html(self, status: HTTPStatus, text: str) -> None:
        self._send(status, text.encode(), "text/html; charset=utf-8")

    def _read_json(self) -> dict[str, Any] | None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            self._json(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": f"body over {MAX_BODY_BYTES} bytes"})
            self.close_connection = True
            return None
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._json(HTTPStatus.BAD_REQUEST, {"error": "expected a JSON object"})
            return None
        return body

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        """The script, the current page, or a navigation to a storefront URL."""
        path = self.path.split("?", 1)[0]
        if path == SCRIPT_PATH:
            self._send(HTTPStatus.OK, self.app.script, "text/javascript; charset=utf-8")
            return
        session = self.app.session(self._token())
        if session is None:
            self._html(HTTPStatus.UNAUTHORIZED, no_session_html())
            return
        status = HTTPStatus.OK
        if path != "/app":
            status = self.app.act(session, {"type": "navigate", "url": path})
        self._html(status if status != HTTPStatus.UNPROCESSABLE_ENTITY else HTTPStatus.OK, self.app.document(session))

    def do_POST(self) -> None:  # noqa: N802 - stdlib naming
        """A new session, or one UI request on the current one."""
        body = self._read_json()
        if body is None:
            return
        if self.path == "/api/session":
            try:
                token = self.app.create_session(body, self._token())
            except (TypeError, ValueError) as exc:
                self._json(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
                return
            cookie = f"{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict"
            self._json(HTTPStatus.CREATED, {"url": "/app"}, {"Set-Cookie": cookie})
            return
        if self.path != "/api/act":
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no route {self.path}"})
            return
        session = self.app.session(self._token())
        if session is None:
            self._json(HTTPStatus.UNAUTHORIZED, {"error": "no session"})
            return
        if body.get("type") not in _ACTION_TYPES or not isinstance(body.get("fields", {}), dict):
            self._json(HTTPStatus.BAD_REQUEST, {"error": f"expected a {'|'.join(_ACTION_TYPES)} action"})
            return
        status = self.app.act(session, body)
        title, html, attrs, url = self.app.page(session)
        self._json(status, {"title": title, "html": html, "attrs": attrs, "url": url})

    def do_DELETE(self) -> None:  # noqa: N802 - stdlib naming
        """End the caller's session."""
        self.app.drop_session(self._token())
        self._json(HTTPStatus.OK, {"deleted": True})

    @property
    def app(self) -> StorefrontServer:
        """The storefront this server answers for."""
        return self.server.app  # type: ignore[attr-defined]


_shared: StorefrontServer | None = None
_shared_refs = 0
_shared_lock = threading.Lock()


def acquire_shared_storefront() -> StorefrontServer:
    """The process-wide storefront, started on first use; every acquire needs one release."""
    global _shared, _shared_refs
    with _shared_lock:
        if _shared is None:
            _shared, _shared_refs = StorefrontServer().start(), 0
        _shared_refs += 1
        return _shared


def release_shared_storefront(server: StorefrontServer) -> None:
    """Drop one reference; the last one stops the server."""
    global _shared, _shared_refs
    with _shared_lock:
        if server is not _shared:
            return
        _shared_refs -= 1
        if _shared_refs > 0:
            return
        _shared, _shared_refs = None, 0
    server.stop()
