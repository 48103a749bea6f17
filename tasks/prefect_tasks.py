"""Prefect tasks: thin wrappers that call the phase step functions and track them in MLflow.

Each task takes small serialisable arguments (a params path, run ids, hashes), loads the
config itself, opens its nested MLflow run under the cycle's parent run (explicit ``run_id``
everywhere: Prefect runs tasks on worker threads and the fluent MLflow run is thread-local),
calls the same step function that ``agentflow <phase>`` and the DVC stage call, and publishes
a Prefect artifact. Every task first makes its process deterministic (``tasks.determinism``).

No Prefect result is persisted: Prefect's result records name their own serializer, so a record
planted in the result storage would be unpickled (run as code) even by a task that persists
JSON. The deterministic phases (variants, explore) keep their own cache instead (:func:`cached`):
a JSON record under ``<state_dir>/phase-cache`` holding the phase's summary, keyed by the
stage's ``dvc.yaml`` deps and params (:func:`tasks.stages.stage_fingerprint`) and valid only while
the output folder still has the DVC md5 it was written with. Training resumes from its checkpoint.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import Task, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.schemas.objects import State, TaskRun

from agentflow_core.atomic import write_json
from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import is_transient
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.determinism import make_deterministic
from tasks.paths import DataPaths
from tasks.runtime import state_dir
from tasks.stages import dvc_md5, stage_fingerprint
from tasks.tracking import MlflowTracker

NOT_PERSISTED: dict[str, Any] = {"persist_result": False, "cache_policy": NO_CACHE}


def retry_if_transient(task: Task[..., Any], task_run: TaskRun, state: State[Any]) -> bool:
    """Prefect's ``retry_condition_fn``: retry a failed phase only when its failure may pass on a rerun.

    A missing binary, a configuration or requirement error, damaged data or a bug fails the same way
    twice (``agentflow_core.errors.is_transient``): the phase fails at once instead of redoing its work.
    """
    failure = state.data
    return not isinstance(failure, BaseException) or is_transient(failure)


# One more try for a phase whose failure may pass (a lost worker, a crashed env service), none otherwise.
RETRY_TRANSIENT: dict[str, Any] = {"retries": 1, "retry_condition_fn": retry_if_transient}


class GateFailed(RuntimeError):
    """A phase's exit gate failed; downstream phases must not run."""


def _config(params_path: str) -> AgentFlowConfig:
    cfg = load_config(params_path)
    make_deterministic(cfg.base.seed)
    return cfg


def _context(params_path: str) -> PhaseContext:
    """The task's phase context: its config parsed once (the process made deterministic first)."""
    return PhaseContext.of(_config(params_path))


def _open(params_path: str, tracking_uri: str, experiment: str) -> tuple[PhaseContext, DataPaths, MlflowTracker]:
    ctx = _context(params_path)
    return ctx, ctx.paths, MlflowTracker(tracking_uri, experiment)


