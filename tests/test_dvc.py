"""`dvc repro` in a temporary clone: reproduces the pipeline, is idempotent, re-runs only what changed,
and pushes/pulls against the local remote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tasks.config_io import parse_config
from tests.tiny import REPO, tiny_params

pytestmark = pytest.mark.slow
BIN = Path(sys.executable).parent


def run(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "DVC_NO_ANALYTICS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def stages_run(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of the committed repository with a tiny params.yaml (paths relative to the clone)."""
    root = tmp_path_factory.mktemp("dvc") / "repo"
    run(["git", "clone", "-q", str(REPO), str(root)], cwd=root.parent)
    params = tiny_params(root)
    params["base"].update({"state_dir": ".agentflow", "data_dir": "data", "env_config_dir": "configs/envs"})
    # the working tree's code (the clone holds the last commit; tests run against the code under test)
    for folder in ("agentflow_core", "tasks", "flows", "configs"):
        shutil.rmtree(root / folder)
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    # DVC reads the keys each stage names from the file itself, so write every section in full
    full = parse_config(params).model_dump(mode="json")
    (root / "params.yaml").write_text(yaml.safe_dump(full, sort_keys=False))
    return root


def test_repro_runs_every_stage_then_nothing(clone: Path) -> None:
    first = run(["dvc", "repro"], clone)
    assert stages_run(first.stdout) == {"calibrate", "variants", "explore", "train", "stress", "report"}
    for out in (
        "calibration/report.json",
        "variants/catalogue.parquet",
        "trajectories/_meta.json",
        "checkpoints/train_summary.json",
        "stress/summary.json",
        "reports/report.html",
    ):
        assert (clone / "data" / out).exists(), out
    assert run(["dvc", "status", "-q"], clone, check=False).returncode == 0
    second = run(["dvc", "repro"], clone)
    assert stages_run(second.stdout) == set()
    assert "didn't change, skipping" in second.stdout


def test_metrics_and_plots_are_declared(clone: Path) -> None:
    metrics = json.loads(run(["dvc", "metrics", "show", "--json"], clone).stdout)
    flat = json.dumps(metrics)
    for key in ("env_stability_score", "state_coverage_ratio", "heldout_success", "robustness_score"):
        assert key in flat
    plots = run(["dvc", "plots", "show", "--json"], clone).stdout
    assert "heldout_curve.csv" in plots


def test_changed_parameter_reruns_only_dependent_stages(clone: Path) -> None:
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["stress"]["episodes"] = 16
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert run(["dvc", "status", "-q"], clone, check=False).returncode == 1
    out = run(["dvc", "repro"], clone)
    assert stages_run(out.stdout) == {"stress", "report"}
    assert json.loads((clone / "data" / "metrics" / "stress.json").read_text())["episodes"] == 16


def test_push_and_pull_through_the_local_remote(clone: Path) -> None:
    run(["dvc", "push"], clone)
    assert any((clone / ".agentflow" / "dvc-remote").rglob("*"))
    shutil.rmtree(clone / "data" / "variants")
    shutil.rmtree(clone / ".dvc" / "cache")
    run(["dvc", "pull"], clone)
    assert (clone / "data" / "variants" / "catalogue.parquet").exists()
    assert run(["dvc", "status", "-q"], clone, check=False).returncode == 0
