"""The training cycle as a Prefect DAG: calibrate → variants → explore → offline → validator → train → stress → report.

The flow is composition only: each phase is a task in ``tasks.prefect_tasks`` that calls the
same step function as ``agentflow <phase>`` and the DVC stage. Each step judges its phase against
the gate declared in params.yaml (``agentflow_core.gates``); a failed gate raises :class:`GateFailed`
with the verdict's one-line message (gate, metric, value, threshold), so no downstream task runs and
nothing is promoted, while every output already written stays. One MLflow
parent run per cycle; each phase opens its nested run with the parent's id. The parent run names
its code (git commit, dirty flag), params (hash, and params.yaml as an artifact), the DVC md5 of
every dataset the cycle wrote, the Prefect flow run, and carries every phase's metrics (the same
keys as ``data/metrics/<phase>.json``), so MLflow's Compare puts two cycles side by side.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_link_artifact, create_markdown_artifact
from prefect.runtime import flow_run
from prefect.settings import PREFECT_UI_URL

from agentflow_core.config import AgentFlowConfig
from tasks.backend import backend_of
from tasks.config_io import flatten_params, load_config
from tasks.determinism import determinism_tags, make_deterministic
from tasks.lifetime import bind_ephemeral_servers
from tasks.overrides import resolve_params
from tasks.paths import DataPaths
from tasks.prefect_tasks import (
    GateFailed,
    calibrate_task,
    explore_task,
    offline_task,
    report_task,
    stress_task,
    track_phase,
    train_task,
    tune_task,
    variants_task,
)
from tasks.preflight import require
from tasks.provenance import git_tags, process_provenance
from tasks.retrain_tasks import plan_retrain_task
from tasks.runtime import mlflow_uri
from tasks.stages import dvc_md5, params_hash
from tasks.tracking import CHECKPOINTS_TAG, PARAMS_HASH_TAG, MlflowTracker
from tasks.validator_tasks import validator_task

PREFECT_UI = "http://127.0.0.1:4200"  # where `prefect server start` serves the runs kept in PREFECT_HOME


def open_cycle(tracker: MlflowTracker, cfg: AgentFlowConfig, params_path: str, run_name: str, resume: bool) -> str:
    """The cycle's parent run: the interrupted one when resuming over the same checkpoints and params, else a new one."""
    tracker.close_orphans()
    checkpoints, digest = DataPaths.of(cfg).checkpoints, params_hash(cfg)
    parent = tracker.resumable("cycle", checkpoints, digest) if resume else None
    if parent is not None:
        tracker.reopen(parent)
    else:
        tags = {"agentflow.resume": str(resume), CHECKPOINTS_TAG: str(checkpoints.resolve()), PARAMS_HASH_TAG: digest}
        parent = tracker.start_cycle(run_name, flatten_params(cfg), tags)
        tracker.log_artifacts(parent, Path(params_path), "config")
        provenance = process_provenance(cfg)  # the process YAML, mappings, env configs; each channel's code
        for path, folder in provenance.artifacts():
            tracker.log_artifacts(parent, path, f"config/{folder}")
        tracker.set_tags(parent, provenance.tags)
    ui_url = f"{PREFECT_UI_URL.value() or PREFECT_UI}/runs/flow-run/{flow_run.id}"
    tracker.set_tags(
        parent,
        {**git_tags(), **determinism_tags(), "prefect.flow_run_id": str(flow_run.id), "prefect.flow_run_url": ui_url},
    )
    return parent


def name_flow_run(cfg: AgentFlowConfig, run_name: str) -> None:
    """Name the Prefect flow run ``<process>-<run name>`` and tag it with both, so the UI tells processes apart."""
    from prefect.client.orchestration import get_client

    tags = sorted({*(flow_run.tags or []), f"process:{cfg.process}", f"run:{run_name}"})
    with get_client(sync_client=True) as client:
        client.update_flow_run(flow_run.id, name=f"{cfg.process}-{run_name}", tags=tags)