def _numeric(summary: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def _publish(key: str, title: str, summary: dict[str, Any]) -> None:
    rows = [{"metric": k, "value": v} for k, v in _numeric(summary).items()]
    text = f"## {title}\n\n" + "\n".join(f"- **{r['metric']}**: {r['value']:.4g}" for r in rows)
    if summary.get("message"):
        text += f"\n\n```\n{summary['message']}\n```"
    create_markdown_artifact(markdown=text, key=key, description=title)
    if rows:
        create_table_artifact(table=rows, key=f"{key}-metrics", description=f"{title}: exit metrics")


class Throttled:
    """Log progress at INFO about every ``fraction`` of the work (the Prefect UI and terminal show it)."""

    def __init__(self, phase: str, fraction: float = 0.1) -> None:
        self.phase, self.fraction, self.next = phase, fraction, 0.0
        self.logger = get_run_logger()

    def __call__(self, done: float, total: float, status: str = "") -> None:
        """Log ``done``/``total`` when another ``fraction`` of the work is done, and at the end."""
        share = done / total if total else 1.0
        if share >= self.next or done >= total:
            self.logger.info("%s %d/%d (%.0f%%) %s", self.phase, done, total, 100 * share, status)
            self.next = share + self.fraction


def _cache_record(record_path: Path) -> dict[str, Any]:
    """A phase-cache record, or ``{}`` (the phase reruns) with a warning line when the file is damaged."""
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        record, problem = None, f"{type(exc).__name__}: {str(exc)[:120]}"
    else:
        problem = "not a record with a summary"
    if isinstance(record, dict) and isinstance(record.get("summary"), dict):
        return record
    logging.getLogger("agentflow.phase_cache").warning(
        "phase cache %s is damaged (%s): treated as absent, the phase reruns", record_path, problem
    )
    return {}


def cached(
    cfg: AgentFlowConfig, stage: str, out_dir: Path, use_cache: bool, run: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """``run()`` the phase unless its record matches the stage's fingerprint and its output is intact."""
    record_path = state_dir(cfg) / "phase-cache" / f"{stage}.json"
    key = stage_fingerprint(cfg, stage)
    if use_cache and record_path.exists() and out_dir.exists():
        record = _cache_record(record_path)
        if record.get("key") == key and record.get("out_md5") == dvc_md5(out_dir):
            get_run_logger().info("%s: inputs unchanged and %s intact, reusing it", stage, out_dir)
            return dict(record["summary"])
    summary = run()
    write_json(record_path, {"key": key, "out_md5": dvc_md5(out_dir), "summary": summary})
    return summary


@task(name="calibrate", retry_delay_seconds=2, **RETRY_TRANSIENT, **NOT_PERSISTED)
def calibrate_task(params_path: str, parent_run_id: str, tracking_uri: str, experiment: str) -> dict[str, Any]:
    """Phase 0: the calibration gate."""
    from tasks.steps.calibrate import run_calibrate

    ctx, paths, tracker = _open(params_path, tracking_uri, experiment)
    run_id = tracker.start_phase(parent_run_id, "calibrate")
    summary = run_calibrate(ctx, paths.calibration, paths.metrics_file("calibrate"))
    tracker.log_metrics(run_id, _numeric(summary))
    tracker.log_artifacts(run_id, paths.calibration, "calibration")
    tracker.end(run_id, "FINISHED" if summary["passed"] else "FAILED")
    _publish("calibration", "Phase 0: calibration gate", summary)
    get_run_logger().info("calibration: %s", summary["message"])
    return summary


@task(name="variants", **RETRY_TRANSIENT, **NOT_PERSISTED)
def variants_task(params_path: str, use_cache: bool = True) -> dict[str, Any]:
    """Variant generation (deterministic for its deps and params: reused across reruns)."""
    from tasks.steps.variants import run_variants

    ctx = _context(params_path)
    paths = ctx.paths
    summary = cached(
        ctx.cfg,
        "variants",
        paths.variants,
        use_cache,
        lambda: run_variants(ctx, paths.variants, paths.metrics_file("variants"), source=params_path),
    )
    _publish("variants", "Variant catalogue", summary)
    return summary


@task(name="explore", **RETRY_TRANSIENT, **NOT_PERSISTED)
def explore_task(params_path: str, use_cache: bool = True, retrain_plan: str | None = None) -> dict[str, Any]:
    """Phase 1: coverage-driven exploration into trajectory shards (reused for the same inputs).

    A retrain (``retrain_plan``: its plan.json) explores anew and appends to the dataset (``tasks.retrain``).
    """
    from tasks.steps.explore import run_explore

    ctx = _context(params_path)
    paths = ctx.paths
    progress = Throttled("explore")
    if retrain_plan is not None:
        from tasks.retrain import RetrainPlan, explore_retrain

        summary = explore_retrain(
            ctx,
            RetrainPlan.read(retrain_plan),
            paths.metrics_file("explore"),
            on_progress=lambda p: progress(p.steps, p.total_steps, f"coverage {p.state_coverage_ratio:.3f}"),
        )
        _publish("exploration", "Phase 1: exploration (retrain, appended)", summary)
        return summary
    summary = cached(
        ctx.cfg,
        "explore",
        paths.trajectories,
        use_cache,
        lambda: run_explore(
            ctx,
            paths.variants,
            paths.trajectories,
            paths.metrics_file("explore"),
            on_progress=lambda p: progress(
                p.steps, p.total_steps, f"coverage {p.state_coverage_ratio:.3f} eps {p.epsilon:.2f}"
            ),
        ),
    )
    _publish("exploration", "Phase 1: exploration", summary)
    return summary


@task(name="offline", **RETRY_TRANSIENT, **NOT_PERSISTED)
def offline_task(params_path: str, use_cache: bool = True) -> dict[str, Any]:
    """Phase 1b: BC -> discrete CQL (prioritized replay) -> BC actor improved by Q (reused for the same inputs)."""
    from tasks.steps.offline import run_offline

    ctx = _context(params_path)
    paths = ctx.paths
    summary = cached(
        ctx.cfg,
        "offline",
        paths.offline,
        use_cache,
        lambda: run_offline(ctx, paths.variants, paths.trajectories, paths.offline, paths.metrics_file("offline")),
    )
    _publish("offline", "Phase 1b: offline RL (CQL)", summary)
    get_run_logger().info("offline: %s", summary["message"])
    return summary


def track_phase(
    params_path: str,
    parent_run_id: str,
    tracking_uri: str,
    experiment: str,
    phase: str,
    summary: dict[str, Any],
    artifacts: Path | None,
) -> None:
    """Log a phase that ran (or came from cache) into its nested MLflow run."""
    tracker = MlflowTracker(tracking_uri, experiment)
    run_id = tracker.start_phase(parent_run_id, phase)
    tracker.log_new_metrics(run_id, _numeric(summary))  # a resume reopens this run: no second copy
    if artifacts is not None:
        for card in sorted(artifacts.glob("*.json"))[:5]:
            tracker.log_artifacts(run_id, card, phase)
    tracker.end(run_id)


@task(name="tune", retries=0, **NOT_PERSISTED)
def tune_task(
    params_path: str, parent_run_id: str, tracking_uri: str, experiment: str, replay: str | None = None
) -> dict[str, Any]:
    """The impedance-matching probe before train (docs/design.md §7.1): writes the choice train runs with.

    ``replay``: a recorded choice.json to use instead of probing (a resumed or reproduced run).
    """
    from tasks.steps.tune import run_tune

    ctx, paths, tracker = _open(params_path, tracking_uri, experiment)
    run_id = tracker.start_phase(parent_run_id, "tune")
    summary = run_tune(
        ctx,
        paths.variants,
        paths.trajectories,
        paths.tuning,
        paths.metrics_file("tune"),
        replay=None if replay is None else Path(replay),
    )
    tracker.log_metrics(run_id, _numeric(summary))
    tracker.log_artifacts(run_id, paths.tuning, "tuning")
    tracker.end(run_id)
    _publish("tuning", "Auto-tuner: workers, envs per worker, update cadence", summary)
    for line in summary["decisions"]:
        get_run_logger().info("tune: %s", line)
    return summary


@task(name="train", retries=0, **NOT_PERSISTED)
def train_task(
    params_path: str,
    parent_run_id: str,
    tracking_uri: str,
    experiment: str,
    resume: bool,
    retrain_plan: str | None = None,
) -> dict[str, Any]:
    """Phase 2: PPO refinement with checkpoints; resumes from the last checkpoint when asked.

    A retrain starts from the champion's weights with the cycle seed of its plan.
    """
    from tasks.retrain import RetrainPlan
    from tasks.tracked import tracked_train

    ctx, _, tracker = _open(params_path, tracking_uri, experiment)
    plan = RetrainPlan.read(retrain_plan) if retrain_plan is not None else None
    warm_start = Path(plan.champion_checkpoint) if plan is not None and plan.champion_checkpoint else None
    run_id = tracker.start_phase(parent_run_id, "train")
    progress = Throttled("train update")
    summary = tracked_train(
        ctx,
        tracker,
        run_id,
        resume,
        on_update=lambda update, total, m: progress(
            update,
            total,
            f"goal reached {m.get('rollout/success_rate', float('nan')):.2f} (sampled actions) "
            f"return {m.get('rollout/episode_return', float('nan')):.2f} "
            f"{m.get('time/sps', 0.0):.0f} steps/s",
        ),
        seed=None if plan is None else plan.seed,
        warm_start=warm_start,
        ewc=Path(plan.ewc) if plan is not None and plan.ewc else None,
    )
    _publish("training", "Phase 2: PPO refinement", summary)
    return {**summary, "train_run_id": run_id}


@task(name="stress", **RETRY_TRANSIENT, **NOT_PERSISTED)
def stress_task(params_path: str, parent_run_id: str, tracking_uri: str, experiment: str) -> dict[str, Any]:
    """Phase 3: stress validation of the best checkpoint."""
    from tasks.steps.stress import run_stress

    ctx, paths, tracker = _open(params_path, tracking_uri, experiment)
    run_id = tracker.start_phase(parent_run_id, "stress")
    full = run_stress(ctx, on_progress=Throttled("stress episodes"))
    summary = {
        **full["metrics"],
        **full["budget"],
        "passed": full["passed"],
        "gate": full["gate"],
        "policy": full["policy"],
        "message": full["gate"] + "; " + "; ".join(full.get("recommendations", [])[:3]),
    }
    tracker.log_metrics(run_id, _numeric(summary))
    tracker.log_artifacts(run_id, paths.stress, "stress")
    tracker.end(run_id)
    _publish("stress", "Phase 3: stress validation", summary)
    return summary


@task(name="report", **RETRY_TRANSIENT, **NOT_PERSISTED)
def report_task(
    params_path: str,
    parent_run_id: str,
    tracking_uri: str,
    experiment: str,
    train_run_id: str,
    stress_passed: bool,
    retrain: bool = False,
) -> dict[str, Any]:
    """Report + champion/challenger: register the checkpoint and move the ``champion`` alias if promoted.

    A checkpoint that failed stress validation is reported but never promoted. A retrain's challenger
    must also beat the champion on the paired held-out episodes. The decision comes first, so the
    report opens with it (promoted / kept / gate failed, and why); the report is kept per cycle
    (``tasks.retrain.keep_cycle_report``).
    """
    from prefect.runtime import flow_run
    from prefect.settings import PREFECT_UI_URL

    from tasks.budgets import budget_metrics
    from tasks.promotion import promote_if_better
    from tasks.retrain import keep_cycle_report
    from tasks.steps.report import run_report

    started = time.perf_counter()
    ctx, paths, tracker = _open(params_path, tracking_uri, experiment)
    run_id = tracker.start_phase(parent_run_id, "report")
    decision = promote_if_better(ctx, tracker, train_run_id, allowed=stress_passed, paired=retrain)
    links = {"MLflow run": tracker.run_url(parent_run_id)}
    if flow_run.id:
        links["Prefect flow run"] = f"{PREFECT_UI_URL.value() or 'http://127.0.0.1:4200'}/runs/flow-run/{flow_run.id}"
    summary = run_report(ctx, champion=decision, links=links)
    summary["cycle_report"] = str(keep_cycle_report(ctx, parent_run_id, decision))
    if "paired" in decision:
        summary["paired"] = decision["paired"]
    summary = {
        **summary,
        "promoted": decision["promote"],
        "promotion_reason": decision["reason"],
        **budget_metrics("report", time.perf_counter() - started, ctx.cfg.report.budget_s),
    }
    tracker.log_metrics(run_id, _numeric(summary))
    tracker.log_artifacts(run_id, paths.reports, "reports")
    tracker.set_tags(run_id, {"promotion": decision["reason"][:500]})
    tracker.end(run_id)
    create_markdown_artifact(markdown=f"## Champion / challenger\n\n{decision['reason']}", key="champion")
    return summary
