"""Sim-to-real validation: gap arithmetic by hand, the gate as data, and one real run on all three channels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from agentflow_core.config import AgentFlowConfig
from agentflow_core.evaluation.report import sim_to_real_rows
from agentflow_core.evaluation.sim_to_real import EpisodeTrace, PairedEpisode, select_pairs, summarize
from agentflow_core.evaluation.stress import stratified_sample
from agentflow_core.gates import evaluate_gate, stress_gate
from tasks.config_io import load_config
from tasks.real_channels import REAL_CHANNELS, run_sim_to_real
from tasks.rollout import load_policy, load_variants

REPO = Path(__file__).resolve().parents[1]


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
    cfg = load_config(REPO / "params.yaml")
    sample = load_variants(cfg)[:40]
    chosen, seeds = select_pairs(sample, ["order_db"], 3, seed=0)
    assert [v.family for v in chosen] == ["order_db"] * 3
    assert seeds == select_pairs(sample, ["order_db"], 3, seed=0)[1] and len(set(seeds)) == 3


def test_real_channels_run_the_same_episodes_and_the_report_shows_the_gap(browser_session: None) -> None:
    """The expert on all three real channels (a browser, PostgreSQL, a server process): every path equal."""
    cfg = load_config(REPO / "params.yaml")
    cfg = cfg.model_copy(
        update={"stress": cfg.stress.model_copy(update={"sim_to_real": cfg.stress.sim_to_real.model_copy(update={"episodes_per_family": 2})})}
    )
    variants = load_variants(cfg)
    sample = stratified_sample(variants, 60, sorted(cfg.variants.dimensions), np.random.default_rng(0))
    report = run_sim_to_real(cfg, load_policy("expert"), list(sample))
    assert [f.family for f in report.families] == ["order_db", "payment_api", "web_checkout"]
    for family in report.families:
        assert family.episodes == 2 and family.identical_fraction == 1.0 and family.gap == 0.0
        assert family.real_step_ms_p50 > 0
    web = next(f for f in report.families if f.family == "web_checkout")
    assert web.real_step_ms_p50 > web.sim_step_ms_p50  # a browser step is a real click and round trip
    rows = sim_to_real_rows({"sim_to_real": report.to_dict()})
    assert [r[:7] for r in rows][2] == [
        "web_checkout",
        REAL_CHANNELS["web_checkout"],
        2,
        "100.0%",
        "100.0%",
        "+0.0 pts",
        "100.0%",
    ]
    assert sim_to_real_rows({}) == []
