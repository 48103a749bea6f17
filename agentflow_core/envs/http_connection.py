"""The HTTP/1.1 transport of :mod:`agentflow_core.envs.http_client`: keep-alive connections and their pools.

One :class:`Connection` sends a request in one ``sendall`` and parses the reply from a buffered
reader it keeps; :func:`acquire_pool` hands every client of one server the same small
:class:`ConnectionPool` (per process), so a thousand envs share a handful of TCP connections.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# What may go into a request line or a header (RFC 9110 §5.5/§5.6.2): nothing that could split a request.
_SAFE_TARGET = re.compile(r"[!-~]+")  # visible ASCII, no spaces
_SAFE_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SAFE_VALUE = re.compile(r"[\t -~\x80-\xff]*")
MAX_LINE = 65536  # longest status or header line accepted (http.client's limit)
MAX_HEADERS = 100


@dataclass(frozen=True)
class Response:
    """One parsed reply: status, headers (last value wins), body, and whether the server closes after it."""

    status: int
    headers: dict[str, str]
    body: bytes
    will_close: bool


class Connection:
    """One keep-alive HTTP/1.1 connection (RFC 9112) over a TCP socket, connected on first use.

    Why not ``http.client``: per exchange it builds the request through ``putrequest``/``putheader``,
    sends headers and body in two segments, opens a new file object and parses the reply headers
    with the ``email`` package -- about as much CPU as the server's whole handler. Here a request
    leaves in one ``sendall`` (Nagle off) and the reply is read from one buffered reader kept for
    the connection's life. Replies are framed by ``Content-Length`` (or by the close of a
    ``Connection: close`` reply); chunked replies and malformed status or header lines raise
    :class:`http.client.HTTPException`, oversized ones too.
    """

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.host, self.port, self.timeout = host, port, timeout
        self.sock: socket.socket | None = None
        self._reader: Any = None
        self._host_header = f"Host: {host}:{port}\r\n"

    def set_timeout(self, timeout: float) -> None:
        """Applies to the open socket too, so a reused keep-alive connection honours the new timeout."""
        self.timeout = timeout
        if self.sock is not None:
            self.sock.settimeout(timeout)

    def exchange(self, method: str, path: str, payload: bytes | None, headers: Mapping[str, str]) -> Response:
        """Send one request and read its reply (connecting first if needed)."""
        if self.sock is None:
            self.sock = socket.create_connection((self.host, self.port), self.timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._reader = self.sock.makefile("rb")
        if not _SAFE_TARGET.fullmatch(path) or not _SAFE_TOKEN.fullmatch(method):
            raise http.client.InvalidURL(f"request target or method with control characters or spaces: {path[:80]!r}")
        if any(not _SAFE_TOKEN.fullmatch(name) or not _SAFE_VALUE.fullmatch(value) for name, value in headers.items()):
            raise ValueError("header name or value with control characters (request splitting)")
        lines = [f"{method} {path} HTTP/1.1\r\n", self._host_header]
        lines.extend(f"{name}: {value}\r\n" for name, value in headers.items())
        if payload is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {0 if payload is None else len(payload)}\r\n")
        lines.append("\r\n")
        self.sock.sendall("".join(lines).encode("latin-1") + (payload or b""))
        return self._read_response()

    def _line(self) -> bytes:
        line: bytes = self._reader.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("reply line")
        return line

    def _read_response(self) -> Response:
        status_line = self._line()
        if not status_line:
            raise http.client.RemoteDisconnected("connection closed before a reply")
        version, _, rest = status_line.decode("latin-1").partition(" ")
        code = rest[:3]
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise http.client.BadStatusLine(status_line.decode("latin-1", "replace").rstrip())
        headers: dict[str, str] = {}
        while True:
            line = self._line()
            if line in (b"\r\n", b"\n"):
                break
            if not line or len(headers) >= MAX_HEADERS:
                raise http.client.HTTPException("reply headers truncated or too many")
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise http.client.HTTPException(f"malformed reply header {line[:80]!r}")
            headers[name.strip()] = value.strip()
        lowered = {name.lower(): value for name, value in headers.items()}
        connection = lowered.get("connection", "").lower()
        will_close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
        if "transfer-encoding" in lowered:
            raise http.client.HTTPException("chunked replies are not supported")
        length = lowered.get("content-length")
        if length is None:
            body, will_close = self._reader.read(), True  # framed by the close of the connection
        elif not length.isdigit():
            raise http.client.HTTPException(f"invalid Content-Length {length!r}")
        else:
            body = self._reader.read(int(length))
            if len(body) < int(length):
                raise http.client.IncompleteRead(body, int(length) - len(body))
        return Response(int(code), headers, body, will_close)

    def close(self) -> None:
        """Close the socket (the next exchange reconnects)."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self.sock is not None:
            self.sock.close()
            self.sock = None


class ConnectionPool:
    """Idle keep-alive connections to one ``host:port``; thread-safe, bounded."""

    def __init__(self, host: str, port: int, max_idle: int = 4) -> None:
        self.host, self.port, self.max_idle = host, port, max_idle
        self._idle: list[Connection] = []
        self._lock = threading.Lock()
        self.created = 0

    def get(self, timeout: float) -> tuple[Connection, bool]:
        """A connection with ``timeout`` set, and whether it was reused (may be stale)."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
            if conn is None:
                self.created += 1
        if conn is None:
            return Connection(self.host, self.port, timeout), False
        conn.set_timeout(timeout)
        return conn, True

    def put(self, conn: Connection) -> None:
        """Return a connection for reuse; past ``max_idle`` it is closed instead."""
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection; ones lent out are closed by their borrowers' ``put``."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


_pools_lock = threading.Lock()
_pools: dict[tuple[str, int], tuple[ConnectionPool, int]] = {}


def acquire_pool(host: str, port: int, max_idle: int = 4) -> ConnectionPool:
    """The process-wide pool for one server (refcounted): many clients, few connections."""
    with _pools_lock:
        pool, refs = _pools.get((host, port), (None, 0))
        if pool is None:
            pool = ConnectionPool(host, port, max_idle)
        _pools[(host, port)] = (pool, refs + 1)
        return pool


def release_pool(pool: ConnectionPool) -> None:
    """Drop one reference; the last one closes the idle connections (so server threads end)."""
    with _pools_lock:
        current, refs = _pools.get((pool.host, pool.port), (None, 0))
        if current is not pool:
            pool.close()
            return
        if refs > 1:
            _pools[(pool.host, pool.port)] = (pool, refs - 1)
            return
        del _pools[(pool.host, pool.port)]
    pool.close()
