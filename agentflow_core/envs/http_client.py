"""A resilient JSON HTTP client: per-request timeout, retries with exponential backoff, circuit breaker.

Transport is HTTP/1.1 (:class:`Connection`) over keep-alive connections from a small pool shared per server
(per process), so a thousand envs talking to one server reuse a handful of TCP connections --
and the server a handful of handler threads -- instead of one each.

Time is injected (:class:`Clock`). In env mode a :class:`SimulatedClock` is used: latency the
server reports in ``X-Sim-Latency`` advances it, a reply marked ``X-Sim-Outcome`` (dropped, or
past the deadline) counts as a timeout that costs the full timeout, and backoff "sleeps" only
advance it -- training never sleeps. With :class:`RealClock` backoff really sleeps and a server
that really stalls past the socket timeout is a real timeout.

Circuit breaker (Nygard, *Release It!*): ``closed`` --N consecutive failures--> ``open``
--cooldown elapsed--> ``half_open`` --one trial: success--> ``closed`` / failure --> ``open``.
Failures are timeouts, connection errors and 5xx; any other status shows the server is healthy.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import urlsplit

IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})  # RFC 9110 §9.2.2


class Outcome(StrEnum):
    """Typed result of one request, after retries."""

    OK = "ok"  # 2xx
    CLIENT_ERROR = "client_error"  # 4xx: the server answered and refused
    SERVER_ERROR = "server_error"  # 5xx
    TIMEOUT = "timeout"  # no answer within the timeout (real, dropped, or simulated latency)
    CONNECTION_ERROR = "connection_error"  # refused / reset
    CIRCUIT_OPEN = "circuit_open"  # not sent: the breaker is open

    @classmethod
    def of_status(cls, status: int) -> Outcome:
        """The outcome of a reply that came in time."""
        return cls.OK if status < 400 else cls.CLIENT_ERROR if status < 500 else cls.SERVER_ERROR

    @property
    def is_failure(self) -> bool:
        """Does this outcome count against the circuit breaker (and allow a retry)?"""
        return self in (Outcome.SERVER_ERROR, Outcome.TIMEOUT, Outcome.CONNECTION_ERROR)


class BreakerState(StrEnum):
    """The circuit breaker's states (Nygard, *Release It!*): requests pass, fail fast, or one probe passes."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Clock(Protocol):
    """Where time comes from: real for the client tests, simulated for training."""

    def now(self) -> float:
        """Seconds on a monotonic scale."""

    def sleep(self, seconds: float) -> None:
        """Wait before the next attempt (backoff)."""

    def elapse(self, seconds: float) -> None:
        """Time spent waiting on the network (a real clock has already spent it)."""
        ...


class RealClock:
    """Wall time (monotonic); backoff really sleeps."""

    def now(self) -> float:
        """Monotonic seconds."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        """Block for real."""
        time.sleep(seconds)

    def elapse(self, seconds: float) -> None:
        """Nothing to do: real waiting already took real time."""


@dataclass
class SimulatedClock:
    """A clock only the client moves: latency and backoff advance it, nothing sleeps."""

    t: float = 0.0

    def now(self) -> float:
        """The simulated time ``t``."""
        return self.t

    def sleep(self, seconds: float) -> None:
        """Advance simulated time instead of blocking."""
        self.t += seconds

    def elapse(self, seconds: float) -> None:
        """Network waiting costs simulated time as well."""
        self.t += seconds


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff ``base * factor**k`` capped at ``max``; like urllib3's ``Retry``, only
    idempotent methods (and requests carrying an ``Idempotency-Key``) are retried automatically."""

    max_retries: int = 2
    backoff_base_s: float = 0.05
    backoff_factor: float = 2.0
    backoff_max_s: float = 1.0
    methods: frozenset[str] = IDEMPOTENT_METHODS
    retry_with_idempotency_key: bool = True

    def backoff(self, retry: int) -> float:
        """Delay before retry number ``retry`` (0-based)."""
        return min(self.backoff_base_s * self.backoff_factor**retry, self.backoff_max_s)

    def allows(self, method: str, headers: Mapping[str, str]) -> bool:
        """May this request be retried automatically (is it safe to send twice)?"""
        return method in self.methods or (self.retry_with_idempotency_key and "Idempotency-Key" in headers)


