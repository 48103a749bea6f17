"""The Prefect task that trains the discriminator reward validator (``tasks.steps.validator``), tracked in MLflow."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task

from tasks.prefect_tasks import NOT_PERSISTED, RETRY_TRANSIENT, _numeric, _open, _publish
from tasks.steps.validator import run_validator, validator_dir


@task(name="validator", **RETRY_TRANSIENT, **NOT_PERSISTED)
def validator_task(params_path: str, parent_run_id: str, tracking_uri: str, experiment: str) -> dict[str, Any]:
    """After explore: fit the discriminator on the exploration data; train and stress then use it."""
    ctx, paths, tracker = _open(params_path, tracking_uri, experiment)
    run_id = tracker.start_phase(parent_run_id, "validator")
    summary = run_validator(ctx, metrics_path=paths.metrics_file("validator"))
    tracker.log_metrics(run_id, _numeric(summary))
    tracker.log_artifacts(run_id, validator_dir(ctx), "validator")
    tracker.end(run_id, "FINISHED" if summary["passed"] else "FAILED")
    _publish("validator", "Reward validator (discriminator)", summary)
    get_run_logger().info("reward validator: %s", summary["gate"])
    return summary
