"""What every ``agentflow bench`` command shares: the typer group, its options, and publishing a result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from agentflow_core.atomic import write_json

bench_app = typer.Typer(
    help="Benchmarks (results in BENCHMARKS.md and data/bench/*.json).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
BENCH_DIR = Path("data/bench")
REPEAT_OPTION = typer.Option(
    1, "--repeat", min=1, help="Run the benchmark this many times; a target is met only if every run meets it."
)
PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
# The channel, pool and training-machinery benchmarks measure a fixed reference workload, the first checkout
# world's three channels written in Python (a web UI, an order database, a payment API, with real counterparts),
# so their figures stay comparable whatever process params.yaml ships; --params names another.
REFERENCE_PARAMS = Path("params-checkout.yaml")
REFERENCE_PARAMS_OPTION = typer.Option(
    REFERENCE_PARAMS,
    "--params",
    "-p",
    help="The run configuration [default: the reference workload, params-checkout.yaml].",
)
console = Console()


def publish(name: str, result: dict[str, Any] | None = None, show: bool = True) -> None:
    """Write ``data/bench/<name>.json`` (when given a result), re-render BENCHMARKS.md, echo the section."""
    from benchmarks.markdown import TITLES, bench_section, write_benchmarks_md

    if result is not None:
        write_json(BENCH_DIR / f"{name}.json", result)
    write_benchmarks_md()
    if show:
        typer.echo(bench_section(TITLES[name]))


def print_targets(result: dict[str, Any], title: str) -> None:
    """A benchmark's metrics against their targets, every run's value where it was repeated."""
    table = Table(title=title)
    for column in ("metric", "value", "target", "met", "runs"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    runs = result.get("runs", {})
    for key, value in result.items():
        if key in ("targets", "targets_met", "runs") or isinstance(value, list | dict):
            continue
        target = result["targets"].get(key)
        met = result["targets_met"].get(key)
        table.add_row(
            key,
            f"{value:.4g}" if isinstance(value, float) else str(value),
            "" if target is None else str(target),
            "" if met is None else ("yes" if met else "NO"),
            " / ".join(f"{v:.4g}" for v in runs.get(key, [])),
        )
    console.print(table)
