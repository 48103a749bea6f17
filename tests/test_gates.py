"""The gates are declared data: validate prints them, the flow enforces exactly them, and quarantine quarantines.

Unit tests judge hand-made metrics. The flow tests run tiny cycles with real components (Prefect's
test harness, the embedded MLflow store, the in-process pool) with one threshold set out of reach
each; the `dvc repro` counterparts are in tests/test_gates_dvc.py.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from agentflow_core.config import AgentFlowConfig
from agentflow_core.gates import BudgetUse, GateCheck, declared_gates, evaluate_gate, gate_for
from tasks.config_io import load_config
from tests.tiny import REPO, write_tiny_params

# blocked users whose escalation calibration is told not to accept: the expert "fails" them, so calibration
# quarantines every sampled blocked variant, and up to 60% failed variants are allowed
QUARANTINE = {
    "calibrate": {"variants_per_family": 2, "resets": 5, "handled_outcomes": [], "max_failed_fraction": 0.6},
    "variants": {
        "dimensions": {
            "start_stage": ["login", "checkout"],
            "user_tier": ["standard", "blocked"],
            "network": ["normal"],
        },
        "samples_per_combination": 3,
        "split": {"validation": 0.2, "test": 0.2},
    },
}


def test_every_phase_with_a_threshold_declares_its_gate() -> None:
    gates = {g.phase: g for g in declared_gates(AgentFlowConfig())}
    assert list(gates) == ["calibrate", "explore", "offline", "train", "stress"]
    assert [c.describe() for c in gates["explore"].checks] == ["state_coverage_ratio >= 0.92"]
    assert [c.describe() for c in gates["stress"].checks] == [
        "robustness_score >= 0.8",
        "consistency >= 0.82",
        "crash_rate <= 0",
    ]
    assert gates["explore"].budget_steps == 20_000 + 20_000
    assert gates["train"].budget_steps == 200_000


def test_a_failed_check_names_gate_metric_value_and_threshold() -> None:
    gate = gate_for(AgentFlowConfig(), "stress")
    verdict = evaluate_gate(gate, {"robustness_score": 0.777, "consistency": 0.9, "crash_rate": 0.0})
    assert not verdict.passed
    assert verdict.message == "stress gate failed: robustness_score=0.777 (required >= 0.8)"
    assert evaluate_gate(gate, {"robustness_score": 0.9, "consistency": 0.9, "crash_rate": 0.0}).passed


def test_a_missing_or_nan_metric_never_passes() -> None:
    check = GateCheck("x", "<=", 1.0)
    assert not check.holds(math.nan)
    verdict = evaluate_gate(gate_for(AgentFlowConfig(), "explore"), {})
    assert not verdict.passed and "state_coverage_ratio=nan" in verdict.message


def test_budget_use_within_and_metrics() -> None:
    use = BudgetUse("explore", 10.0, 300.0, 21_000, 40_000)
    assert use.within
    assert use.metrics()["budget/explore/wall_fraction"] == pytest.approx(10 / 300)
    assert not BudgetUse("train", 10.0, 5.0).within


def test_unknown_gate_keys_and_out_of_range_thresholds_are_config_errors(tmp_path: Path) -> None:
    from agentflow_core.errors import ConfigError

    bad = write_tiny_params(tmp_path, explore={"min_state_coverage": 1.5})
    with pytest.raises(ConfigError, match="explore.min_state_coverage"):
        load_config(bad)
    bad = write_tiny_params(tmp_path, train={"gate": {"stop_on_convergance": True}})
    with pytest.raises(ConfigError, match="stop_on_convergance"):
        load_config(bad)


def test_validate_prints_exactly_the_enforced_gates(tmp_path: Path) -> None:
    params = write_tiny_params(tmp_path, stress={"min_robustness": 0.33})
    proc = subprocess.run(
        [str(REPO / "bin" / "agentflow"), "validate", "-p", str(params)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "1000"},
        timeout=120,
        check=True,
    )
    gate_lines = [line.split("gate: ", 1)[1] for line in proc.stdout.splitlines() if "gate: " in line]
    assert gate_lines == [g.describe() for g in declared_gates(load_config(params))]
    assert "robustness_score >= 0.33" in proc.stdout


def _cycle(root: Path, **overrides: dict[str, Any]) -> dict[str, Any]:
    from flows.training_cycle import training_cycle

    params = write_tiny_params(root, **overrides)
    return training_cycle(params_path=str(params), run_name="gates")


def _parent_run(root: Path) -> Any:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{root / '.agentflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("agentflow")
    return next(r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name == "gates")


@pytest.mark.slow
def test_calibration_gate_out_of_reach_stops_the_flow(tmp_path: Path, prefect_harness: None) -> None:
    from tasks.prefect_tasks import GateFailed

    overrides = {**QUARANTINE, "calibrate": {**QUARANTINE["calibrate"], "max_failed_fraction": 0.0}}
    with pytest.raises(GateFailed, match=r"^calibrate gate failed: failed_fraction=0\.5 \(required <= 0\)$"):
        _cycle(tmp_path, **overrides)
    assert (tmp_path / "data" / "calibration" / "quarantine.json").exists()  # its output is kept
    assert not (tmp_path / "data" / "variants").exists()
    assert _parent_run(tmp_path).info.status == "FAILED"


@pytest.mark.slow
def test_exploration_gate_out_of_reach_stops_the_flow_after_remediation(tmp_path: Path, prefect_harness: None) -> None:
    from tasks.prefect_tasks import GateFailed

    explore = {"total_steps": 160, "num_envs": 8, "reference_pool_steps": 10, "min_state_coverage": 1.0}
    explore["remediation"] = {"max_steps": 160, "epsilon": 1.0}
    with pytest.raises(GateFailed, match=r"^explore gate failed: state_coverage_ratio=0\.\d+ \(required >= 1\)$"):
        _cycle(tmp_path, explore=explore)
    data = tmp_path / "data"
    assert (data / "trajectories" / "_meta.json").exists() and (data / "variants" / "catalogue.parquet").exists()
    metrics = json.loads((data / "metrics" / "explore.json").read_text())
    assert metrics["explore_steps"] == 320 and metrics["remediation_steps"] == 160  # the whole step budget
    assert metrics["budget/explore/budget_steps"] == 320
    assert not (data / "checkpoints").exists()
    parent = _parent_run(tmp_path)
    assert parent.data.metrics["budget/explore/steps"] == 320 and "budget/calibrate/wall_s" in parent.data.metrics


@pytest.mark.slow
def test_training_gate_out_of_reach_stops_the_flow_and_logs_why_training_stopped(
    tmp_path: Path, prefect_harness: None
) -> None:
    from tasks.prefect_tasks import GateFailed

    train = {"gate": {"stop_on_convergence": False, "require_convergence": True, "min_validation_process_success": 0.0}}
    with pytest.raises(GateFailed, match=r"^train gate failed: policy_convergence_flag=0 \(required >= 1\)$"):
        _cycle(tmp_path, train=train)
    summary = json.loads((tmp_path / "data" / "checkpoints" / "train_summary.json").read_text())
    assert summary["stop_reason"] == "step_budget" and summary["global_step"] >= 1024
    assert not (tmp_path / "data" / "stress").exists()
    assert _parent_run(tmp_path).data.tags["agentflow.train.stop_reason"] == "step_budget"


@pytest.mark.slow
def test_quarantined_variants_never_reach_a_later_phase_and_a_failed_stress_gate_is_reported(
    tmp_path: Path, prefect_harness: None
) -> None:
    from mlflow.tracking import MlflowClient

    from tasks.prefect_tasks import GateFailed

    # a policy trained from scratch for a few updates (no demonstrations, no offline actor) is not perfect
    untrained = {"bc_warm_start": False, "gate": {"min_validation_process_success": 0.0}}
    overrides = {**QUARANTINE, "train": untrained, "offline": {"enabled": False}, "stress": {"min_robustness": 1.0}}
    with pytest.raises(GateFailed, match=r"^stress gate failed: robustness_score=0\.\d+ \(required >= 1\)"):
        _cycle(tmp_path, **overrides)
    data = tmp_path / "data"
    quarantine = json.loads((data / "calibration" / "quarantine.json").read_text())["variants"]
    assert quarantine and all("expert reached the goal in 0%" in q["reason"] for q in quarantine)
    hashes, ids = {q["content_hash"] for q in quarantine}, {q["env_id"] for q in quarantine}

    catalogue = pd.read_parquet(data / "variants" / "catalogue.parquet")
    assert len(catalogue) == 3 * 4 * 3 - len(quarantine) and not hashes & set(catalogue["content_hash"])
    splits = json.loads((data / "variants" / "splits.json").read_text())["splits"]
    assert not hashes & {h for members in splits.values() for h in members}
    shards = sorted((data / "trajectories").glob("part-*.parquet"))
    explored = set(pd.concat([pd.read_parquet(f, columns=["env_id"]) for f in shards])["env_id"])
    assert explored and not ids & explored
    stressed = set(pd.read_parquet(data / "stress" / "episodes.parquet", columns=["env_id"])["env_id"])
    assert stressed and not ids & stressed

    report = json.loads((data / "reports" / "report.json").read_text())
    assert {q["env_id"] for q in report["cycle"]["quarantine"]} == ids
    assert report["cycle"]["verdict"] == "gate failed" and report["cycle"]["reason"].startswith("stress gate failed")
    md = (data / "reports" / "report.md").read_text()
    assert md.startswith("# GATE FAILED: ") and "- Verdict: GATE FAILED — stress gate failed" in md.splitlines()[2]
    assert md.index("## Test split: trained vs the process's rules") < md.index("# Evaluation report")
    assert all(q in md for q in ids)
    assert [b["phase"] for b in report["cycle"]["budgets"]] == [
        "calibrate",
        "variants",
        "explore",
        "train",
        "stress",
    ]  # offline switched off above
    html = (data / "reports" / "report.html").read_text()
    assert html.index("GATE FAILED") < html.index("training curve") < html.index("<h1>Evaluation report:")

    client = MlflowClient(f"sqlite:///{tmp_path / '.agentflow' / 'mlflow.db'}")
    parent = _parent_run(tmp_path)
    assert parent.info.status == "FAILED" and "budget/stress/wall_s" in parent.data.metrics
    versions = client.search_model_versions("name='agentflow-policy'")
    assert versions and all(v.tags["promotion"] == "False" for v in versions)
    assert not client.get_registered_model("agentflow-policy").aliases  # nothing promoted