def record_phase(tracker: MlflowTracker, parent: str, paths: DataPaths, phase: str, output: Path) -> None:
    """Carry a finished phase into the parent run: its metrics file and the DVC md5 of its output."""
    metrics_file = paths.metrics_file(phase)
    if metrics_file.exists():
        tracker.log_metrics(parent, phase_metrics(json.loads(metrics_file.read_text(encoding="utf-8"))))
    if output.exists():
        tracker.set_tags(parent, {f"agentflow.data.{output.name}.md5": dvc_md5(output)})


def phase_metrics(values: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a phase's metrics file (the keys `dvc metrics show` lists)."""
    return {k: float(v) for k, v in values.items() if isinstance(v, int | float)}


@flow(name="agentflow-training-cycle", log_prints=False)
def training_cycle(
    params_path: str = "params.yaml",
    resume: bool = False,
    run_name: str | None = None,
    use_cache: bool = True,
    overrides: dict[str, Any] | None = None,
    retrain: bool = False,
    tuning_choice: str | None = None,
) -> dict[str, Any]:
    """Run one training cycle.

    Args:
        params_path: the run configuration (params.yaml); validated before any run is created.
        resume: continue PPO from the last checkpoint under ``data/checkpoints``, in the same MLflow runs.
        run_name: MLflow parent run name (defaults to ``base.run_name``).
        use_cache: reuse variants/exploration whose deps, params and outputs are unchanged.
        overrides: ``{"train.total_steps": 4096, ...}``: dotted params.yaml keys set for this cycle, validated
            like the file (``tasks.overrides``).
        retrain: warm-start from the champion with a fresh cycle seed, explore what it fails first, append to
            the dataset, promote only on a paired held-out win (``tasks.retrain``).
        tuning_choice: a recorded ``choice.json`` the tune phase replays instead of probing (``agentflow reproduce``).
    """
    if resume and retrain:
        raise ValueError(
            "resume and retrain cannot be combined: a retrain draws a new seed and starts from the champion"
        )
    params_path = resolve_params(params_path, overrides)  # a bad override fails here, naming the key
    cfg = load_config(params_path)  # a bad params.yaml fails here, before any run exists
    require(cfg)  # so does a missing browser, database binary, service or folder (a deployment skips the CLI's check)
    make_deterministic(cfg.base.seed)
    bind_ephemeral_servers()  # a killed run must not leave Prefect's temporary server behind
    logger = get_run_logger()
    uri, experiment = mlflow_uri(cfg), cfg.base.tracking.experiment
    tracker = MlflowTracker(uri, experiment)
    name_flow_run(cfg, run_name or cfg.base.run_name)
    parent = open_cycle(tracker, cfg, params_path, run_name or cfg.base.run_name, resume)
    paths = DataPaths.of(cfg)
    tracker.set_tags(parent, backend_of(cfg).place().params(cfg.train.num_envs))  # where the envs are stepped
    results: dict[str, Any] = {
        "mlflow_run_id": parent,
        "params_path": params_path,
        "process": cfg.process,
        "run_name": run_name or cfg.base.run_name,
    }
    plan: str | None = None
    try:
        if retrain:
            results["retrain"] = plan_retrain_task(params_path, parent, uri, experiment)
            plan = str(results["retrain"]["plan"])
        calibration = calibrate_task(params_path, parent, uri, experiment)
        results["calibrate"] = calibration
        record_phase(tracker, parent, paths, "calibrate", paths.calibration)
        if not calibration["passed"]:
            raise GateFailed(calibration["gate"])

        variants = variants_task(params_path, use_cache)
        track_phase(params_path, parent, uri, experiment, "variants", variants, paths.variants)
        record_phase(tracker, parent, paths, "variants", paths.variants)
        results["variants"] = variants

        explore = explore_task(params_path, use_cache, retrain_plan=plan)
        track_phase(params_path, parent, uri, experiment, "explore", explore, paths.trajectories)
        record_phase(tracker, parent, paths, "explore", paths.trajectories)
        results["explore"] = explore
        if not explore["passed"]:
            raise GateFailed(explore["gate"])

        offline = offline_task(params_path, use_cache)
        track_phase(params_path, parent, uri, experiment, "offline", offline, paths.offline)
        record_phase(tracker, parent, paths, "offline", paths.offline)
        results["offline"] = offline
        if not offline["passed"]:
            raise GateFailed(offline["gate"])

        validator = validator_task(params_path, parent, uri, experiment)
        results["validator"] = validator
        record_phase(tracker, parent, paths, "validator", paths.root / "validator")
        if not validator["passed"]:
            raise GateFailed(validator["gate"])

        # the auto-tuner; train reads its choice. A resumed run keeps the choice its checkpoints were made
        # with, a reproduction replays the recorded one (the probe would measure today's machine load)
        kept = paths.tuning / "choice.json"
        replay = tuning_choice or (str(kept) if resume and cfg.tune.enabled and kept.exists() else None)
        results["tune"] = tune_task(params_path, parent, uri, experiment, replay=replay)
        record_phase(tracker, parent, paths, "tune", paths.tuning)
        tracker.log_artifacts(parent, paths.tuning / "choice.json", "tuning")

        train = train_task(params_path, parent, uri, experiment, resume, retrain_plan=plan)
        results["train"] = train
        record_phase(tracker, parent, paths, "train", paths.checkpoints)
        tracker.set_tags(
            parent,
            {
                "agentflow.policy_hash": str(train["policy_hash"]),
                "agentflow.train.stop_reason": str(train["stop_reason"]),
            },
        )
        if not train["passed"]:
            raise GateFailed(train["gate"])

        stress = stress_task(params_path, parent, uri, experiment)
        results["stress"] = stress
        record_phase(tracker, parent, paths, "stress", paths.stress)

        # The report explains a failed stress gate too; only promotion is withheld.
        results["report"] = report_task(
            params_path, parent, uri, experiment, train["train_run_id"], stress["passed"], retrain=retrain
        )
        tracker.log_metrics(parent, {k: v for k, v in results["report"].items() if k.startswith("budget/")})
        if not stress["passed"]:
            raise GateFailed(f"{stress['gate']}; see {paths.reports}")
    except BaseException:
        tracker.end(parent, "FAILED")
        raise
    tracker.end(parent)
    create_link_artifact(key="mlflow-run", link=tracker.run_url(parent), link_text=f"MLflow run {parent}")
    create_markdown_artifact(key="cycle-summary", markdown=cycle_markdown(results), description="Training cycle")
    logger.info("cycle finished: MLflow run %s (%s)", parent, tracker.run_url(parent))
    return results


def cycle_markdown(results: dict[str, Any]) -> str:
    """One table of the exit metrics of every phase."""
    rows = [
        ("calibrate", "env_stability_score", results.get("calibrate", {}).get("env_stability_score")),
        ("explore", "state_coverage_ratio", results.get("explore", {}).get("state_coverage_ratio")),
        (
            "offline",
            "offline_validation_process_success",
            results.get("offline", {}).get("offline_validation_process_success"),
        ),
        ("train", "policy_convergence_flag", results.get("train", {}).get("policy_convergence_flag")),
        ("train", "stop_reason", results.get("train", {}).get("stop_reason")),
        ("train", "test_process_success", results.get("train", {}).get("test_process_success")),
        ("train", "test_goal_success", results.get("train", {}).get("test_goal_success")),
        ("stress", "robustness_score", results.get("stress", {}).get("robustness_score")),
    ]
    lines = ["| phase | exit metric | value |", "|---|---|---|"]
    lines += [f"| {p} | {m} | {v} |" for p, m, v in rows]
    return "## AgentFlow training cycle\n\n" + "\n".join(lines)
