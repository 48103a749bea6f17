"""``agentflow train`` (Phase 2: BC warm start + PPO, resumable).

Register on the main app with ``app.command("train")(train_command)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import AgentFlowError
from flows.cli.common import config_or_exit, one_line, phase_progress
from tasks.backend import backend_of
from tasks.config_io import flatten_params
from tasks.context import PhaseContext
from tasks.determinism import make_deterministic

if TYPE_CHECKING:
    from tasks.tracking import MlflowTracker

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
CATALOGUE_OPTION = typer.Option(None, "--catalogue", help="Variant catalogue dir (default <data_dir>/variants).")
TRAJ_OPTION = typer.Option(
    None, "--trajectories", help="Exploration dataset for the BC warm start (default <data_dir>/trajectories)."
)
OUT_OPTION = typer.Option(None, "--out", help="Training output dir (default <data_dir>/checkpoints).")
RESUME_OPTION = typer.Option(
    False, "--resume", help="Continue from <out>/checkpoints/latest.json (bit-identical to an uninterrupted run)."
)
STEPS_OPTION = typer.Option(None, "--total-steps", min=1, help="Override train.total_steps.")
CHANNEL_OPTION = typer.Option(
    "sim",
    "--channel",
    help="sim: train on the catalogue; oscar: continue from the champion on the django-oscar store "
    "(stress.sim_to_real.oscar_env_config_dir), a small budget (--total-steps, default 256), gap before/after.",
)
START_OPTION = typer.Option(
    None, "--checkpoint", help="With --channel oscar: the policy to continue from [default: the best under data/]."
)


def train_command(
    params: Path = PARAMS_OPTION,
    catalogue: Path | None = CATALOGUE_OPTION,
    trajectories: Path | None = TRAJ_OPTION,
    out: Path | None = OUT_OPTION,
    resume: bool = RESUME_OPTION,
    total_steps: int | None = STEPS_OPTION,
    channel: str = CHANNEL_OPTION,
    checkpoint: str | None = START_OPTION,
) -> None:
    """Train the policy with PPO (BC warm start first when enabled); --resume continues a killed run.

    Tracked in MLflow like the flow's train phase: a top-level run of kind ``train`` (``--resume``
    reopens the interrupted one over the same checkpoints and params).
    """
    cfg = config_or_exit(params)
    if channel not in ("sim", "oscar"):
        err_console.print(f"[bold red]train failed[/]: --channel {escape(channel)}: expected sim or oscar")
        raise typer.Exit(code=2)
    if channel == "oscar":
        train_on_oscar(cfg, out, total_steps, checkpoint)
        return
    if total_steps is not None:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"total_steps": total_steps})})
    # First, before training's modules (torch, MLflow) import: a cluster address is checked at once, and
    # a private local Ray comes up on a helper thread (seconds spent mostly waiting on its own processes)
    # while this thread imports them, opens the MLflow run and runs the warm start.
    try:
        pool = backend_of(cfg).place()
    except AgentFlowError as exc:
        err_console.print(f"[bold red]train failed[/]: {exc}")
        raise typer.Exit(code=1) from None
    from tasks.tracked import tracked_train

    make_deterministic(cfg.base.seed)
    console.print(f"envs: {pool.describe(cfg.train.num_envs)}")
    data = Path(cfg.base.data_dir)
    out = out or data / "checkpoints"
    tracker, run_id = open_train_run(cfg, out, resume)
    with phase_progress("train", console) as progress:
        task = progress.add_task("train", total=cfg.train.num_updates, status="")

        def on_update(update: int, total: int, m: dict[str, float]) -> None:
            progress.update(
                task,
                completed=update,
                total=total,
                status=f"success {m.get('rollout/success_rate', float('nan')):.2f} "
                f"return {m.get('rollout/episode_return', float('nan')):.2f} "
                f"kl {m['losses/approx_kl']:.4f} clip {m['adaptive/clip_range']:.3f} "
                f"{m['time/sps']:.0f} sps",
            )

        try:
            summary = tracked_train(
                PhaseContext.of(cfg), tracker, run_id, resume, on_update, catalogue, trajectories, out
            )
        except AgentFlowError as exc:
            err_console.print(f"[bold red]train failed[/]: {one_line(exc)}")
            raise typer.Exit(code=1) from None
    console.print(
        f"policy {summary['policy_hash']} ({summary['best_checkpoint']}): test process success "
        f"[bold]{summary['test_process_success']:.3f}[/] (goal {summary['test_goal_success']:.3f}) vs "
        f"exploration {summary['test_process_success_exploration']:.3f} "
        f"(x{summary['test_process_success_vs_exploration']:.1f}) and the rules "
        f"{summary['test_process_success_rules']:.3f} ({summary['test_process_success_vs_rules']:.0%}); "
        f"by family {', '.join(f'{k} {v:.3f}' for k, v in summary['test_process_success_by_family'].items())}; "
        f"converged={summary['policy_convergence_flag']}, stopped on {summary['stop_reason']} after "
        f"{summary['global_step']} steps -> {out}"
    )
    from tasks.steps.evaluation import value_line  # pulls in the evaluation stack: only once a run is done

    value = value_line(summary)
    if value is not None:
        console.print(f"test split {value}")
    lost = summary["pool"]
    if lost["worker_restarts"]:
        times = ", ".join(f"{r['recovery_s']:.2f} s" for r in lost["recoveries"])
        console.print(
            f"pool: {lost['worker_restarts']} env worker(s) lost and replaced (recovery {times}); "
            f"{lost['episodes_lost']} episodes / {lost['steps_lost']} steps lost"
        )
    console.print(f"MLflow run {run_id}: {tracker.run_url(run_id)}")
    if not summary["passed"]:
        # checkpoints, policy and curves are written: a failed gate keeps every output, and the stage exits 1
        err_console.print(f"[bold red]gate failed[/]: {escape(str(summary['gate']))}")
        raise typer.Exit(code=1)
    console.print(f"[green]{escape(str(summary['gate']))}[/]")


def open_train_run(cfg: AgentFlowConfig, out: Path, resume: bool) -> tuple[MlflowTracker, str]:
    """The MLflow run of a standalone training: the interrupted one on ``--resume``, else a new one."""
    from tasks.determinism import determinism_tags
    from tasks.provenance import git_tags
    from tasks.runtime import mlflow_uri
    from tasks.stages import params_hash
    from tasks.tracking import CHECKPOINTS_TAG, PARAMS_HASH_TAG, MlflowTracker

    tracker = MlflowTracker(mlflow_uri(cfg), cfg.base.tracking.experiment)
    tracker.close_orphans()
    digest = params_hash(cfg)
    run_id = tracker.resumable("train", out, digest) if resume else None
    if run_id is not None:
        tracker.reopen(run_id)
    else:
        tags = {CHECKPOINTS_TAG: str(out.resolve()), PARAMS_HASH_TAG: digest}
        run_id = tracker.start_cycle(f"{cfg.base.run_name}-train", flatten_params(cfg), tags, kind="train")
    tracker.set_tags(run_id, {**git_tags(), **determinism_tags()})
    return tracker, run_id


def train_on_oscar(cfg: AgentFlowConfig, out: Path | None, total_steps: int | None, checkpoint: str | None) -> None:
    """``--channel oscar``: fine-tune the champion on the Oscar store; print success and gap before and after."""
    from tasks.oscar_finetune import DEFAULT_STEPS, finetune_on_oscar
    from tasks.rollout import resolve_checkpoint

    ctx = PhaseContext.of(cfg)
    out = out or Path(cfg.base.data_dir) / "oscar_finetune"
    steps = total_steps or DEFAULT_STEPS
    try:
        start = resolve_checkpoint(ctx, checkpoint)
        if start == "expert":
            raise AgentFlowError("--channel oscar continues a trained policy: the scripted expert has no weights")
        with phase_progress("train on Oscar", console) as progress:
            task = progress.add_task("train", total=None, status="before: the champion on Oscar")

            def on_update(update: int, total: int, m: dict[str, float]) -> None:
                status = f"success {m.get('rollout/success_rate', float('nan')):.2f} {m['time/sps']:.1f} sps"
                progress.update(task, completed=update, total=total, status=status)

            summary = finetune_on_oscar(ctx, start, out, steps, on_update)
    except AgentFlowError as exc:
        err_console.print(f"[bold red]train failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    before, after = summary["before"], summary["after"]
    console.print(
        f"Oscar fine-tune from {escape(start)}: {summary['total_steps']} steps in {summary['seconds']:.0f} s; "
        f"over {before['episodes']} paired episodes: Oscar success {before['real_process_success']:.3f} -> "
        f"{after['real_process_success']:.3f}, gap {100 * before['gap']:+.1f} -> {100 * after['gap']:+.1f} pts "
        f"-> {out}"
    )
