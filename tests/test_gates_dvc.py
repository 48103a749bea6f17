"""Each gate set out of reach fails `dvc repro` at its stage: exit code non-zero, one message naming the gate,
the metric and the threshold, and the outputs of the stages before it kept (tiny cycle in a temporary clone)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.test_dvc import DVC, clone, run  # noqa: F401  (clone is the module-scoped fixture)

pytestmark = pytest.mark.slow


def _set(root: Path, section: str, values: dict[str, Any]) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params[section].update(values)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def _fails(root: Path, pattern: str) -> str:
    proc = run([DVC, "repro"], root, check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output[-2000:]
    assert re.search(pattern, output), output[-3000:]
    return output


def test_each_gate_out_of_reach_fails_dvc_repro_at_its_stage(clone: Path) -> None:  # noqa: F811
    base = yaml.safe_load((clone / "params.yaml").read_text())
    data = clone / "data"

    _set(clone, "calibrate", {"max_failed_fraction": 0.0, "min_expert_success": 1.0, "handled_outcomes": []})
    _set(clone, "variants", {"dimensions": {**base["variants"]["dimensions"], "user_tier": ["standard", "blocked"]}})
    _fails(clone, r"calibrate gate failed: failed_fraction=0\.5 \(required <= 0\)")
    assert (data / "calibration" / "quarantine.json").exists() and not (data / "variants").exists()

    _set(clone, "calibrate", base["calibrate"])
    _set(clone, "variants", {"dimensions": base["variants"]["dimensions"]})
    _set(clone, "explore", {"min_state_coverage": 1.0, "remediation": {"max_steps": 64, "epsilon": 1.0}})
    _fails(clone, r"explore gate failed: state_coverage_ratio=0\.\d+ \(required >= 1\)")
    assert (data / "variants" / "catalogue.parquet").exists() and (data / "trajectories" / "_meta.json").exists()
    explore = json.loads((data / "metrics" / "explore.json").read_text())
    assert explore["remediation_steps"] == 64

    _set(clone, "explore", {"min_state_coverage": base["explore"]["min_state_coverage"]})
    gate = {**base["train"]["gate"], "stop_on_convergence": False, "require_convergence": True}
    # one evaluation (at the end) cannot make the flag, which needs four: convergence is out of reach
    _set(clone, "train", {"gate": gate, "eval_every_updates": 1000})
    _fails(clone, r"train gate failed: policy_convergence_flag=0 \(required >= 1\)")
    assert (data / "checkpoints" / "train_summary.json").exists() and not (data / "stress").exists()

    _set(clone, "train", {"gate": base["train"]["gate"], "eval_every_updates": base["train"]["eval_every_updates"]})
    _set(clone, "stress", {"min_robustness": 1.0})
    _fails(clone, r"stress gate failed: robustness_score=0\.\d+ \(required >= 1\)")
    report = json.loads((data / "reports" / "report.json").read_text())
    assert report["cycle"]["verdict"] == "gate failed"
