"""A resilient JSON HTTP client: per-request timeout, retries with exponential backoff, circuit breaker.

Transport is HTTP/1.1 (:class:`~agentflow_core.envs.http_connection.Connection`) over keep-alive connections from a small pool shared per server
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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol
from urllib.parse import urlsplit

from agentflow_core.envs.http_connection import Response, acquire_pool, release_pool

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

    def _read(self, response: Response, timeout: float, real_latency: float) -> _Attempt:
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
