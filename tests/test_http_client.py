"""ResilientClient: timeouts, retries with backoff, circuit breaker, keep-alive -- against real sockets."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from agentflow_core.envs.base import Scenario
from agentflow_core.envs.http_client import (
    BreakerConfig,
    BreakerState,
    CircuitBreaker,
    ClientConfig,
    Outcome,
    RealClock,
    ResilientClient,
    RetryPolicy,
    SimulatedClock,
)
from agentflow_core.envs.payment_api_server import PaymentAPIServer

S = BreakerState


class _SlowHandler(BaseHTTPRequestHandler):
    """A deliberately slow server: /slow really sleeps past the client's socket timeout."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def do_GET(self) -> None:
        if self.path == "/slow":
            time.sleep(0.4)
        payload = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        try:
            self.wfile.write(payload)
        except BrokenPipeError:  # the client gave up waiting, as it should
            self.close_connection = True


@pytest.fixture(scope="module")
def slow_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def api() -> Iterator[PaymentAPIServer]:
    server = PaymentAPIServer().start()
    yield server
    server.stop()


_CLIENT_OF: dict[str, str] = {}  # episode id -> the client token that owns it


def _episode(api: PaymentAPIServer, **scenario: object) -> str:
    client = api.state.register_client()
    episode = api.state.create(Scenario(**scenario), seed=0, client=client)  # type: ignore[arg-type]
    _CLIENT_OF[episode] = client
    return episode


def _scripted(*faults: str, latency: float = 0.01) -> Iterator[dict[str, str]]:
    for fault in faults:
        yield {"X-Fault": fault, "X-Fault-Latency": str(latency)}


def _client(
    api: PaymentAPIServer,
    episode: str,
    faults: Iterator[dict[str, str]] | None = None,
    config: ClientConfig | None = None,
) -> ResilientClient:
    return ResilientClient(
        api.url,
        config or ClientConfig(),
        SimulatedClock(),
        fault_source=(lambda: next(faults)) if faults is not None else None,
        default_headers={"X-Episode-Id": episode, "X-Client-Token": _CLIENT_OF[episode]},
    )


def test_backoff_is_exponential_and_capped() -> None:
    policy = RetryPolicy(backoff_base_s=0.05, backoff_factor=2.0, backoff_max_s=0.3)
    assert [policy.backoff(k) for k in range(4)] == pytest.approx([0.05, 0.1, 0.2, 0.3])
    assert policy.allows("GET", {}) and policy.allows("DELETE", {})
    assert not policy.allows("POST", {}) and policy.allows("POST", {"Idempotency-Key": "k"})
    assert not RetryPolicy(retry_with_idempotency_key=False).allows("POST", {"Idempotency-Key": "k"})


def test_5xx_is_retried_with_backoff_on_the_simulated_clock(api: PaymentAPIServer) -> None:
    client = _client(api, _episode(api), _scripted("status=503", "status=503", "none"))
    result = client.request("GET", "/cart")
    assert (result.outcome, result.status_code, result.attempts, result.retries) == (Outcome.CLIENT_ERROR, 401, 3, 2)
    # 3 attempts x 0.01 s latency + backoff 0.05 + 0.10, all simulated: the simulated clock never sleeps
    assert result.elapsed_s == pytest.approx(0.18) and client.clock.now() == pytest.approx(0.18)
    assert result.breaker is S.CLOSED and client.breaker.consecutive_failures == 0
    client.close()


def test_dropped_requests_are_timeouts_that_cost_the_timeout(api: PaymentAPIServer) -> None:
    client = _client(api, _episode(api), _scripted("drop", "drop", "drop"))
    result = client.request("GET", "/cart")
    assert (result.outcome, result.status_code, result.json, result.attempts) == (Outcome.TIMEOUT, None, None, 3)
    assert result.elapsed_s == pytest.approx(3 * 1.0 + 0.05 + 0.10)  # on the simulated clock
    assert client.breaker.consecutive_failures == 3
    client.close()


def test_latency_past_the_timeout_is_a_timeout_and_not_applied(api: PaymentAPIServer) -> None:
    episode = _episode(api)
    late = iter([{"X-Fault": "none", "X-Fault-Latency": "2.5"}])
    client = _client(api, episode, late)
    result = client.request("POST", "/session", {})
    assert result.outcome is Outcome.TIMEOUT and result.attempts == 1  # POST without a key: no retry
    assert client.clock.now() == pytest.approx(1.0)
    check = client.request("GET", "/cart", faults=False)
    assert check.status_code == 401  # the login past the deadline was never applied
    on_time = _client(api, episode, iter([{"X-Fault": "none", "X-Fault-Latency": "0.7"}]))
    ok = on_time.request("POST", "/session", {})
    assert ok.outcome is Outcome.OK and ok.latency_s == pytest.approx(0.7) and on_time.clock.now() == pytest.approx(0.7)
    client.close()
    on_time.close()


