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


def _client(api: PaymentAPIServer) -> str:
    status, body = raw(api, post("/clients"))
    assert status == 201
    return str(json.loads(body)["client_token"])


def _create(api: PaymentAPIServer, client: str) -> str:
    status, body = raw(api, post("/episodes", json.dumps({"scenario": {}, "seed": 1}).encode(), X_Client_Token=client))
    assert status == 201
    return str(json.loads(body)["episode_id"])


def delete(episode: str, client: str) -> bytes:
    return f"DELETE /episodes/{episode} HTTP/1.1\r\nHost: x\r\nX-Client-Token: {client}\r\n\r\n".encode()


def test_episode_ids_are_random_bearer_tokens(api: PaymentAPIServer) -> None:
    client = _client(api)
    first, second = _create(api, client), _create(api, client)
    assert re.fullmatch(r"ep-[A-Za-z0-9_-]{22}", first) and first != second
    for guess in ("ep-1", "ep-2", first[:-1]):  # another local client guessing ids reaches nothing
        status, body = raw(api, post("/order/cancel", X_Episode_Id=guess, X_Client_Token=client))
        assert (status, json.loads(body)["error"]["code"]) == (404, "unknown_episode")
        assert raw(api, delete(guess, client))[0] == 404
    status, _ = raw(api, post("/episodes", json.dumps({"replace": "ep-1"}).encode(), X_Client_Token=client))
    assert status == 201 and first in api.state.episodes  # replace only ever drops the caller's own id
    assert raw(api, delete(first, client))[0] == 200


def test_another_client_cannot_act_on_or_delete_an_episode_even_knowing_its_id(api: PaymentAPIServer) -> None:
    owner, other = _client(api), _client(api)
    episode = _create(api, owner)
    for token in (other, "", "cl-forged"):
        status, body = raw(api, post("/order/cancel", X_Episode_Id=episode, X_Client_Token=token))
        assert (status, json.loads(body)["error"]["code"]) == (404, "unknown_episode")
        assert raw(api, delete(episode, token))[0] == 404
        replaced = post("/episodes", json.dumps({"replace": episode}).encode(), X_Client_Token=other)
        assert raw(api, replaced)[0] == 201 and episode in api.state.episodes
    status, body = raw(api, post("/episodes", b"{}"))  # no token: no episode
    assert (status, json.loads(body)["error"]["code"]) == (401, "unknown_client")
    assert raw(api, delete(episode, owner))[0] == 200


def test_episodes_expire_and_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    state = PaymentAPIState(episode_ttl_s=60.0, clock=lambda: now[0], unused_ttl_s=5.0)
    client = state.register_client()
    never_used = state.create(Scenario(), seed=0, client=client)
    old = state.create(Scenario(), seed=0, client=client)
    assert state.handle("GET", "/cart", {"X-Episode-Id": old, "X-Client-Token": client}, {})[0] != 404
    now[0] = 6.0  # an episode no request reached is gone in seconds; one in use stays
    assert state.handle("GET", "/cart", {"X-Episode-Id": never_used, "X-Client-Token": client}, {})[0] == 404
    assert old in state.episodes
    now[0] = 30.0
    kept = state.create(Scenario(), seed=0, client=client)
    assert state.handle("GET", "/cart", {"X-Episode-Id": kept, "X-Client-Token": client}, {})[0] != 404
    now[0] = 70.0  # old idle for 70 s, kept for 40 s
    assert state.handle("GET", "/cart", {"X-Episode-Id": old, "X-Client-Token": client}, {})[0] == 404
    assert state.handle("GET", "/cart", {"X-Episode-Id": kept, "X-Client-Token": client}, {})[0] != 404
    assert list(state.episodes) == [kept]
    now[0] = 200.0  # nothing used for 130 s: the episode and its client are gone
    assert state.handle("GET", "/cart", {"X-Episode-Id": kept, "X-Client-Token": client}, {})[0] == 404
    assert not state.clients
    with pytest.raises(app_mod.BadRequest, match="unknown_client"):
        state.create(Scenario(), seed=0, client=client)
    monkeypatch.setattr(app_mod, "MAX_EPISODES_PER_CLIENT", 2)
    flooder, quiet = state.register_client(), state.register_client()
    state.create(Scenario(), seed=0, client=flooder)
    state.create(Scenario(), seed=0, client=flooder)
    with pytest.raises(app_mod.BadRequest, match="client_quota"):
        state.create(Scenario(), seed=0, client=flooder)
    assert state.create(Scenario(), seed=0, client=quiet)  # the quota is the flooder's alone
    monkeypatch.setattr(app_mod, "MAX_EPISODES", 3)
    busy = state.create(Scenario(), seed=0, client=quiet)  # at the cap: the least recently used episode goes
    assert len(state.episodes) == 3 and busy in state.episodes


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
        (b"POST /episodes HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\n{}", 400, b""),
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
    client = _client(api)
    got, body = raw(
        api, post("/episodes", b'{"seed": 1, "first": {"method": "GET", "path": "/cart"}}', X_Client_Token=client)
    )
    reply = json.loads(body)
    assert got == 201 and reply["first"] == {
        "status": 401,
        "body": {"session": {"status": "none", "logged_in": False}, "error": {"code": "unauthenticated"}},
    }
    headers = f"X-Episode-Id: {reply['episode_id']}\r\nX-Client-Token: {client}\r\nX-Step: 0\r\nHost: x\r\n"
    got, body = raw(api, f"GET /cart HTTP/1.1\r\n{headers}\r\n".encode())
    assert got == reply["first"]["status"] and json.loads(body) == reply["first"]["body"]


