"""``agentflow bench forgetting`` end to end on a tiny config: the shifts' catalogues, and what the result holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentflow_core.splits import read_splits
from agentflow_core.variants import VariantSpec
from benchmarks.forgetting_bench import SHIFTS, shifted
from flows.cli.bench import bench_app
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.steps.variants import run_variants
from tests.tiny import write_tiny_params


def test_the_recovery_shift_leaves_nothing_to_recover_from(tmp_path: Path) -> None:
    cfg = shifted(load_config(write_tiny_params(tmp_path)), tmp_path / "b", SHIFTS["recovery"])
    run_variants(PhaseContext.of(cfg), tmp_path / "b" / "variants")
    variants: list[VariantSpec] = [v for split in read_splits(tmp_path / "b" / "variants").values() for v in split]
    assert variants
    assert {v.params["user_tier"] for v in variants} == {"standard"}
    assert {v.params["network"] for v in variants} == {"normal"}
    # over 17 units at the highest unit price (100 x 1.15): no top-up in a 50-step episode's order
    assert min(v.params["balance"] for v in variants) >= 2000.0


@pytest.mark.slow
def test_bench_forgetting_recovery_on_a_tiny_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = write_tiny_params(tmp_path)
    monkeypatch.chdir(tmp_path)  # data/bench/forgetting_recovery.json and BENCHMARKS.md land here, not in the repo
    result = CliRunner().invoke(
        bench_app, ["forgetting", "--params", str(params), "--steps", "1024", "--shift", "recovery"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads((tmp_path / "data" / "bench" / "forgetting_recovery.json").read_text())
    assert out["shift_name"] == "recovery" and out["shift"] == SHIFTS["recovery"]
    champion, no_ewc, ewc = (out[f"a_test_process_success_{n}"] for n in ("champion", "retrain_no_ewc", "retrain_ewc"))
    assert out["forgetting_points_no_ewc"] == pytest.approx(100 * (champion - no_ewc))
    assert out["forgetting_points_ewc"] == pytest.approx(100 * (champion - ewc))
    by_value = out["a_test_process_success_by_value"]
    assert set(by_value) == {"champion", "no_ewc", "ewc"}
    # A's test split, every family and every dimension value of A (not B's narrower catalogue)
    assert {"family/web_checkout", "family/order_db", "family/payment_api", "user_tier/vip"} <= set(by_value["no_ewc"])
    assert all(0.0 <= rate <= 1.0 for cells in by_value.values() for rate in cells.values())
    assert "forgetting_points_ewc" in out["targets_met"]
    assert "Forgetting: a retrain on failure-free variants" in (tmp_path / "BENCHMARKS.md").read_text()