def test_idempotency_key_makes_post_retries_safe(api: PaymentAPIServer) -> None:
    episode = _episode(api, start_stage="product_detail")
    client = _client(api, episode, _scripted("status=502", "none", "none"))
    headers = {"Idempotency-Key": "add-1"}
    first = client.request("POST", "/cart", {"quantity": 1}, headers)
    assert first.outcome is Outcome.OK and first.retries == 1 and first.json["cart"]["items"] == 1
    replay = client.request("POST", "/cart", {"quantity": 1}, headers)
    assert replay.headers.get("Idempotent-Replayed") == "true" and replay.json["cart"]["items"] == 1
    client.close()


def test_circuit_breaker_state_machine(api: PaymentAPIServer) -> None:
    config = ClientConfig(retry=RetryPolicy(max_retries=0), breaker=BreakerConfig(failure_threshold=3, cooldown_s=1.0))
    client = _client(api, _episode(api), _scripted(*["status=500"] * 3, "status=503", "none"), config)
    outcomes = [client.request("GET", "/cart").outcome for _ in range(3)]
    assert outcomes == [Outcome.SERVER_ERROR] * 3 and client.breaker.state is S.OPEN
    refused = client.request("GET", "/cart")
    assert (refused.outcome, refused.attempts, refused.breaker) == (Outcome.CIRCUIT_OPEN, 0, S.OPEN)
    client.clock.sleep(1.0)
    assert client.breaker.state is S.HALF_OPEN
    trial = client.request("GET", "/cart")  # the half-open trial fails: open again, new cooldown
    assert trial.outcome is Outcome.SERVER_ERROR and trial.breaker is S.OPEN
    client.clock.sleep(0.5)
    assert client.request("GET", "/cart").outcome is Outcome.CIRCUIT_OPEN
    client.clock.sleep(0.5)
    recovered = client.request("GET", "/cart")
    assert recovered.outcome is Outcome.CLIENT_ERROR and recovered.breaker is S.CLOSED
    assert [(a, b) for _, a, b in client.breaker.transitions] == [
        (S.CLOSED, S.OPEN),
        (S.OPEN, S.HALF_OPEN),
        (S.HALF_OPEN, S.OPEN),
        (S.OPEN, S.HALF_OPEN),
        (S.HALF_OPEN, S.CLOSED),
    ]
    client.close()


def test_breaker_stops_retries_once_open(api: PaymentAPIServer) -> None:
    config = ClientConfig(retry=RetryPolicy(max_retries=5), breaker=BreakerConfig(failure_threshold=2, cooldown_s=10.0))
    client = _client(api, _episode(api), _scripted(*["drop"] * 6), config)
    result = client.request("GET", "/cart")
    assert result.outcome is Outcome.TIMEOUT and result.attempts == 2 and result.breaker is S.OPEN
    client.close()


def test_real_socket_timeout_against_a_slow_handler(slow_url: str) -> None:
    config = ClientConfig(timeout_s=0.1, retry=RetryPolicy(max_retries=1, backoff_base_s=0.05))
    client = ResilientClient(slow_url, config, RealClock())
    result = client.request("GET", "/slow")
    assert (result.outcome, result.status_code, result.attempts) == (Outcome.TIMEOUT, None, 2)
    fast = client.request("GET", "/fast")  # the timed-out connection was discarded, a fresh one works
    assert fast.outcome is Outcome.OK and fast.json == {"path": "/fast"}
    client.close()


def test_real_clock_breaker_cools_down() -> None:
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=1, cooldown_s=0.05), RealClock())
    breaker.record(failure=True)
    assert breaker.state is S.OPEN and not breaker.allow()
    time.sleep(0.06)
    assert breaker.state is S.HALF_OPEN and breaker.allow()
    breaker.record(failure=False)
    assert breaker.state is S.CLOSED


def test_keep_alive_reuses_one_connection(api: PaymentAPIServer) -> None:
    client = _client(api, _episode(api))
    results = [client.request("GET", "/cart") for _ in range(50)]
    assert all(r.status_code == 401 for r in results)
    assert client._pool.created == 1
    client.close()


def test_connection_refused_is_a_typed_failure() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = ResilientClient(
        f"http://127.0.0.1:{port}", ClientConfig(retry=RetryPolicy(max_retries=1)), SimulatedClock()
    )
    result = client.request("GET", "/cart")
    assert (
        result.outcome is Outcome.CONNECTION_ERROR
        and result.attempts == 2
        and client.clock.now() == pytest.approx(0.05)
    )
    client.close()
    with pytest.raises(ValueError, match="base_url"):
        ResilientClient("ftp://example", ClientConfig())


@pytest.mark.timing
def test_real_socket_timeout_fires_on_time(slow_url: str) -> None:
    config = ClientConfig(timeout_s=0.1, retry=RetryPolicy(max_retries=1, backoff_base_s=0.05))
    client = ResilientClient(slow_url, config, RealClock())
    wall = time.perf_counter()
    client.request("GET", "/slow")
    took = time.perf_counter() - wall
    assert 0.25 <= took < 0.4  # two real 0.1 s timeouts + a real 0.05 s backoff, not the 0.4 s handler
    client.close()
