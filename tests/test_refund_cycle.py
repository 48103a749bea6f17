"""The refund process (configs/processes/refund.yaml) trained by the same cycle as checkout, end to end.

The tiny refund cycle runs as the Prefect flow over both refund channels (SQL case store, refund
HTTP service); it must learn: the trained policy's test-split process success is at least its
scripted expert's, measured by the train phase on the same held-out episodes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentflow_core.rl.checkpoint import load_checkpoint
from tasks.process_io import process_path, read_process
from tests.tiny import write_tiny_refund_params

pytestmark = pytest.mark.slow


def test_refund_cycle_learns_at_least_its_expert(tmp_path: Path, prefect_harness: None) -> None:
    from flows.training_cycle import training_cycle

    params = write_tiny_refund_params(tmp_path)
    results = training_cycle(params_path=str(params), run_name="tiny-refund")
    assert {"calibrate", "variants", "explore", "train", "stress", "report"} <= set(results)

    summary = json.loads((tmp_path / "data" / "checkpoints" / "train_summary.json").read_text())
    assert summary["test_expert"]["episodes"] >= 50
    assert summary["test_process_success_expert"] >= 0.9  # the refund expert's own figure on the test split
    assert summary["test_process_success"] >= summary["test_process_success_expert"]
    assert summary["test_process_success"] > summary["test_process_success_exploration"]
    assert set(summary["test_process_success_by_family"]) == {"refund_db", "refund_api"}

    # the checkpoint is over the refund vocabulary: 13 tokens + 5 features in, 9 actions out
    refund = read_process(process_path("refund")).vocabulary
    best = load_checkpoint(
        tmp_path / "data" / "checkpoints" / "checkpoints" / summary["best_checkpoint"], vocabulary=refund
    )
    assert best.state["vocab_version"] == "refund-1"
    assert best.model["actor.0.weight"].shape[1] == refund.obs_dim == 18
    assert best.model[max(k for k in best.model if k.startswith("actor.") and k.endswith(".bias"))].shape == (9,)

    stress = json.loads((tmp_path / "data" / "stress" / "summary.json").read_text())["metrics"]
    assert stress["consistency_probes"] == 0  # refund declares no canonical probes: matched-state consistency
    assert stress["consistency"] == stress["matched_state_consistency"]
    tokens = json.loads((tmp_path / "data" / "trajectories" / "coverage.json").read_text())["nodes"]
    assert [n["token"] for n in tokens] == list(refund.tokens)
