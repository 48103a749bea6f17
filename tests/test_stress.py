"""Stress rollouts through the real pool: stratified sampling, crash counting, risk penalty, real envs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentflow_core.config import AgentFlowConfig, PoolConfig
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.report import REPORT_KEYS
from agentflow_core.evaluation.stress import RiskRule, run_stress_episodes, stratified_sample
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import CHECKOUT, SemanticAction, decode_tokens
from agentflow_core.variants import BaseEnvInfo, generate_variants
from tasks.context import PhaseContext
from tests.pool_fixtures import Fault, TinyFactory, tiny_variants
from tests.tiny import local_config

A = SemanticAction


def tiny_policy(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """LOGIN when logged out, else pay: the tiny shop's shortest success (2 steps)."""
    return np.array([int(A.LOGIN) if "LOGGED_OUT" in decode_tokens(o) else int(A.SUBMIT_PAYMENT) for o in obs])


def small_cfg(tmp_path: Path, **stress: object) -> AgentFlowConfig:
    return local_config(
        tmp_path,
        variants={"samples_per_combination": 1},
        stress={"variants": 24, "num_envs": 8, "consistency_variants": 12, **stress},
    )


def test_stratified_sample_covers_every_family_and_dimension_value() -> None:
    bases = [
        BaseEnvInfo("web_checkout_v2", "web_checkout", 2),
        BaseEnvInfo("order_db_v1", "order_db", 1),
        BaseEnvInfo("payment_api_v1", "payment_api", 1),
    ]
    cfg = AgentFlowConfig().variants
    catalogue = generate_variants(bases, cfg.dimensions, cfg.perturbations, 2, seed=0, scenario=CHECKOUT.scenario)
    dims = list(cfg.dimensions)
    sample = stratified_sample(catalogue, 12, dims, np.random.default_rng(0))
    assert len(sample) == 12 and len({v.env_id for v in sample}) == 12
    assert {v.family for v in sample} == {"web_checkout", "order_db", "payment_api"}
    for dim, values in cfg.dimensions.items():
        assert {v.params[dim] for v in sample} == set(values), dim
    again = stratified_sample(catalogue, 12, dims, np.random.default_rng(0))
    assert [v.env_id for v in again] == [v.env_id for v in sample]


def test_crash_counter_matches_injected_crashes() -> None:
    variants = tiny_variants(6)
    faulty = {variants[1].env_id, variants[4].env_id}
    factory = TinyFactory(faults={env_id: Fault("crash", at_step=1) for env_id in faulty})
    pool = InProcessPool(variants, factory, 4, PoolConfig(num_workers=1, scheduler="round_robin", quarantine_after=3))
    try:
        rollout = run_stress_episodes(pool, tiny_policy, variants, 40, seed=3)
        counters = dict(pool.counters)
    finally:
        pool.close()
    crashed = [e for e in rollout.episodes if e.crashed]
    # Every episode of a faulty variant crashes at its first step, until the variant is quarantined after 3.
    assert rollout.crash_episodes == len(crashed) == 6 == counters["env_crash"]
    assert {e.env_id for e in crashed} == faulty
    assert all(e.failure_reason == "env_crash" and not e.success for e in crashed)
    healthy = [e for e in rollout.episodes if not e.crashed]
    assert len(healthy) == 34 and all(e.success and e.reached_goal for e in healthy)


def test_risk_penalty_lowers_the_evaluated_return() -> None:
    variants = tiny_variants(2)
    pool = InProcessPool(variants, TinyFactory(), 2, PoolConfig(num_workers=1, scheduler="round_robin"))
    try:
        # SUBMIT_PAYMENT declares risk 0.1 (semantics.ACTION_RISK): above a 0.05 threshold it is risky.
        rollout = run_stress_episodes(pool, tiny_policy, variants, 6, risk=RiskRule(threshold=0.05, penalty=2.0))
    finally:
        pool.close()
    for e in rollout.episodes:
        assert e.risky_steps == 1
        assert e.env_return == pytest.approx(10.0 - 0.01)
        assert e.evaluated_return == pytest.approx(e.env_return - 2.0)
    assert all(s.risk == pytest.approx(0.1) for s in rollout.steps if s.action == A.SUBMIT_PAYMENT)


