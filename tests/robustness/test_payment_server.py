"""The loopback payment server under hostile local clients: random bearer ids, expiry, caps, 4xx."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator

import pytest

from agentflow_core.envs import payment_api_app as app_mod
from agentflow_core.envs.base import Scenario
from agentflow_core.envs.payment_api_app import PaymentAPIState
from agentflow_core.envs.payment_api_server import PaymentAPIServer

STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3}) [^\r\n]*\r\n")


@pytest.fixture(scope="module")
def api() -> Iterator[PaymentAPIServer]:
    server = PaymentAPIServer().start()
    yield server
    server.stop()


def raw(api: PaymentAPIServer, request: bytes) -> tuple[int, bytes]:
    """Send bytes on a fresh connection; the status code and body of the (well-formed) first response."""
    host, port = api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed without a response: {data!r}"
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        match = STATUS_LINE.match(head + b"\r\n")
        assert match, f"invalid status line: {head[:80]!r}"
        length = int(re.search(rb"Content-Length: (\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            body += sock.recv(65536)
        return int(match.group(1)), body


def post(path: str, body: bytes = b"{}", **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _create(api: PaymentAPIServer) -> str:
    status, body = raw(api, post("/episodes", json.dumps({"scenario": {}, "seed": 1}).encode()))
    assert status == 201
    return str(json.loads(body)["episode_id"])


def test_episode_ids_are_random_bearer_tokens(api: PaymentAPIServer) -> None:
    first, second = _create(api), _create(api)
    assert re.fullmatch(r"ep-[A-Za-z0-9_-]{22}", first) and first != second
    for guess in ("ep-1", "ep-2", first[:-1]):  # another local client guessing ids reaches nothing
        status, body = raw(api, post("/order/cancel", X_Episode_Id=guess))
        assert (status, json.loads(body)["error"]["code"]) == (404, "unknown_episode")
        assert raw(api, f"DELETE /episodes/{guess} HTTP/1.1\r\nHost: x\r\n\r\n".encode())[0] == 404
    status, _ = raw(api, post("/episodes", json.dumps({"replace": "ep-1"}).encode()))
    assert status == 201 and first in api.state.episodes  # replace only ever drops the caller's own id
    assert raw(api, f"DELETE /episodes/{first} HTTP/1.1\r\nHost: x\r\n\r\n".encode())[0] == 200


def test_episodes_expire_and_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    state = PaymentAPIState(episode_ttl_s=60.0, clock=lambda: now[0])
    old = state.create(Scenario(), seed=0)
    now[0] = 30.0
    kept = state.create(Scenario(), seed=0)
    now[0] = 70.0  # old unused for 70 s, kept for 40 s
    assert state.handle("GET", "/cart", {"X-Episode-Id": old}, {})[0] == 404
    assert state.handle("GET", "/cart", {"X-Episode-Id": kept}, {})[0] != 404
    assert list(state.episodes) == [kept]
    monkeypatch.setattr(app_mod, "MAX_EPISODES", 3)
    state.create(Scenario(), seed=0)
    state.create(Scenario(), seed=0)
    with pytest.raises(app_mod.BadRequest, match="too_many_episodes"):
        state.create(Scenario(), seed=0)


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (post("/cart", X_Fault="status=0"), 400, b"invalid_x_fault"),
        (post("/cart", X_Fault="status=99999"), 400, b"invalid_x_fault"),
        (post("/cart", X_Fault="explode"), 400, b"invalid_x_fault"),
        (post("/cart", X_Fault_Latency="abc"), 400, b"invalid_x_fault_latency"),
        (post("/cart", X_Fault_Latency="nan"), 400, b"invalid_x_fault_latency"),
        (post("/cart", X_Request_Timeout="-1"), 400, b"invalid_x_request_timeout"),
        (post("/cart", X_Step="1e400"), 400, b"invalid_x_step"),
        (post("/cart", X_Step="-5"), 400, b"invalid_x_step"),
        (b"POST /cart HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400, b"invalid_content_length"),
        (b"POST /cart HTTP/1.1\r\nHost: x\r\nContent-Length: -3\r\n\r\n", 400, b"invalid_content_length"),
        (b"POST /cart HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000\r\n\r\n", 413, b"body_too_large"),
        (b"POST /cart HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411, b"length_required"),
        (post("/episodes", b"{not json"), 400, b"invalid_json"),
        (post("/episodes", b"\xff\xfe"), 400, b"invalid_json"),
        (post("/episodes", b"[" * 30_000 + b"]" * 30_000), 400, b"invalid_json"),
        (post("/episodes", b"[]"), 400, b"invalid_json"),
        (post("/episodes", b'{"scenario": [1]}'), 400, b"invalid_scenario"),
        (post("/episodes", b'{"scenario": {"no_such_field": 1}}'), 400, b"invalid_scenario"),
        (post("/episodes", b'{"seed": "x"}'), 400, b"invalid_scenario"),
        (b"GARBAGE\r\n\r\n", 400, b""),
        (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, b""),
        (b"GET /cart\r\n\r\n", 400, b""),  # HTTP/0.9
        (b"GET /cart HTTP/2.0\r\n\r\n", 505, b""),
        (b"GET /cart HTTP/1.x\r\n\r\n", 400, b""),
        (b"GET /cart HTTP/1.1\r\nHost: x\r\n folded: value\r\n\r\n", 400, b""),
        (b"GET /cart HTTP/1.1\r\nno colon here\r\n\r\n", 400, b""),
        (b"GET /cart HTTP/1.1\r\nX-Long: " + b"a" * 70_000 + b"\r\n\r\n", 431, b""),
        (b"GET /cart HTTP/1.1\r\n" + b"X-Many: 1\r\n" * 101 + b"\r\n", 431, b""),
    ],
)
def test_every_malformed_request_gets_a_well_formed_4xx(
    api: PaymentAPIServer, request_bytes: bytes, status: int, code: bytes
) -> None:
    got, body = raw(api, request_bytes)
    assert got == status and code in body


def test_a_large_body_is_refused_unread(api: PaymentAPIServer) -> None:
    body = b'{"pad": "' + b"x" * (app_mod.MAX_BODY_BYTES + 1) + b'"}'
    assert raw(api, post("/episodes", body))[0] == 413


@pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.10", "::", "example.com"])
def test_the_server_binds_loopback_only(host: str) -> None:
    with pytest.raises(ValueError, match="loopback only"):
        PaymentAPIServer(host=host)


@pytest.mark.parametrize(
    "first", [b'"GET /cart"', b'{"method": "POST", "path": "/cart"}', b'{"method": "GET", "path": 3}', b"[]"]
)
def test_a_malformed_first_request_is_refused_before_any_episode_is_made(api: PaymentAPIServer, first: bytes) -> None:
    before = len(api.state.episodes)
    got, body = raw(api, post("/episodes", b'{"seed": 1, "first": ' + first + b"}"))
    assert got == 400 and b"invalid_first" in body and len(api.state.episodes) == before


def test_the_first_exchange_comes_back_with_the_new_episode(api: PaymentAPIServer) -> None:
    """``first`` is answered exactly as a separate GET at step 0 on the new episode would be."""
    got, body = raw(api, post("/episodes", b'{"seed": 1, "first": {"method": "GET", "path": "/cart"}}'))
    reply = json.loads(body)
    assert got == 201 and reply["first"] == {
        "status": 401,
        "body": {"session": {"status": "none", "logged_in": False}, "error": {"code": "unauthenticated"}},
    }
    headers = f"X-Episode-Id: {reply['episode_id']}\r\nX-Step: 0\r\nHost: x\r\n"
    got, body = raw(api, f"GET /cart HTTP/1.1\r\n{headers}\r\n".encode())
    assert got == reply["first"]["status"] and json.loads(body) == reply["first"]["body"]
