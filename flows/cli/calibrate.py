"""``agentflow calibrate``: Phase 0, the sandbox calibration gate."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from flows.cli.common import phase_context_or_exit
from tasks.registry_io import configure_adapter_debug
from tasks.steps.calibrate import run_calibrate

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def calibrate_command(
    params: Path = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml)."),
) -> None:
    """Run the calibration gate: expert stability per sampled variant, mapping audit, reward statistics.

    Exits 1 when the gate fails (too many unstable variants or mapping-audit errors).
    """
    ctx = phase_context_or_exit(params)
    configure_adapter_debug()
    paths = ctx.paths
    with Progress(
        TextColumn("[bold]calibrate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("calibrate", total=None)
        summary = run_calibrate(
            ctx,
            paths.calibration,
            paths.metrics_file("calibrate"),
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    table = Table("metric", "value", title="Phase 0: calibration")
    for key in ("env_stability_score", "variants", "failed", "failed_fraction", "audit_errors"):
        table.add_row(key, f"{summary[key]:.3f}" if isinstance(summary[key], float) else str(summary[key]))
    console.print(table)
    for env_id, reason in summary["quarantine"].items():
        console.print(f"[yellow]quarantined[/] {escape(str(env_id))}: {escape(str(reason))}")
    if not summary["passed"]:
        err_console.print(f"[bold red]gate failed[/]: {escape(str(summary['gate']))}")
        raise typer.Exit(code=1)
    console.print(f"[green]{escape(str(summary['gate']))}[/] -> {escape(str(paths.calibration))}")
