"""``agentflow variants``: generate the variant catalogue and print its summary.

Register on the main app with ``app.command("variants")(variants)``; ``scheduler_bench`` can be
registered the same way (``agentflow bench scheduler``). ``variants_app`` runs both standalone
(``python -m flows.cli.variants --help``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentflow_core.atomic import write_json
from agentflow_core.errors import AgentFlowError, ConfigError
from flows.cli.common import one_line
from tasks.bench.scheduler_bench import run_scheduler_bench
from tasks.config_io import load_config
from tasks.determinism import make_deterministic
from tasks.paths import DataPaths
from tasks.steps.variants import run_variants

console = Console()
err_console = Console(stderr=True, soft_wrap=True)
variants_app = typer.Typer(
    help="Variant catalogue and scheduler benchmark.",
    pretty_exceptions_enable=False,
    add_completion=False,
    no_args_is_help=True,
)

PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
OUT_OPTION = typer.Option(None, "--out", "-o", help="Catalogue directory to (re)write (default <data_dir>/variants).")
N_VARIANTS_OPTION = typer.Option(1000, min=2, help="Catalogue size.")
DRAWS_OPTION = typer.Option(100_000, min=1, help="Draws (episodes) per strategy.")
ROUND_OPTION = typer.Option(64, min=1, help="Draws per scheduler round (the heat clock).")
SEED_OPTION = typer.Option(0, help="Seed of the synthetic learner and the schedulers.")
BENCH_OUT_OPTION = typer.Option(None, "--out", help="Also write the result as JSON here.")


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
        summary = run_variants(
            cfg, out or DataPaths.of(cfg).variants, DataPaths.of(cfg).metrics_file("variants"), source=str(params)
        )
    except ConfigError as exc:
        err_console.print(f"[bold red]configuration error[/]: {one_line(exc)}")
        raise typer.Exit(code=2) from None
    except AgentFlowError as exc:
        err_console.print(f"[bold red]variants failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    console.print(summary_table(summary))
    console.print(f"sha256 {summary['catalogue_sha256']} in {summary['seconds']:.2f}s")


def scheduler_bench(
    n_variants: int = N_VARIANTS_OPTION,
    draws: int = DRAWS_OPTION,
    draws_per_round: int = ROUND_OPTION,
    seed: int = SEED_OPTION,
    out: Path | None = BENCH_OUT_OPTION,
) -> None:
    """Compare uniform, round_robin, heat and plr_coverage on a synthetic learner."""
    result = run_scheduler_bench(n_variants=n_variants, draws=draws, draws_per_round=draws_per_round, seed=seed)
    table = Table(title=f"scheduler benchmark: {n_variants} variants, {draws} draws, {draws_per_round}/round")
    for column in ("strategy", "cold share", "vs RR", "max gap / n", "draws to 90%", "vs RR", "seconds"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for name, m in result["strategies"].items():
        table.add_row(
            name,
            f"{m['cold_share']:.4f}",
            _fmt(m["cold_share_vs_round_robin"]),
            f"{m['max_visit_gap_over_n']:.2f}",
            str(m["draws_to_90pct"]),
            _fmt(m["draws_to_90pct_vs_round_robin"]),
            f"{m['seconds']:.1f}",
        )
    console.print(table)
    console.print(json.dumps(result["targets_met"]))
    if out is not None:
        write_json(out, result)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


variants_app.command("variants")(variants)
variants_app.command("scheduler-bench")(scheduler_bench)

if __name__ == "__main__":
    variants_app()
