"""``agentflow tune``: the impedance-matching probe before train.

Register on the main app with ``app.command("tune")(tune_command)``.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from agentflow_core.errors import AgentFlowError
from flows.cli.common import one_line, phase_context_or_exit

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
CATALOGUE_OPTION = typer.Option(None, "--catalogue", help="Variant catalogue dir (default <data_dir>/variants).")
TRAJ_OPTION = typer.Option(None, "--trajectories", help="Exploration dataset (default <data_dir>/trajectories).")
OUT_OPTION = typer.Option(None, "--out", help="Where choice.json goes (default <data_dir>/tuning).")


def tune_command(
    params: Path = PARAMS_OPTION,
    catalogue: Path | None = CATALOGUE_OPTION,
    trajectories: Path | None = TRAJ_OPTION,
    out: Path | None = OUT_OPTION,
) -> None:
    """Probe env-step, inference and update rates and reward sparsity; choose workers, envs and cadence.

    Writes choice.json (settings, each decision's reason, the measurements); `agentflow train` runs with
    it while tune.enabled is true. With tune.enabled false it only records that, and train keeps the static settings.
    """
    from tasks.steps.tune import run_tune

    ctx = phase_context_or_exit(params)
    cfg, paths = ctx.cfg, ctx.paths
    try:
        summary = run_tune(
            ctx,
            catalogue or paths.variants,
            trajectories or paths.trajectories,
            out or paths.tuning,
            paths.metrics_file("tune"),
        )
    except AgentFlowError as exc:
        err_console.print(f"[bold red]tune failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    for line in summary["decisions"]:
        console.print(escape(line))
    state = "train uses it" if cfg.tune.enabled else "tune.enabled is false: no probe, train keeps the static settings"
    console.print(f"{summary['budget/tune/wall_s']:.1f} s -> {(out or paths.tuning) / 'choice.json'} ({state})")
