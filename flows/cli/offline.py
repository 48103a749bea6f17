"""``agentflow offline``: Phase 1b, conservative Q-learning on the trajectory dataset (BC -> CQL -> PPO).

Register on the main app with ``app.command("offline")(offline_command)``.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from agentflow_core.errors import AgentFlowError
from flows.cli.common import PARAMS_OPTION, one_line, phase_config_or_exit, phase_context_or_exit

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

CATALOGUE_OPTION = typer.Option(None, "--catalogue", help="Variant catalogue dir (default <data_dir>/variants).")
TRAJ_OPTION = typer.Option(None, "--trajectories", help="Trajectory dataset (default <data_dir>/trajectories).")
OUT_OPTION = typer.Option(None, "--out", help="Output dir (default <data_dir>/offline).")


def offline_command(
    params: Path = PARAMS_OPTION,
    catalogue: Path | None = CATALOGUE_OPTION,
    trajectories: Path | None = TRAJ_OPTION,
    out: Path | None = OUT_OPTION,
) -> None:
    """BC, then discrete CQL with prioritized replay on the dataset, then the BC actor improved by Q.

    `agentflow train` starts PPO from that actor with a decaying KL term toward it. Exits 1 when the
    offline gate fails (the summary is still written; no actor is left for training).
    """
    from tasks.steps.offline import run_offline

    ctx = phase_context_or_exit(params)
    paths = ctx.paths
    out = out or paths.offline
    try:
        summary = run_offline(
            ctx, catalogue or paths.variants, trajectories or paths.trajectories, out, paths.metrics_file("offline")
        )
    except AgentFlowError as exc:
        err_console.print(f"[bold red]offline failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    console.print(f"{escape(str(summary['message']))} -> {out}")
    if not summary["passed"]:
        err_console.print(f"[bold red]gate failed[/]: {escape(str(summary['gate']))}")
        raise typer.Exit(code=1)
    console.print(f"[green]{escape(str(summary['gate']))}[/]")


MINARI_OUT_OPTION = typer.Option(None, "--out", help="Minari datasets root (default <data_dir>/minari).")


def export_minari_command(
    params: Path = PARAMS_OPTION, trajectories: Path | None = TRAJ_OPTION, out: Path | None = MINARI_OUT_OPTION
) -> None:
    """Export the trajectory dataset (every cycle) as the Minari 0.5 dataset agentflow/trajectories-v0 (HDF5).

    Read it with ``minari.MinariDataset("<out>/agentflow/trajectories-v0/data")``, or
    ``MINARI_DATASETS_PATH=<out>`` and ``minari.load_dataset("agentflow/trajectories-v0")``.
    """
    from tasks.minari_export import export_minari
    from tasks.paths import DataPaths
    from tasks.process_io import load_process

    cfg = phase_config_or_exit(params)
    paths = DataPaths.of(cfg)
    try:
        vocabulary = load_process(cfg).vocabulary
        summary = export_minari(trajectories or paths.trajectories, out or paths.root / "minari", vocabulary)
    except (AgentFlowError, ValueError) as exc:
        err_console.print(f"[bold red]export failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    console.print(
        f"Minari {summary['minari_version']} dataset {summary['dataset_id']}: {summary['episodes']} episodes, "
        f"{summary['steps']} steps -> {escape(summary['path'])}"
    )
