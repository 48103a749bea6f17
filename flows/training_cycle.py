"""The training cycle as a Prefect DAG: calibrate → variants → explore → train → stress → report.

The flow is composition only: each phase is a task in ``tasks.prefect_tasks`` that calls the
same step function as ``agentflow <phase>`` and the DVC stage. A failed exit gate raises
:class:`GateFailed` with the metrics in its message, so no downstream task runs. One MLflow
parent run per cycle; each phase opens its nested run with the parent's id.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from tasks.compose import backend
from tasks.config_io import flatten_params, load_config
from tasks.paths import DataPaths
from tasks.prefect_tasks import (
    GateFailed,
    calibrate_task,
    explore_task,
    report_task,
    section_fingerprint,
    stress_task,
    track_phase,
    train_task,
    variants_task,
)
from tasks.runtime import mlflow_uri
from tasks.tracking import MlflowTracker


@flow(name="agentflow-training-cycle", log_prints=False)
def training_cycle(
    params_path: str = "params.yaml", resume: bool = False, run_name: str | None = None, min_state_coverage: float = 0.0
) -> dict[str, Any]:
    """Run one training cycle.

    Args:
        params_path: the run configuration (params.yaml); validated before any run is created.
        resume: continue PPO from the last checkpoint under ``data/checkpoints``.
        run_name: MLflow parent run name (defaults to ``base.run_name``).
        min_state_coverage: exploration gate; the cycle stops if coverage stays below it.
    """
    cfg = load_config(params_path)  # a bad params.yaml fails here, before any run exists
    logger = get_run_logger()
    uri, experiment = mlflow_uri(cfg), cfg.base.tracking.experiment
    tracker = MlflowTracker(uri, experiment)
    parent = tracker.start_cycle(run_name or cfg.base.run_name, flatten_params(cfg), {"agentflow.resume": str(resume)})
    paths = DataPaths.of(cfg)
    tracker.set_tags(parent, backend(cfg).params(cfg.train.num_envs))  # where the envs are stepped
    results: dict[str, Any] = {"mlflow_run_id": parent}
    try:
        calibration = calibrate_task(params_path, parent, uri, experiment)
        results["calibrate"] = calibration
        tracker.log_metrics(parent, {"env_stability_score": calibration["env_stability_score"]})
        if not calibration["passed"]:
            raise GateFailed(f"calibration gate failed: {calibration['message']}")

        variants = variants_task(params_path, section_fingerprint(params_path, "base", "variants"), str(paths.root))
        track_phase(params_path, parent, uri, experiment, "variants", variants, paths.variants)
        results["variants"] = variants

        explore = explore_task(
            params_path,
            section_fingerprint(params_path, "base", "explore", "pool", "train"),
            str(variants.get("catalogue_sha256", "")),
        )
        track_phase(params_path, parent, uri, experiment, "explore", explore, paths.trajectories)
        results["explore"] = explore
        tracker.log_metrics(parent, {"state_coverage_ratio": explore["state_coverage_ratio"]})
        if explore["state_coverage_ratio"] < min_state_coverage:
            raise GateFailed(
                f"exploration gate failed: state_coverage_ratio {explore['state_coverage_ratio']:.3f} "
                f"< {min_state_coverage}"
            )

        train = train_task(params_path, parent, uri, experiment, resume)
        results["train"] = train
        tracker.log_metrics(parent, {"policy_convergence_flag": float(train.get("policy_convergence_flag", 0.0))})

        stress = stress_task(params_path, parent, uri, experiment)
        results["stress"] = stress
        tracker.log_metrics(parent, {"robustness_score": stress["robustness_score"]})

        # The report explains a failed stress gate too; only promotion is withheld.
        results["report"] = report_task(params_path, parent, uri, experiment, train["train_run_id"], stress["passed"])
        if not stress["passed"]:
            raise GateFailed(
                f"stress gate failed: robustness_score={stress['robustness_score']:.3f}, "
                f"consistency={stress['consistency']:.3f}, crash_episodes={stress['crash_episodes']}; "
                f"see {paths.reports}"
            )
    except BaseException:
        tracker.end(parent, "FAILED")
        raise
    tracker.end(parent)
    create_markdown_artifact(key="cycle-summary", markdown=cycle_markdown(results), description="Training cycle")
    logger.info("cycle finished: MLflow run %s", parent)
    return results


def cycle_markdown(results: dict[str, Any]) -> str:
    """One table of the exit metrics of every phase."""
    rows = [
        ("calibrate", "env_stability_score", results.get("calibrate", {}).get("env_stability_score")),
        ("explore", "state_coverage_ratio", results.get("explore", {}).get("state_coverage_ratio")),
        ("train", "policy_convergence_flag", results.get("train", {}).get("policy_convergence_flag")),
        ("stress", "robustness_score", results.get("stress", {}).get("robustness_score")),
    ]
    lines = ["| phase | exit metric | value |", "|---|---|---|"]
    lines += [f"| {p} | {m} | {v} |" for p, m, v in rows]
    return "## AgentFlow training cycle\n\n" + "\n".join(lines)
