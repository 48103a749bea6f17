"""The refund process (configs/processes/refund.yaml) trained by the same cycle as checkout, end to end.

The tiny refund cycle, then a retrain (EWC toward its champion), runs as the Prefect flow over both
refund channels (SQL case store, refund HTTP service) through every phase -- offline (BC + CQL), the
reward validator, the auto-tuner, train, stress with the process's own consistency probes and sim-to-real on
the real channels its file names, report --
over refund's own scenario dimensions; it must learn: the trained policy's test-split process success beats the exploration policy's and, on
the SQL channel, reaches its scripted expert's, measured by the train phase on the same held-out episodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow_core.rl.checkpoint import load_checkpoint
from tasks.process_io import process_path, read_process
from tests.tiny import write_tiny_refund_params

pytestmark = pytest.mark.slow


def test_refund_cycle_runs_every_phase_and_learns(tmp_path: Path, prefect_harness: None) -> None:
    from flows.training_cycle import training_cycle

    params = write_tiny_refund_params(tmp_path)
    results = training_cycle(params_path=str(params), run_name="tiny-refund")
    assert {"calibrate", "variants", "explore", "offline", "validator", "tune", "train", "stress", "report"} <= set(
        results
    )
    assert results["offline"]["enabled"] and results["offline"]["transitions"] > 0
    assert results["validator"]["enabled"] and results["validator"]["validator/expert_samples"] > 0
    assert (
        results["tune"]["tune/enabled"] == 1
        and json.loads((tmp_path / "data" / "tuning" / "choice.json").read_text())["settings"]
    )

    summary = json.loads((tmp_path / "data" / "checkpoints" / "train_summary.json").read_text())
    assert summary["test_rules"]["episodes"] >= 50
    assert summary["test_process_success_rules"] >= 0.9  # the refund expert's own figure on the test split
    assert summary["test_process_success"] > summary["test_process_success_exploration"]
    by_family = summary["test_process_success_by_family"]
    assert set(by_family) == {"refund_db", "refund_api"}
    # the SQL channel's mapping masks the actions a state does not allow: there the tiny policy matches the
    # expert. The HTTP mapping allows every action at SIGNED_OUT, and on this split's one signed-out, lossy
    # variant the 1,024-step policy retries instead of signing in (measured 0.83-0.89 overall, 0.67-0.8 on
    # refund_api, for 1,024-4,096 PPO steps): learnt above exploration, not yet the expert's 1.0
    assert by_family["refund_db"] >= summary["test_process_success_rules"]
    assert summary["test_process_success"] >= 0.8

    # the checkpoint is over the refund vocabulary: 13 tokens + 5 features in, 9 actions out
    refund = read_process(process_path("refund")).vocabulary
    best = load_checkpoint(
        tmp_path / "data" / "checkpoints" / "checkpoints" / summary["best_checkpoint"], vocabulary=refund
    )
    assert best.state["vocab_version"] == "refund-1"
    assert best.model["actor.0.weight"].shape[1] == refund.obs_dim == 18
    assert best.model[max(k for k in best.model if k.startswith("actor.") and k.endswith(".bias"))].shape == (9,)

    summary_file = json.loads((tmp_path / "data" / "stress" / "summary.json").read_text())
    stress = summary_file["metrics"]
    assert stress["consistency_probes"] == 7  # refund's own probes: token sets + the feature values they fix
    assert 0.0 < stress["consistency_random"] < 1.0 and 0.0 <= stress["consistency"] <= 1.0
    assert summary_file["goal"] == "REFUND_ISSUED"
    # variants, splits and breakdowns in refund's own dimensions, not checkout's renamed fields
    assert set(summary_file["process_success"]["by_dimension"]) == {"entry_stage", "account", "network"}
    # sim-to-real on refund's real channels (SQL on PostgreSQL, the service in its own process): the same paths
    real = summary_file["sim_to_real"]
    assert [f["family"] for f in real["families"]] == ["refund_api", "refund_db"] and real["max_gap"] == 0.0
    assert {r["dimension"] for r in real["per_dimension"]} == {"entry_stage", "account", "network"}
    report = json.loads((tmp_path / "data" / "reports" / "report.json").read_text())
    assert report["process"] == "refund" and report["goal"] == "REFUND_ISSUED"
    assert "goal success (REFUND_ISSUED)" in (tmp_path / "data" / "reports" / "report.md").read_text()
    tokens = json.loads((tmp_path / "data" / "trajectories" / "coverage.json").read_text())["nodes"]
    assert [n["token"] for n in tokens] == list(refund.tokens)

    # a retrain on the refund process: the champion's Fisher over refund's widths, EWC toward it, a decision
    # (its exploration runs on a fresh seed: the tiny coverage gate is recorded only, as in tests/test_retrain.py)
    relaxed = {"explore.min_state_coverage": 0.0}
    retrain = training_cycle(params_path=str(params), run_name="tiny-refund-retrain", retrain=True, overrides=relaxed)
    ewc = json.loads((tmp_path / "data" / "checkpoints" / "train_summary.json").read_text())["ewc"]
    assert ewc["used"] and ewc["ewc/fisher_max"] > 0.0
    assert Path(retrain["retrain"]["ewc"]).name == "fisher.safetensors"
    assert "promotion_reason" in retrain["report"]  # promoted or kept the champion, without error