@dataclass(frozen=True)
class BreakerConfig:
    """When the breaker opens (consecutive failures) and how long it stays open."""

    failure_threshold: int = 5
    cooldown_s: float = 0.5


@dataclass(frozen=True)
class ClientConfig:
    """Per-request timeout, retry and breaker settings, and how many idle keep-alive connections to hold."""

    timeout_s: float = 1.0
    retry: RetryPolicy = RetryPolicy()
    breaker: BreakerConfig = BreakerConfig()
    max_idle_connections: int = 4


class CircuitBreaker:
    """Closed → open after N consecutive failures → half-open after a cooldown → closed on success."""

    def __init__(self, config: BreakerConfig, clock: Clock) -> None:
        self.config, self.clock = config, clock
        self._state = BreakerState.CLOSED
        self.consecutive_failures = 0
        self.opened_at = 0.0
        self.transitions: list[tuple[float, BreakerState, BreakerState]] = []

    def _move(self, to: BreakerState) -> None:
        if to is not self._state:
            self.transitions.append((self.clock.now(), self._state, to))
            self._state = to

    @property
    def state(self) -> BreakerState:
        """Current state; an open breaker whose cooldown has passed reads half-open."""
        if self._state is BreakerState.OPEN and self.clock.now() - self.opened_at >= self.config.cooldown_s:
            self._move(BreakerState.HALF_OPEN)
        return self._state

    def allow(self) -> bool:
        """May a request go out now? (Half-open lets trials through until one resolves it.)"""
        return self.state is not BreakerState.OPEN

    def record(self, failure: bool) -> None:
        """Feed one attempt's outcome into the state machine."""
        if not failure:
            self.consecutive_failures = 0
            self._move(BreakerState.CLOSED)
            return
        self.consecutive_failures += 1
        if self.state is BreakerState.HALF_OPEN or self.consecutive_failures >= self.config.failure_threshold:
            self.opened_at = self.clock.now()
            self._move(BreakerState.OPEN)


@dataclass(frozen=True)
class HttpResult:
    """The last HTTP exchange of one logical request, with what the resilience layer did."""

    outcome: Outcome
    status_code: int | None
    json: dict[str, Any] | None
    headers: dict[str, str]
    latency_s: float  # of the last attempt (simulated when the server reports it)
    elapsed_s: float  # clock time of the whole request, backoff included
    attempts: int
    retries: int
    breaker: BreakerState

    @property
    def ok(self) -> bool:
        """The exchange ended in a reply below 400 (not an HTTP error, a timeout or a refused connection)."""
        return self.outcome is Outcome.OK


@dataclass(frozen=True)
class _Attempt:
    outcome: Outcome
    status_code: int | None = None
    json: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    latency_s: float = 0.0


# What may go into a request line or a header (RFC 9110 §5.5/§5.6.2): nothing that could split a request.
_SAFE_TARGET = re.compile(r"[!-~]+")  # visible ASCII, no spaces
_SAFE_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_SAFE_VALUE = re.compile(r"[\t -~\x80-\xff]*")
MAX_LINE = 65536  # longest status or header line accepted (http.client's limit)
MAX_HEADERS = 100


@dataclass(frozen=True)
class _Response:
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

    def exchange(self, method: str, path: str, payload: bytes | None, headers: Mapping[str, str]) -> _Response:
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

    def _read_response(self) -> _Response:
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
        return _Response(int(code), headers, body, will_close)

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


FaultSource = Callable[[], Mapping[str, str]]