FLOOD = """
import json, socket, sys, time
host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
sock = socket.create_connection((host, port))
reader = sock.makefile("rb")
def call(path, body=b"{}", token=""):
    head = f"POST {path} HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: {len(body)}\\r\\nX-Client-Token: {token}\\r\\n\\r\\n"
    sock.sendall(head.encode() + body)
    status = int(reader.readline().split()[1])
    length = 0
    while (line := reader.readline()) not in (b"\\r\\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return status, json.loads(reader.read(length) or b"{}")
counts, token, end = {}, "", time.monotonic() + seconds
while time.monotonic() < end:
    if not token or counts.get(429, 0) % 50 == 49:  # now and then a fresh client token, to spread the flood
        token = call("/clients")[1]["client_token"]
    status, _ = call("/episodes", token=token)
    counts[status] = counts.get(status, 0) + 1
print(json.dumps(counts))
"""


LOCKED_OUT = {"unknown_episode", "unknown_client", "client_quota", "too_many_episodes"}


def _served(raw_obs: dict[str, object]) -> bool:
    """An answer from the episode's business rules (a 401 'unauthenticated' is one), not a refusal of the episode."""
    body = raw_obs["json"] if isinstance(raw_obs["json"], dict) else {}
    return raw_obs["status_code"] is not None and body.get("error", {}).get("code") not in LOCKED_OUT


def test_a_flooding_local_client_does_not_lock_out_another(api: PaymentAPIServer) -> None:
    """One local process creates episodes as fast as it can; an env's episodes start and finish throughout."""
    import subprocess
    import sys
    import time

    from agentflow_core.envs.payment_api import PaymentAPIEnv

    host, port = api.url.removeprefix("http://").split(":")
    flood = subprocess.Popen([sys.executable, "-c", FLOOD, host, port, "6"], stdout=subprocess.PIPE, text=True)
    env = PaymentAPIEnv(Scenario(), "payment_api_v1_neighbour", server_url=api.url)
    try:
        time.sleep(1.0)  # the flood is under way
        episodes, started = 0, time.monotonic()
        while flood.poll() is None:
            raw_obs, _ = env.reset(seed=episodes)
            assert _served(raw_obs), raw_obs
            for _ in range(4):
                assert _served(env.step({"type": "http", "method": "GET", "path": "/cart"}).obs)
            episodes += 1
        assert episodes >= 5, f"{episodes} episodes in {time.monotonic() - started:.1f} s"
    finally:
        env.close()
        flood.wait(timeout=30)
    counts = json.loads(flood.stdout.read())  # type: ignore[union-attr]
    assert counts.get("429", 0) > 0 and counts.get("201", 0) >= app_mod.MAX_EPISODES_PER_CLIENT  # capped, not served


def test_an_idle_connection_is_closed(api: PaymentAPIServer, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from agentflow_core.envs import payment_api_server as server_mod

    monkeypatch.setattr(server_mod._Handler, "timeout", 0.5)
    host, port = api.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b"GET /cart HTTP/1.1\r\n")  # a request that never completes (slowloris)
        started = time.monotonic()
        assert sock.recv(65536) == b""  # the server hung up
        assert time.monotonic() - started < 5
