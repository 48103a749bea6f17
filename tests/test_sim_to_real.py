"""Sim-to-real validation: gap arithmetic by hand, the gate as data, and one real run on all three channels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from tiny import tiny_params, tiny_refund_params

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.report import sim_to_real_rows
from agentflow_core.evaluation.sim_to_real import EpisodeTrace, PairedEpisode, select_pairs, summarize
from agentflow_core.gates import evaluate_gate, stress_gate
from agentflow_core.variants import VariantSpec
from tasks.config_io import parse_config
from tasks.context import PhaseContext
from tasks.real_channels import REAL_CHANNELS, payment_api_process, server_process
from tasks.steps.stress import run_stress


def _trace(success: bool, actions: tuple[int, ...] = (1,), ms: float = 1.0) -> EpisodeTrace:
    return EpisodeTrace(actions, (("X",),) * len(actions), True, success, success, (ms / 1000,) * len(actions))


def test_gap_is_sim_minus_real_per_family() -> None:
    episodes = [
        PairedEpisode("web_checkout", "w1", 1, _trace(True), _trace(True)),
        PairedEpisode("web_checkout", "w2", 2, _trace(True), _trace(False, (2,), ms=30.0)),
        PairedEpisode("web_checkout", "w3", 3, _trace(True), _trace(True)),
        PairedEpisode("web_checkout", "w4", 4, _trace(False), _trace(False)),
        PairedEpisode("order_db", "o1", 5, _trace(False), _trace(True)),
    ]
    report = summarize(episodes, REAL_CHANNELS)
    web = next(f for f in report.families if f.family == "web_checkout")
    assert (web.sim_success, web.real_success, web.gap) == (0.75, 0.5, 0.25)
    assert web.identical_fraction == 0.75  # w2 took another action
    assert web.real_step_ms_p50 == 1.0 and web.real_step_ms_p95 == pytest.approx(25.65)  # numpy's linear rule
    db = next(f for f in report.families if f.family == "order_db")
    assert db.gap == -1.0  # the real channel did better: a negative gap never fails the gate
    assert report.max_gap == 0.25
    assert report.metrics() == {
        "sim_to_real_max_gap": 0.25,
        "sim_to_real_gap_order_db": -1.0,
        "sim_to_real_gap_web_checkout": 0.25,
    }


def test_gate_on_the_gap_is_configured_data() -> None:
    cfg = AgentFlowConfig.model_validate({"stress": {"sim_to_real": {"enabled": True, "max_gap": 0.02}}})
    gate = stress_gate(cfg)
    assert gate.checks[-1].describe() == "sim_to_real_max_gap <= 0.02"
    good = {"robustness_score": 0.9, "consistency": 0.9, "crash_rate": 0.0, "sim_to_real_max_gap": 0.0}
    assert evaluate_gate(gate, good).passed
    verdict = evaluate_gate(gate, {**good, "sim_to_real_max_gap": 0.0625})
    assert not verdict.passed and "sim_to_real_max_gap=0.0625 (required <= 0.02)" in verdict.message
    assert "sim_to_real_max_gap" not in stress_gate(AgentFlowConfig()).describe()  # off by default in the model


def test_select_pairs_cycles_a_short_family_and_seeds_deterministically() -> None:
    sample = [
        VariantSpec(f"{f}_{i}", f"{f}_v1", f, {}, f"{f}{i}") for f in ("order_db", "web_checkout") for i in range(2)
    ]
    chosen, seeds = select_pairs(sample, ["order_db"], 3, seed=0)
    assert [v.env_id for v in chosen] == ["order_db_0", "order_db_1", "order_db_0"]
    assert seeds == select_pairs(sample, ["order_db"], 3, seed=0)[1] and len(set(seeds)) == 3


def test_stress_phase_runs_the_real_channels_and_gates_the_gap(browser_session: None, tmp_path: Path) -> None:
    """``run_stress`` with sim-to-real on: the expert on a browser, PostgreSQL and a server process, equal paths."""
    params = tiny_params(tmp_path)
    params["stress"]["sim_to_real"] = {"enabled": True, "episodes_per_family": 1, "max_gap": 0.02}
    cfg = parse_config(params)
    summary = run_stress(PhaseContext.of(cfg), "expert")
    report = summary["sim_to_real"]
    assert [f["family"] for f in report["families"]] == ["order_db", "payment_api", "web_checkout"]
    for family in report["families"]:
        assert family["episodes"] == 1 and family["identical_fraction"] == 1.0 and family["gap"] == 0.0
        assert family["real_channel"] == REAL_CHANNELS[family["family"]] and family["real_step_ms_p50"] > 0
    web = report["families"][2]
    assert web["real_step_ms_p50"] > web["sim_step_ms_p50"]  # a browser step is a real click and round trip
    written = json.loads((tmp_path / "data" / "metrics" / "stress.json").read_text())
    assert written["sim_to_real_max_gap"] == 0.0 and written["sim_to_real_gap_web_checkout"] == 0.0
    assert "sim_to_real" not in summary["gate"]  # a failed check names its metric: the gap check held
    assert "sim_to_real_max_gap <= 0.02" in stress_gate(cfg).describe()
    rows = sim_to_real_rows(summary)
    assert [r[:7] for r in rows][2] == [
        "web_checkout",
        REAL_CHANNELS["web_checkout"],
        1,
        "100.0%",
        "100.0%",
        "+0.0 pts",
        "100.0%",
    ]
    assert sim_to_real_rows({}) == []


def test_a_data_process_pairs_the_real_channels_its_file_names(tmp_path: Path) -> None:
    """Refund's process file names its real channels: the SQL channel on PostgreSQL (pgserver) and the refund
    service started in its own process; the stress phase reports real success, the gap and each dimension value."""
    params = tiny_refund_params(tmp_path)
    params["stress"]["sim_to_real"] = {"enabled": True, "episodes_per_family": 4, "max_gap": 0.02}
    cfg = parse_config(params)
    summary = run_stress(PhaseContext.of(cfg), "expert")
    report = summary["sim_to_real"]
    assert [f["family"] for f in report["families"]] == ["refund_api", "refund_db"]
    names = {f["family"]: f["real_channel"] for f in report["families"]}
    assert names == {
        "refund_api": "the refund service in its own process",
        "refund_db": "the case store on PostgreSQL (pgserver)",
    }
    for family in report["families"]:  # the same rules, the same draws: the real system takes the same paths
        assert family["episodes"] == 4 and family["identical_fraction"] == 1.0 and family["gap"] == 0.0
    dimensions = {(r["dimension"], r["value"]) for r in report["per_dimension"]}
    assert ("account", "flagged") in dimensions or ("account", "ok") in dimensions
    written = json.loads((tmp_path / "data" / "metrics" / "stress.json").read_text())
    assert written["sim_to_real_max_gap"] == 0.0 and 0.0 <= written["real_process_success_refund_db"] <= 1.0
    assert all(written[f"sim_to_real_gap/{d}/{v}"] == 0.0 for d, v in dimensions)
    assert [r[0] for r in sim_to_real_rows(summary)] == ["refund_api", "refund_db"]


def test_a_service_process_starts_only_an_installed_service() -> None:
    """``python -m tasks.service_process NAME`` looks NAME up among the agentflow.services entry points."""
    refused = pytest.raises(AgentFlowError, match="nosuch process exited before announcing its URL")
    with refused, server_process(["tasks.service_process", "nosuch"], "nosuch"):
        pass


def test_payment_api_process_serves_until_its_parent_closes_the_pipe() -> None:
    """The real HTTP channel's server runs in its own process; leaving the context stops it (stdin EOF)."""
    with payment_api_process() as url:
        token = httpx.post(f"{url}/clients", json={}, timeout=10).json()["client_token"]
        headers = {"X-Client-Token": token}
        answered = httpx.post(f"{url}/episodes", json={"scenario": {}, "seed": 1}, headers=headers, timeout=10)
        assert answered.status_code in (200, 201) and answered.json()
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/episodes", json={"scenario": {}, "seed": 1}, timeout=2)


