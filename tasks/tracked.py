"""Training with its MLflow record, the same for ``agentflow train`` (so the DVC stage) and the Prefect task.

The train run gets one ``log_batch`` per PPO update (``train/*`` curves, sent by the sink's writer
thread), then the summary metrics (the keys of ``data/metrics/train.json``), the policy hash, the
curves and plots. An exception closes it as FAILED; a killed process leaves it RUNNING until the
next start closes it as KILLED (:meth:`tasks.tracking.MlflowTracker.close_orphans`), and
``--resume`` reopens it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tasks.context import PhaseContext
from tasks.tracking import MlflowSink, MlflowTracker

UpdateHook = Callable[[int, int, dict[str, float]], None]


def tracked_train(
    ctx: PhaseContext,
    tracker: MlflowTracker,
    run_id: str,
    resume: bool,
    on_update: UpdateHook | None = None,
    catalogue: Path | None = None,
    trajectories: Path | None = None,
    out: Path | None = None,
    *,
    seed: int | None = None,
    warm_start: Path | None = None,
    ewc: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) PPO and record it into the MLflow run ``run_id``; paths default to ``base.data_dir``'s.

    ``seed``, ``warm_start`` and ``ewc`` are a retrain's cycle seed, champion checkpoint and the champion's
    EWC file (``run_train``).
    """
    from tasks.steps.train import run_train
    from tasks.steps.train_outputs import train_metrics
    from tasks.steps.tune import tuned_config

    paths = ctx.paths
    out = out or paths.checkpoints
    tuned, tuning = tuned_config(ctx.cfg, paths.tuning)  # the auto-tuner's choice when tune.enabled
    ctx = ctx.with_config(tuned)
    sink: MlflowSink | None = None
    try:
        sink = tracker.sink(run_id, prefix="train/")
        summary = run_train(
            ctx,
            catalogue or paths.variants,
            trajectories or paths.trajectories,
            out,
            resume=resume,
            sink=sink,
            metrics_path=paths.metrics_file("train"),
            on_update=on_update,
            seed=seed,
            warm_start=warm_start,
            ewc=ewc,
            tuning=tuning,
        )
        sink.close()  # every update's metrics in the store before the run's summary
    except BaseException:
        if sink is not None:
            with contextlib.suppress(Exception):  # what the run recorded before it failed, as far as it goes
                sink.close()
        tracker.end(run_id, "FAILED")
        raise
    tracker.log_metrics(run_id, train_metrics(summary))
    tracker.set_tags(
        run_id,
        {
            "agentflow.policy_hash": str(summary["policy_hash"]),
            "agentflow.tuning": "applied" if tuning["applied"] else str(tuning["reason"])[:500],
        },
    )
    tracker.log_artifacts(run_id, out / "plots", "plots")
    tracker.log_artifacts(run_id, out / "curve.json", "curves")
    tracker.end(run_id)
    return summary
