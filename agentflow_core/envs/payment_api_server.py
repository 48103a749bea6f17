"""The payment HTTP JSON API that :class:`~agentflow_core.envs.payment_api.PaymentAPIEnv` talks to.

A real server on ``127.0.0.1`` (port 0 = a free port): ``http.server.ThreadingHTTPServer`` in a
daemon thread. One server per process is shared by every env (:func:`acquire_shared_server` /
:func:`release_shared_server`, refcounted), each env holding one *episode* on it, addressed by the
``X-Episode-Id`` header. The business process is the table of ``docs/architecture.md``.
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

Hardening (the server is reachable by every local process): it binds loopback only; a client
registers (``POST /clients``) and sends its random token (``X-Client-Token``) with every request;
an episode id is a 128-bit random bearer token that answers only the client that created it
(replace and delete too), so a second local client cannot address another env's order; a client
holds at most ``MAX_EPISODES_PER_CLIENT`` episodes, an episode no request has reached expires in
seconds (one in use after ``episode_ttl_s``), and at the server-wide caps the least recently used episode or client makes room, so a
flooding client cannot lock out one whose episodes are in use (:class:`PaymentAPIState`); a
connection silent for ``IDLE_CONNECTION_TIMEOUT_S`` is closed; bodies over ``MAX_BODY_BYTES`` are
refused unread; conflicting ``Content-Length`` headers are refused; and every malformed request
(bad header values, bad JSON, a fault status outside 500-599, unknown fields) gets a well-formed
4xx reply, never a dropped connection or an invalid status line.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import os
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from agentflow_core.envs.base import Scenario
from agentflow_core.envs.payment_api_app import MAX_BODY_BYTES, BadRequest, PaymentAPIState, Response

logger = logging.getLogger("agentflow.payment_api")

_HTTP_VERSION = re.compile(r"HTTP/(\d{1,10})\.(\d{1,10})")
_HEADER_LINE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*")
MAX_HEADER_LINE = 65536  # the stdlib's limits (http.client._MAXLINE, _MAXHEADERS)
MAX_HEADERS = 100
IDLE_CONNECTION_TIMEOUT_S = 10.0  # a connection silent this long (idle keep-alive, a stalled request) is closed


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
        name, value = match.group(1).lower(), match.group(2)
        if name == "content-length" and headers.get(name, value) != value:  # request smuggling (RFC 9112 §6.3)
            raise _BadHeaders(HTTPStatus.BAD_REQUEST, "Conflicting Content-Length")
        headers.setdefault(name, value)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one TCP connection serves many requests
    default_request_version = "HTTP/1.1"  # stdlib's HTTP/0.9 default answers garbage with no status line
    disable_nagle_algorithm = True
    timeout = IDLE_CONNECTION_TIMEOUT_S  # the socket timeout StreamRequestHandler.setup applies
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
        if self.close_connection:  # e.g. a refused body left unread: the client must not reuse the connection
            self.send_header("Connection", "close")
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
        client = str(self.headers.get("X-Client-Token", ""))
        if path == "/clients" and method == "POST":
            return 201, {"client_token": state.register_client()}, {}
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
            episode_id = state.create(
                scenario, seed % 2**63, replace if isinstance(replace, str) else None, client=client
            )
            if first is None:
                return 201, {"episode_id": episode_id}, {}
            # The client's first look at the new episode, answered with it (one round trip, not two):
            # the same route, at step 0 and without faults, as a separate GET would take.
            look = {"X-Episode-Id": episode_id, "X-Client-Token": client, "X-Step": "0"}
            status, reply, _ = state.handle("GET", first["path"], look, {})
            return 201, {"episode_id": episode_id, "first": {"status": status, "body": reply}}, {}
        if path.startswith("/episodes/") and method == "DELETE":
            found = state.delete(path[len("/episodes/") :], client)
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