def _variant(i: int, **params: object) -> VariantSpec:
    base = {"network": "normal", "inventory": 20, "start_stage": "login"}
    return VariantSpec(f"v{i}", "web_checkout_v2", "web_checkout", {**base, **params}, f"h{i}")


def test_stratify_covers_every_value_of_every_dimension_first() -> None:
    from agentflow_core.evaluation.sim_to_real import stratify

    sample = [_variant(0), _variant(1, inventory=7), _variant(2, network="latency_500ms"), _variant(3, inventory=0)]
    chosen = stratify(sample, ["network", "inventory"], 3)
    values = {(v.params["network"], v.params["inventory"]) for v in chosen}
    assert ("latency_500ms", 20) in values and ("normal", 0) in values and len(chosen) == 3
    assert len(stratify(sample, ["inventory"], 2)) == 2  # inventory's strata: 0 and > 0 (7 and 20 are one)
    assert len(stratify(sample, ["network"], 10)) == 4  # never more than the sample, never a repeat


def test_per_dimension_gap_and_root_causes_by_hand() -> None:
    from agentflow_core.evaluation.report import oscar_rows
    from agentflow_core.evaluation.sim_to_real import per_dimension

    stuck = EpisodeTrace((9, 9), (("NETWORK_TIMEOUT",), ("NETWORK_TIMEOUT",)), False, False, False, (0.1, 0.1))
    episodes = [
        PairedEpisode("web_checkout", "v0", 1, _trace(True), _trace(True)),
        PairedEpisode("web_checkout", "v2", 2, _trace(True), stuck),
    ]
    params = {"v0": _variant(0).params, "v2": _variant(2, network="latency_500ms").params}
    rows = per_dimension(episodes, params, ["network"])
    slow = next(r for r in rows if r["value"] == "latency_500ms")
    assert (slow["sim_process_success"], slow["real_process_success"], slow["gap"]) == (1.0, 0.0, 1.0)
    assert slow["root_causes"] == ["stuck at NETWORK_TIMEOUT"]
    table = oscar_rows({"sim_to_real_oscar": {"per_dimension": rows}})
    assert [r[:2] for r in table] == [["network", "latency_500ms"], ["network", "normal"]]


