"""The generic HTTP channel (agentflow_core/envs/http_channel.py) against the refund service.

``tests/data/refund_api_golden.json`` holds ten refund episodes (five scenarios, the expert and random
legal actions) recorded from the hand-written refund HTTP env this channel replaced; the channel, fed
only the data of configs/refund/envs/refund_api_v1.yaml, must reproduce every token, observation,
reward and failure reason. A stalling proxy in front of the service shows the client's timeout, the
RETRY action and the client's own retries, and the circuit breaker opening; documents carrying code,
and mapping actions the service's spec does not declare, are refused when the registry loads them.
"""

from __future__ import annotations

import http.client
import json
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from agentflow_core.envs.http_channel import HttpChannelEnv
from agentflow_core.errors import RegistryError
from agentflow_core.registry import EnvEntry, EnvRegistry
from agentflow_refund.service import RefundService, openapi_spec
from tasks.config_io import parse_config
from tasks.process_io import known_vocabularies, load_process
from tasks.registry_io import load_registry, yaml_load

REPO = Path(__file__).resolve().parents[1]
REFUND_ENVS = REPO / "configs" / "refund" / "envs"
GOLDEN = REPO / "tests" / "data" / "refund_api_golden.json"
SIGN_IN = {"type": "http", "method": "POST", "path": "/session"}
FIND_ORDER = {"type": "http", "method": "GET", "path": "/orders/latest"}
RETRY = {"type": "retry"}


@pytest.fixture(scope="module")
def entry() -> EnvEntry:
    return load_registry(config_dir=REFUND_ENVS).get("refund_api_v1")


@pytest.fixture(scope="module")
def service() -> Iterator[RefundService]:
    running = RefundService().start()
    yield running
    running.stop()


class StallingProxy:
    """Forwards to the service; while ``stall`` > 0 it swallows a request (never forwarded) past the client timeout."""

    def __init__(self, target: str, delay_s: float = 1.0) -> None:
        self.target, self.delay_s = target.removeprefix("http://"), delay_s
        self.stall, self.received, self.forwarded = 0, 0, 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
                return None

            def _any(self) -> None:
                proxy.received += 1
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if proxy.stall > 0:
                    proxy.stall -= 1
                    time.sleep(proxy.delay_s)  # the client has given up by now; the request is dropped
                    self.close_connection = True
                    return
                proxy.forwarded += 1
                upstream = http.client.HTTPConnection(proxy.target, timeout=5)
                headers = {k: v for k, v in self.headers.items() if k.startswith("X-") or k == "Content-Type"}
                upstream.request(self.command, self.path, body or None, headers)
                reply = upstream.getresponse()
                data = reply.read()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream.close()

            do_GET = do_POST = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def proxy(service: RefundService) -> Iterator[StallingProxy]:
    running = StallingProxy(service.url)
    yield running
    running.stop()


def _channel(entry: EnvEntry, base_url: str, **client: Any) -> HttpChannelEnv:
    spec = {k: v for k, v in entry.kwargs["spec"].items() if k != "service"}
    spec.update(client={"timeout_s": 0.5, "max_retries": 0, **client})
    return HttpChannelEnv(entry.scenario({}), "refund_api_v1_test", spec, base_url=base_url)


def test_the_channel_replays_the_hand_written_envs_episodes(entry: EnvEntry) -> None:
    cfg = parse_config({"process": "refund", "base": {"env_config_dir": str(REFUND_ENVS)}})
    process = load_process(cfg)
    golden = json.loads(GOLDEN.read_text())
    assert len(golden) == 10 and entry.class_path == "agentflow_core.envs.http_channel:HttpChannelEnv"
    for episode in golden:
        env = entry.make(episode["params"])
        obs, info = env.reset(seed=episode["seed"])
        rng, expert = np.random.default_rng(episode["seed"]), process.expert(entry.family)
        steps = [{"tokens": sorted(info["tokens"]), "obs": [round(float(x), 6) for x in obs]}]
        for _ in range(len(episode["steps"]) - 1):
            mask = info["action_mask"]
            action = expert.act(obs, mask) if episode["policy"] == "expert" else int(rng.choice(np.flatnonzero(mask)))
            obs, reward, terminated, truncated, info = env.step(action)
            steps.append(
                {
                    "action": int(action),
                    "reward": round(float(reward), 6),
                    "terminated": bool(terminated),
                    "truncated": bool(truncated),
                    "failure_reason": info.get("failure_reason"),
                    "applied": info.get("applied"),
                    "tokens": sorted(info["tokens"]),
                    "obs": [round(float(x), 6) for x in obs],
                }
            )
        env.close()
        assert steps == episode["steps"], (episode["params"], episode["policy"])
    reasons = {s.get("failure_reason") for e in golden for s in e["steps"]}
    assert {"network_timeout", "evidence_required", "escalated"} <= reasons  # the record reaches the faults