class ResilientClient:
    """JSON over HTTP with timeout, retry/backoff and a circuit breaker; see the module docstring.

    ``fault_source`` is called once per attempt for extra headers (the env's seeded fault draws).
    """

    def __init__(
        self,
        base_url: str,
        config: ClientConfig | None = None,
        clock: Clock | None = None,
        fault_source: FaultSource | None = None,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"base_url: got {base_url!r}, expected http://host:port")
        self.base_url = base_url
        self.config = config or ClientConfig()
        self.clock: Clock = clock if clock is not None else RealClock()
        self.breaker = CircuitBreaker(self.config.breaker, self.clock)
        self.fault_source = fault_source
        self.default_headers = dict(default_headers or {})
        self._pool = acquire_pool(parts.hostname, parts.port or 80, self.config.max_idle_connections)
        self._closed = False

    def request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        faults: bool = True,
    ) -> HttpResult:
        """Send one logical request; retries and breaker decisions happen here."""
        method = method.upper()
        all_headers = {**self.default_headers, **(headers or {})}
        payload = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        started = self.clock.now()
        if not self.breaker.allow():
            return HttpResult(Outcome.CIRCUIT_OPEN, None, None, {}, 0.0, 0.0, 0, 0, self.breaker.state)
        retry = self.config.retry
        attempts = 0
        while True:
            attempt = self._attempt(method, path, payload, all_headers, faults)
            attempts += 1
            self.breaker.record(attempt.outcome.is_failure)
            retries_left = attempts <= retry.max_retries
            if not (
                attempt.outcome.is_failure
                and retries_left
                and retry.allows(method, all_headers)
                and self.breaker.allow()
            ):
                break
            self.clock.sleep(retry.backoff(attempts - 1))
        return HttpResult(
            attempt.outcome,
            attempt.status_code,
            attempt.json,
            attempt.headers,
            attempt.latency_s,
            self.clock.now() - started,
            attempts,
            attempts - 1,
            self.breaker.state,
        )

    def _attempt(
        self, method: str, path: str, payload: bytes | None, headers: dict[str, str], faults: bool
    ) -> _Attempt:
        timeout = self.config.timeout_s
        send_headers = {**headers, "X-Request-Timeout": f"{timeout:.6f}"}
        if payload is not None:
            send_headers["Content-Type"] = "application/json"
        if faults and self.fault_source is not None:
            send_headers.update(self.fault_source())
        began = time.perf_counter()
        for _ in range(2):  # a stale keep-alive connection gets one fresh reconnect
            conn, reused = self._pool.get(timeout)
            try:
                response = conn.exchange(method, path, payload, send_headers)
            except TimeoutError:
                conn.close()
                self.clock.elapse(timeout)
                return _Attempt(Outcome.TIMEOUT, latency_s=time.perf_counter() - began)
            except (ConnectionError, http.client.HTTPException, OSError):
                conn.close()
                if reused:
                    continue
                return _Attempt(Outcome.CONNECTION_ERROR, latency_s=time.perf_counter() - began)
            if response.will_close:
                conn.close()
            else:
                self._pool.put(conn)
            return self._read(response, timeout, time.perf_counter() - began)
        return _Attempt(Outcome.CONNECTION_ERROR, latency_s=time.perf_counter() - began)

    def _read(self, response: _Response, timeout: float, real_latency: float) -> _Attempt:
        reply_headers, data = response.headers, response.body
        simulated = reply_headers.get("X-Sim-Latency")
        latency = float(simulated) if simulated is not None else real_latency
        if reply_headers.get("X-Sim-Outcome") or latency > timeout:
            self.clock.elapse(timeout)
            return _Attempt(Outcome.TIMEOUT, headers=reply_headers, latency_s=timeout)
        if simulated is not None:
            self.clock.elapse(latency)
        status = response.status
        try:
            body = json.loads(data) if data else None
        except ValueError:
            body = {"raw": data.decode("utf-8", "replace")}
        if body is not None and not isinstance(body, dict):
            body = {"value": body}
        return _Attempt(Outcome.of_status(status), status, body, reply_headers, latency)

    def close(self) -> None:
        """Release this client's share of the connection pool (idempotent)."""
        if not self._closed:
            self._closed = True
            release_pool(self._pool)

    def __enter__(self) -> ResilientClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