def test_the_oscar_gap_is_gated_when_the_oscar_run_is_on() -> None:
    on = {"enabled": True, "max_gap": 0.02, "oscar_episodes": 2}
    cfg = AgentFlowConfig.model_validate({"stress": {"sim_to_real": on}})
    names = [c.metric for c in stress_gate(cfg).checks]
    assert "sim_to_real_gap_oscar" in names
    off = AgentFlowConfig.model_validate({"stress": {"sim_to_real": {"enabled": True}}})
    assert "sim_to_real_gap_oscar" not in [c.metric for c in stress_gate(off).checks]


def _oscar_run(success: float, gap: float) -> dict[str, Any]:
    row = {"dimension": "network", "value": "normal", "episodes": 2, "root_causes": []}
    row |= {"sim_process_success": 1.0, "real_process_success": success, "gap": gap}
    run = {"episodes": 2, "sim_process_success": 1.0, "real_process_success": success, "gap": gap}
    return run | {"real_step_ms_p50": 120.0, "per_dimension": [row]}


def test_the_report_shows_the_oscar_fine_tune_before_and_after_for_its_own_policy(tmp_path: Path) -> None:
    from agentflow_core.evaluation.report import _oscar_nodes, tree_text
    from agentflow_core.evaluation.report_oscar import finetune_rows
    from tasks.steps.report import with_oscar_finetune

    finetune = {"champion": {"checkpoint": "ckpt/a"}, "total_steps": 64}
    finetune |= {"before": _oscar_run(0.5, 0.5), "after": _oscar_run(1.0, 0.0)}
    (tmp_path / "summary.json").write_text(json.dumps(finetune))
    summary = {"sim_to_real_oscar": _oscar_run(0.5, 0.5)}
    assert with_oscar_finetune(summary, tmp_path / "summary.json", "ckpt/b") is summary  # another policy's
    report = with_oscar_finetune(summary, tmp_path / "summary.json", "ckpt/a")
    assert finetune_rows(report) == [
        ["all", "", 2, "100.0%", "50.0%", "100.0%", "+50.0 pts", "+0.0 pts"],
        ["network", "normal", 2, "100.0%", "50.0%", "100.0%", "+50.0 pts", "+0.0 pts"],
    ]
    assert finetune_rows(summary) == []
    lines = [line for node in _oscar_nodes(report["sim_to_real_oscar"]) for line in tree_text(node)]
    assert any("fine-tuned on Oscar (64 steps): success 50.0% -> 100.0%, gap +50.0 pts -> +0.0 pts" in x for x in lines)