def test_a_timed_out_request_is_retried_by_the_policy_and_by_the_client(entry: EnvEntry, proxy: StallingProxy) -> None:
    env = _channel(entry, proxy.url)
    raw, _ = env.reset(seed=1)
    assert raw["json"]["session"]["status"] == "none" and "client_token" not in raw["json"]
    proxy.stall = 1
    started = time.perf_counter()
    timed_out = env.step(SIGN_IN)
    assert time.perf_counter() - started < 0.9  # the client's timeout (0.5 s), not the proxy's 1 s stall
    assert timed_out.obs["status_code"] is None and timed_out.obs["client"]["outcome"] == "timeout"
    assert (timed_out.info["failure_reason"], timed_out.info["applied"]) == ("network_timeout", False)
    retried = env.step(RETRY)  # the policy's re-send of the POST that timed out
    assert retried.obs["json"]["session"]["status"] == "active" and retried.info["applied"]
    assert retried.obs["client"]["retries"] == 1 and retried.obs["endpoint"] == "/session"
    assert env.step(RETRY).info["failure_reason"] == "not_applicable"  # nothing failed: nothing to re-send
    env.close()

    auto = _channel(entry, proxy.url, max_retries=2, backoff_base_s=0.01)
    auto.reset(seed=2)
    auto.step(SIGN_IN)
    proxy.stall, before = 1, proxy.received
    found = auto.step(FIND_ORDER)  # an idempotent GET: the client re-sends it itself
    assert proxy.received - before == 2 and found.obs["client"]["retries"] == 1
    assert found.obs["json"]["order"]["found"] is True and found.info["applied"]
    auto.close()


def test_the_breaker_opens_after_consecutive_failures_and_stops_sending(entry: EnvEntry, proxy: StallingProxy) -> None:
    env = _channel(entry, proxy.url, failure_threshold=2, cooldown_s=60.0)
    env.reset(seed=3)
    proxy.stall = 10
    outcomes = [env.step(SIGN_IN).obs["client"] for _ in range(2)]
    assert [o["outcome"] for o in outcomes] == ["timeout", "timeout"] and outcomes[-1]["breaker"] == "open"
    received = proxy.received
    refused = env.step(RETRY)
    assert proxy.received == received  # nothing was sent
    assert refused.obs["client"]["outcome"] == "circuit_open"
    assert (refused.info["failure_reason"], refused.reward) == ("circuit_open", -0.05)
    env.close()


def _write_config(tmp_path: Path, edit: Any) -> Path:
    for name in ("refund_api_v1.yaml", "refund_api_v1.json"):
        shutil.copy(REFUND_ENVS / name, tmp_path / name)
    config = yaml.safe_load((tmp_path / "refund_api_v1.yaml").read_text())
    edit(config)
    (tmp_path / "refund_api_v1.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return tmp_path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["spec"]["reset"].update(body={"x": "${__import__('os').system('id')}"}), "placeholder"),
        (lambda c: c["spec"]["headers"].update({"X-A": "${scenario.__class__}"}), "placeholder"),
        (lambda c: c["spec"].update(service="os:system"), "never names code"),
        (lambda c: c["spec"].update(python="import os"), "unknown key"),
        (lambda c: c["spec"]["reply"].update(reward="lambda body: 1"), "json path"),
        (lambda c: c["spec"]["reset"].update(method="EVAL"), "reset.method"),
        (lambda c: c["spec"]["audit"]["states"].append({"token": "LOGGED_IN"}), "not one of the process's"),
    ],
)
def test_a_config_with_code_in_it_is_refused_at_load(tmp_path: Path, edit: Any, message: str) -> None:
    directory = _write_config(tmp_path, edit)
    with pytest.raises(RegistryError, match=message):
        EnvRegistry(directory, yaml_load, known_vocabularies(REFUND_ENVS))


def test_the_services_openapi_file_as_the_channel_checks_every_request_at_load(
    tmp_path: Path, service: RefundService
) -> None:
    """``spec:`` naming the service's OpenAPI document (with its x-agentflow-channel) beside the env config."""

    def edit(config: dict[str, Any]) -> None:
        config["spec"] = "channels/refund_openapi.json"
        config["kwargs"] = {"base_url": service.url}

    directory = _write_config(tmp_path, edit)
    document = json.loads(json.dumps(openapi_spec()))  # the spec the service serves, with its channel settings
    document["x-agentflow-channel"].pop("openapi_url")  # the operations come from this file
    document["x-agentflow-channel"]["reset"] = {"operation": "openCase", **document["x-agentflow-channel"]["reset"]}
    for key in ("method", "path"):
        document["x-agentflow-channel"]["reset"].pop(key)
    (directory / "channels").mkdir()
    (directory / "channels" / "refund_openapi.json").write_text(json.dumps(document))
    vocabularies = known_vocabularies(REFUND_ENVS)
    entry = EnvRegistry(directory, yaml_load, vocabularies).get("refund_api_v1")
    assert entry.kwargs["spec"]["info"]["title"] == "Refund service"  # the file, read by the registry as data
    env = entry.make({})
    env.reset(seed=0)
    signed_in = env.physical.step({"type": "http", "operation": "signIn"})
    assert signed_in.obs["json"]["session"]["status"] == "active"
    with pytest.raises(ValueError, match="not an operation of the service's spec"):
        env.physical.step({"type": "http", "method": "GET", "path": "/admin"})
    env.close()

    mapping = json.loads((directory / "refund_api_v1.json").read_text())
    mapping["actions"]["ESCALATE"] = {"type": "http", "method": "DELETE", "path": "/support"}
    (directory / "refund_api_v1.json").write_text(json.dumps(mapping))
    with pytest.raises(RegistryError, match="ESCALATE: DELETE /support is not an operation"):
        EnvRegistry(directory, yaml_load, vocabularies)  # a mapping action the service does not offer: refused at load