def test_real_envs_with_the_scripted_expert(repo_root: Path, tmp_path: Path) -> None:
    from tasks.rollout import EXPERT
    from tasks.steps.stress import run_stress

    cfg = small_cfg(tmp_path)
    summary = run_stress(PhaseContext.of(cfg), EXPERT, episodes=60)
    m = summary["metrics"]
    assert m["episodes"] == 60 and m["crash_episodes"] == 0
    assert m["success_rate"] > 0.8
    assert m["consistency_variants"] == 12 and 0.0 <= m["consistency"] <= 1.0
    assert m["consistency"] == 1.0  # the expert's rules read tokens only
    assert m["consistency_random"] < 0.3  # a random policy on the same probe states: the floor, for scale
    assert summary["consistency"]["random_policy_score"] == m["consistency_random"]
    # one business state, one observation: on paired states every channel gets the same action
    assert m["cross_channel_consistency"] == 1.0 and m["cross_channel_consistency_random"] < 0.9
    assert m["cross_channel_paired_states"] > 10
    assert m["robustness_score"] == pytest.approx(m["success_rate"] * m["consistency"] * (1 - m["crash_rate"]))
    assert {r["env_id"] for r in summary["consistency"]["per_variant"]} <= set(
        summary["consistency"]["canonical"]["variants"]
    )
    out = tmp_path / "data" / "stress"
    for name in ("summary.json", "steps.parquet", "episodes.parquet", "coverage_heatmap.png", "consistency_matrix.png"):
        assert (out / name).is_file(), name
    metrics = json.loads((tmp_path / "data" / "metrics" / "stress.json").read_text())
    assert {"robustness_score", "consistency", "consistency_random", "success_rate", "crash_episodes"} <= set(metrics)
    assert metrics["cross_channel_consistency"] == 1.0
    assert metrics["robustness_score"] == m["robustness_score"]
    # process success counts the expert's escalation of blocked users; payment success cannot
    blocked = summary["process_success"]["by_dimension"]["user_tier"]["blocked"]
    assert blocked["n"] > 0 and blocked["rate"] > 0.8 and blocked["ci95"][0] <= blocked["rate"] <= blocked["ci95"][1]
    assert summary["goal_success"]["by_dimension"]["user_tier"]["blocked"]["rate"] == 0.0
    assert metrics["process_success/user_tier/blocked"] == blocked["rate"]
    assert set(summary["process_success"]["by_family"]) == {"web_checkout", "order_db", "payment_api"}
    assert summary["sample"]["split"] == "test"


def test_report_files_are_written_with_documented_keys(repo_root: Path, tmp_path: Path) -> None:
    from tasks.rollout import EXPERT
    from tasks.steps.report import run_report
    from tasks.steps.stress import run_stress

    cfg = small_cfg(tmp_path, episodes=40)
    with pytest.raises(AgentFlowError, match="run `agentflow stress`"):
        run_report(PhaseContext.of(cfg), EXPERT)
    run_stress(PhaseContext.of(cfg), EXPERT)
    summary = run_report(PhaseContext.of(cfg), EXPERT)
    out = Path(summary["report_dir"])
    assert sorted(summary["files"]) == [
        "consistency_matrix.png",
        "coverage_heatmap.png",
        "report.html",
        "report.json",
        "report.md",
    ]
    report = json.loads((out / "report.json").read_text())
    assert set(report) == set(REPORT_KEYS)
    assert report["metrics"]["episodes"] == 40 and report["checkpoint"] == EXPERT
    assert (out / "coverage_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in (out / "report.html").read_text()
    assert "](coverage_heatmap.png)" in (out / "report.md").read_text()
    assert summary["tree"].startswith("📊 Evaluation Report for expert-")
    assert (tmp_path / "data" / "stress" / "summary.json").is_file()  # the stress phase ran first