def test_a_real_channel_can_run_the_simulators_variants_on_another_env(tmp_path: Path) -> None:
    """``real_channels.<sim>.env``: the state-machine simulator's variants played on the SQL channel instead."""
    from agentflow_core.evaluation.sim_to_real import paired_episodes
    from tasks.process_scaffold import write_scaffold
    from tasks.real_channels import open_real_channels

    write_scaffold("demo", tmp_path)
    text = (tmp_path / "configs/processes/demo.yaml").read_text()
    beside = tmp_path / "configs/demo/processes/demo.yaml"  # found beside the env configs, without a chdir
    beside.parent.mkdir()
    beside.write_text(text.replace("real_channels:", "real_channels:\n  demo_sim: {description: db, env: demo_db_v1}"))
    cfg = parse_config({"process": "demo", "base": {"env_config_dir": str(tmp_path / "configs/demo/envs")}})
    ctx = PhaseContext.of(cfg)
    expert = ctx.process.expert("demo_sim")
    variants = [
        VariantSpec(f"demo_sim_v1_{i}", "demo_sim_v1", "demo_sim", p, f"h{i}")
        for i, p in enumerate([{}, {"plan": "annual"}, {"account": "disputed"}])
    ]
    with open_real_channels(ctx, ["demo_sim"], {"demo_sim": "demo_sim_v1"}) as channels:
        assert channels.real["demo_sim"].env_id == "demo_db_v1"  # the SQL channel's entry
        episodes = paired_episodes(
            variants,
            [0, 1, 2],
            channels.make_sim,
            channels.make_real,
            lambda obs, mask: np.array([expert.act(obs[0], mask[0])]),
            lambda: 0.0,
            channels,
        )
    assert all(e.identical and e.sim.success for e in episodes)  # one process, two channels, the same paths


class _ExitingChannel:
    """A channel whose process is still exiting when the episode fails: it says "alive" twice more."""

    def __init__(self) -> None:
        self.asked, self.restarts = 0, 0

    def alive(self, family: str) -> bool:
        self.asked += 1
        return self.restarts > 0 or self.asked <= 2

    def restart(self, family: str) -> None:
        self.restarts += 1


def test_a_channel_still_exiting_when_its_episode_raised_is_found_dead() -> None:
    """A killed process closes its sockets before it is gone: the episode's error is a channel death, not a raise."""
    from agentflow_core.evaluation.sim_to_real import paired_episodes
    from tasks.registry_io import load_registry

    def broken(variant: VariantSpec) -> Any:
        raise ConnectionError("server closed the connection unexpectedly")

    entry = load_registry().get("web_checkout_v2")
    channel = _ExitingChannel()
    first_allowed = lambda obs, mask: np.argmax(mask, axis=1)  # noqa: E731
    episodes = paired_episodes(
        [_variant(0)], [0], lambda v: entry.make(v.params, v.env_id), broken, first_allowed, lambda: 0.0, channel
    )
    assert channel.restarts == 1 and channel.asked >= 3
    assert "real channel process died (ConnectionError" in str(episodes[0].real.failure_reason)
