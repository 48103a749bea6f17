"""A second business process from data: refund requests on a SQL and an HTTP channel, none of it in the core.

configs/processes/refund.yaml declares the vocabulary and the expert; agentflow_refund holds the SQL
channel (an entry point) and the refund service with its OpenAPI spec, which the core's generic HTTP
channel drives from data (configs/refund/envs/refund_api_v1.yaml). These tests build
the envs through the registry, run gymnasium's check_env and the mapping audit, drive the expert over a
grid of scenarios on both channels, probe the service's hardening with malformed and foreign requests,
and onboard the running service from its spec with ``envs from-openapi`` + ``envs check``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from agentflow_core.adapters.audit import audit_entry, errors_only
from agentflow_core.errors import MappingError, RegistryError
from agentflow_core.registry import EnvRegistry
from agentflow_refund.case import SCENARIO as REFUND_SCENARIO
from agentflow_refund.service import MAX_BODY_BYTES, RefundService
from flows.cli.envs import envs_app
from tasks.config_io import parse_config
from tasks.process_io import load_process
from tasks.registry_io import load_registry, yaml_load

REPO = Path(__file__).resolve().parents[1]
REFUND_ENVS = REPO / "configs" / "refund" / "envs"
SPEC = REPO / "agentflow_refund" / "openapi.yaml"
GRID = list(
    itertools.product(
        ("normal", "packet_loss_5%"), ("ok", "flagged"), ("signed_out", "request_draft", "under_review"), (90.0, 130.0)
    )
)


@pytest.fixture(scope="module")
def cfg():  # type: ignore[no-untyped-def]
    return parse_config({"process": "refund", "base": {"env_config_dir": str(REFUND_ENVS)}})


@pytest.fixture(scope="module")
def service() -> Iterator[RefundService]:
    running = RefundService(episode_ttl_s=2.0).start()
    yield running
    running.stop()


def test_the_refund_process_is_its_own_vocabulary(cfg) -> None:  # type: ignore[no-untyped-def]
    process = load_process(cfg)
    vocab = process.vocabulary
    assert (vocab.n_tokens, vocab.n_actions, vocab.n_features) == (13, 9, 5)
    assert vocab.goal == "REFUND_ISSUED" and vocab.action_risk[vocab.action_id("WITHDRAW")] == 0.5
    assert vocab.accepted_outcomes({"account": "flagged"}) == {"REFUND_ISSUED", "ESCALATED"}
    # refund's own scenario fields, the ones the refund system itself declares
    assert vocab.scenario == REFUND_SCENARIO
    assert vocab.scenario.with_role("dimension") == ("network", "account", "entry_stage")
    assert process.base_envs == ("refund_db_v1", "refund_api_v1")
    entries = load_registry(cfg).entries()
    assert [(e.env_id, e.process) for e in entries] == [("refund_api_v1", "refund"), ("refund_db_v1", "refund")]
    assert all(e.vocabulary == vocab for e in entries)


@pytest.mark.parametrize("env_id", ["refund_db_v1", "refund_api_v1"])
def test_each_channel_passes_check_env_the_audit_and_the_expert_finishes(cfg, env_id: str) -> None:  # type: ignore[no-untyped-def]
    process = load_process(cfg)
    entry = load_registry(cfg).get(env_id)
    env = entry.make({}, env_id)
    assert env.observation_space.shape == (18,) and env.action_space.n == 9
    check_env(env, skip_render_check=True)
    assert errors_only(audit_entry(entry)) == []
    expert, outcomes, lengths = process.expert(entry.family), [], []
    for network, account, stage, value in GRID:
        env = entry.make({"network": network, "account": account, "entry_stage": stage, "order_value": value}, env_id)
        obs, info = env.reset(seed=7)
        step = 0
        terminated = truncated = False
        while not (terminated or truncated):
            step += 1
            obs, _, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
        outcomes.append(process.vocabulary.process_success({"account": account}, info["tokens"], terminated))
        lengths.append(step)
        if account == "flagged":
            assert "ESCALATED" in info["tokens"]
        env.close()
    assert np.mean(outcomes) == 1.0
    assert min(lengths) >= 1 and max(lengths) < 30


def test_both_channels_tell_the_same_story(cfg) -> None:  # type: ignore[no-untyped-def]
    """The same seed and actions give the same token sequence on SQL and HTTP (one case rule book)."""
    registry, process = load_registry(cfg), load_process(cfg)
    params = {
        "network": "packet_loss_5%",
        "entry_stage": "signed_out",
        "order_value": 130.0,
        "review_pending_rate": 0.6,
    }
    paths = []
    for env_id in ("refund_db_v1", "refund_api_v1"):
        env = registry.get(env_id).make(params, env_id)
        obs, info = env.reset(seed=3)
        path = [info["tokens"]]
        for _ in range(20):
            obs, _, terminated, truncated, info = env.step(process.expert().act(obs, info["action_mask"]))
            path.append(info["tokens"])
            if terminated or truncated:
                break
        paths.append(path)
        env.close()
    assert paths[0] == paths[1]
    assert any("SERVICE_TIMEOUT" in t or "EVIDENCE_REQUIRED" in t for t in paths[0])


def test_a_refund_mapping_is_refused_by_the_checkout_vocabulary(tmp_path: Path) -> None:
    for name in ("refund_db_v1.yaml", "refund_db_v1.json"):
        (tmp_path / name).write_text((REFUND_ENVS / name).read_text())
    config = yaml_load((tmp_path / "refund_db_v1.yaml").read_text())
    assert isinstance(config, dict)
    config.pop("process")
    (tmp_path / "refund_db_v1.yaml").write_text(json.dumps(config))
    with pytest.raises(RegistryError, match="process: missing"):  # never silently checkout
        EnvRegistry(tmp_path, yaml_load)
    config["process"] = "checkout"
    config.pop("params")
    config.pop("spec")  # the channel document names refund's scenario fields: refused for checkout's too
    (tmp_path / "refund_db_v1.yaml").write_text(json.dumps(config))
    with pytest.raises(MappingError, match=r"refund_db_v1.json: at \$.actions: .SIGN_IN. is not one of \[.LOGIN"):
        EnvRegistry(tmp_path, yaml_load)
    config["process"] = "nosuch"
    (tmp_path / "refund_db_v1.yaml").write_text(json.dumps(config))
    with pytest.raises(RegistryError, match="process: got 'nosuch'"):
        EnvRegistry(tmp_path, yaml_load)


def test_the_service_refuses_malformed_foreign_and_expired_requests(service: RefundService) -> None:
    with httpx.Client(base_url=service.url, timeout=5) as http:
        opened = http.post("/episodes", json={"scenario": {"entry_stage": "signed_out"}, "seed": 1})
        assert opened.status_code == 201
        body = opened.json()
        mine = {"X-Episode-Id": body["episode_id"], "X-Client-Token": body["client_token"]}
        assert len(body["episode_id"]) == len(body["client_token"]) == 32
        assert http.post("/session", headers=mine).json()["session"]["status"] == "active"
        other = http.post("/episodes", json={}).json()
        foreign = {"X-Episode-Id": body["episode_id"], "X-Client-Token": other["client_token"]}
        assert http.post("/session", headers=foreign).status_code == 403
        assert http.post("/session").status_code == 400
        assert http.post("/episodes", content=b"{not json").status_code == 400
        assert http.post("/episodes", content=b"[1, 2]").status_code == 400
        assert http.post("/episodes", json={"seed": -1}).status_code == 400
        assert http.post("/episodes", json={"scenario": {"account": "gold"}}).status_code == 422
        assert http.post("/episodes", json={"scenario": {}, "admin": True}).status_code == 400
        assert http.post("/episodes", content=b"x" * (MAX_BODY_BYTES + 1)).status_code == 413
        assert http.get("/admin").status_code == 404
        assert http.post("/refunds", headers=mine, json={"amount": 1e9}).status_code == 400
        service.state.episode_ttl_s = 0.0  # every open case is now past its expiry
        assert http.get("/orders/latest", headers=mine).status_code == 410
        service.state.episode_ttl_s = 2.0


def test_from_openapi_onboards_the_running_service_and_check_passes(service: RefundService, tmp_path: Path) -> None:
    out_dir = tmp_path / "onboarded"
    runner = CliRunner()
    args = ["from-openapi", str(SPEC), "--family", "refund_api", "--process", "refund"]
    created = runner.invoke(
        envs_app, [*args, "--base-url", service.url, "--out-dir", str(out_dir)], env={"COLUMNS": "200"}
    )
    assert created.exit_code == 0, created.output
    entry = load_registry(config_dir=out_dir).get("refund_api_v1")
    assert (entry.class_path, entry.process, entry.kwargs["base_url"]) == (
        "agentflow_core.envs.http_channel:HttpChannelEnv",
        "refund",
        service.url,
    )
    shipped = load_registry(config_dir=REFUND_ENVS).get("refund_api_v1")  # the spec's channel is the shipped one
    assert entry.kwargs["spec"] == {k: v for k, v in shipped.kwargs["spec"].items() if k != "service"}
    assert set(entry.mapping["actions"]) == set(entry.vocabulary.actions)
    emitted = {t for rule in entry.mapping["token_rules"] for t in rule["emit"]}
    assert emitted == set(entry.vocabulary.tokens)
    before = len(service.state)
    checked = runner.invoke(envs_app, ["check", "--config-dir", str(out_dir)], env={"COLUMNS": "200"})
    assert checked.exit_code == 0, checked.output
    assert "1 env(s) ok" in checked.output and len(service.state) > before  # check_env ran against this service
    bad = runner.invoke(envs_app, [*args, "--env-class", "os_system", "--out-dir", str(tmp_path / "x")])
    assert bad.exit_code != 0 and not (tmp_path / "x").exists()
