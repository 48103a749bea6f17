"""``agentflow explore``: Phase 1, coverage-driven exploration into trajectory shards.

Register on the main app with ``app.command("explore")(explore_command)``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from agentflow_core.errors import AgentFlowError
from flows.cli.common import one_line, phase_config_or_exit, phase_progress

if TYPE_CHECKING:  # exploration imports torch: imported when the command runs, not when the CLI starts
    from agentflow_core.rl.exploration import ExploreProgress

console = Console()
err_console = Console(stderr=True, soft_wrap=True)


PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
CATALOGUE_OPTION = typer.Option(None, "--catalogue", help="Variant catalogue dir (default <data_dir>/variants).")
OUT_OPTION = typer.Option(None, "--out", help="Trajectory dataset dir (default <data_dir>/trajectories).")
METRICS_OPTION = typer.Option(None, "--metrics", help="Metrics JSON (default <data_dir>/metrics/explore.json).")
STEPS_OPTION = typer.Option(None, "--total-steps", min=1, help="Override explore.total_steps.")


def explore_command(
    params: Path = PARAMS_OPTION,
    catalogue: Path | None = CATALOGUE_OPTION,
    out: Path | None = OUT_OPTION,
    metrics: Path | None = METRICS_OPTION,
    total_steps: int | None = STEPS_OPTION,
) -> None:
    """Explore the catalogue ε-greedily around the current policy (or the expert), ε driven by coverage; write trajectory shards.

    Exits 1 after writing them when state_coverage_ratio stays below explore.min_state_coverage.
    """
    from tasks.context import PhaseContext
    from tasks.steps.explore import run_explore

    cfg = phase_config_or_exit(params)
    if total_steps is not None:
        cfg = cfg.model_copy(update={"explore": cfg.explore.model_copy(update={"total_steps": total_steps})})
    ctx = PhaseContext.of(cfg)
    catalogue = catalogue or ctx.paths.variants
    out = out or ctx.paths.trajectories
    metrics = metrics or ctx.paths.metrics_file("explore")
    with phase_progress("explore", console) as progress:
        task = progress.add_task("explore", total=cfg.explore.total_steps, status="")

        def on_progress(p: ExploreProgress) -> None:
            progress.update(
                task,
                completed=min(p.steps, p.total_steps),
                status=f"coverage {p.state_coverage_ratio:.3f} (tokens {p.token_coverage:.2f}, edges "
                f"{p.edge_coverage:.2f}) ε {p.epsilon:.2f} goals {p.goal_episodes}/{p.episodes}",
            )

        try:
            summary = run_explore(ctx, catalogue, out, metrics, on_progress=on_progress)
        except AgentFlowError as exc:
            err_console.print(f"[bold red]explore failed[/]: {one_line(exc)}")
            raise typer.Exit(code=1) from None
    console.print(
        f"state_coverage_ratio [bold]{summary['state_coverage_ratio']:.3f}[/] "
        f"(token {summary['token_coverage']:.3f}, edge {summary['edge_coverage']:.3f}); "
        f"{summary['rows']} rows in {summary['shards']} shard(s) -> {out}; "
        f"{int(summary['goal_episodes'])} goal episodes of {int(summary['explore_episodes'])}; "
        f"{int(summary['remediation_steps'])} remediation steps"
    )
    if not summary["passed"]:
        # the shards and the card are written: a failed gate keeps every output, and the stage exits 1
        err_console.print(f"[bold red]gate failed[/]: {escape(str(summary['message']))}")
        raise typer.Exit(code=1)
    console.print(f"[green]{escape(str(summary['gate']))}[/]")
