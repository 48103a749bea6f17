"""The Prefect task that plans a retrain (``tasks.retrain.plan_retrain``) and records its seed in MLflow."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from tasks.prefect_tasks import NOT_PERSISTED, _context
from tasks.retrain import PLAN_FILE, cycle_dir, plan_retrain
from tasks.tracking import MlflowTracker


@task(name="plan-retrain", retries=0, **NOT_PERSISTED)
def plan_retrain_task(params_path: str, parent_run_id: str, tracking_uri: str, experiment: str) -> dict[str, object]:
    """Champion, fresh cycle seed, exploration priority; returns the plan's summary and its ``plan.json`` path."""
    ctx = _context(params_path)
    tracker = MlflowTracker(tracking_uri, experiment)
    plan = plan_retrain(ctx, tracker, parent_run_id)
    path = cycle_dir(ctx.cfg, parent_run_id) / PLAN_FILE
    tracker.client.log_param(parent_run_id, "cycle_seed", str(plan.seed))
    tracker.set_tags(
        parent_run_id,
        {
            "agentflow.retrain": "true",
            "agentflow.cycle_seed": str(plan.seed),
            "agentflow.warm_start.model_version": str(plan.champion_version),
        },
    )
    tracker.log_artifacts(parent_run_id, path, "retrain")
    summary = plan.summary()
    create_markdown_artifact(
        key="retrain-plan",
        markdown="## Retrain plan\n\n" + "\n".join(f"- **{k}**: {v}" for k, v in summary.items()),
        description="Retrain: champion, cycle seed, exploration priority",
    )
    get_run_logger().info(
        "retrain: cycle seed %d, warm start from champion v%s, %d of %d sampled train variants failed first",
        plan.seed,
        plan.champion_version,
        len(plan.champion_failed),
        plan.sampled,
    )
    return {**summary, "plan": str(path)}
