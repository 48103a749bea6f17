"""``agentflow variants``: generate the variant catalogue and print its summary.

Register on the main app with ``app.command("variants")(variants)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentflow_core.errors import AgentFlowError, ConfigError
from flows.cli.common import one_line
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.determinism import make_deterministic
from tasks.steps.variants import run_variants

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
OUT_OPTION = typer.Option(None, "--out", "-o", help="Catalogue directory to (re)write (default <data_dir>/variants).")


def summary_table(summary: dict[str, Any]) -> Table:
    """Counts per family and per dimension value, one table."""
    table = Table(title=escape(f"{summary['variants']} variants -> {summary['catalogue']}"))
    table.add_column("group")
    table.add_column("value")
    table.add_column("variants", justify="right")
    for split, count in summary["splits"].items():
        table.add_row("split", split, str(count))
    for family, count in summary["by_family"].items():
        table.add_row("family", escape(family), str(count))
    for dimension, counts in summary["by_dimension"].items():
        for value, count in counts.items():
            table.add_row(escape(dimension), escape(str(value)), str(count))
    return table


def variants(params: Path = PARAMS_OPTION, out: Path | None = OUT_OPTION) -> None:
    """Generate the variant catalogue (base envs × dimensions × perturbation samples)."""
    try:
        cfg = load_config(params)
        make_deterministic(cfg.base.seed)
        ctx = PhaseContext.of(cfg)
        summary = run_variants(ctx, out or ctx.paths.variants, ctx.paths.metrics_file("variants"), source=str(params))
    except ConfigError as exc:
        err_console.print(f"[bold red]configuration error[/]: {one_line(exc)}")
        raise typer.Exit(code=2) from None
    except AgentFlowError as exc:
        err_console.print(f"[bold red]variants failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    console.print(summary_table(summary))
    console.print(f"sha256 {summary['catalogue_sha256']} in {summary['seconds']:.2f}s")
