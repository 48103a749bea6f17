"""``agentflow stress`` and ``agentflow report``: Phase 3 stress validation and the evaluation report.

Register on the main app with ``app.command("stress")(stress_command)`` and
``app.command("report")(report_command)``.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.tree import Tree

from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.report import TreeNode, build_report, report_tree
from flows.cli.common import one_line, phase_context_or_exit, requirements_or_exit

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

PARAMS = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
CHECKPOINT = typer.Option(
    None,
    "--checkpoint",
    "-c",
    help="Checkpoint dir, a checkpoint root (best.json), or 'expert' (default: best under <data_dir>/checkpoints).",
)

CATALOGUE = typer.Option(
    None, "--catalogue", help="Variant catalogue dir (default <data_dir>/variants; generated when absent)."
)
STRESS_OUT = typer.Option(None, "--out", help="Output dir (default <data_dir>/stress).")
EPISODES = typer.Option(None, "--episodes", min=1, help="Override stress.episodes.")
STRICT = typer.Option(False, "--strict", help="Exit 1 when the phase does not pass (crashes or low consistency).")
CHAMPION = typer.Option(
    None, "--champion", help="Also run champion/challenger against this checkpoint ('none': no champion yet)."
)
REPORT_OUT = typer.Option(None, "--out", help="Report dir (default <data_dir>/reports).")
REPORT_STRICT = typer.Option(
    False, "--strict", help="Exit 1 after writing the report when the stress gate failed (as the flow stops)."
)


def rich_tree(node: TreeNode, tree: Tree | None = None) -> Tree:
    """The report tree (``agentflow_core.evaluation.report.report_tree``) as a rich Tree."""
    tree = tree if tree is not None else Tree(f"[bold]{escape(node.label)}[/]")
    for child in node.children:
        rich_tree(child, tree.add(escape(child.label)))
    return tree


def stress_command(
    params: Path = PARAMS,
    checkpoint: str | None = CHECKPOINT,
    catalogue: Path | None = CATALOGUE,
    out: Path | None = STRESS_OUT,
    episodes: int | None = EPISODES,
    strict: bool = STRICT,
) -> None:
    """Run E greedy episodes on a stratified catalogue sample; write records, summary, plots and metrics."""
    from tasks.steps.stress import run_stress

    ctx = phase_context_or_exit(params)
    cfg = ctx.cfg
    requirements_or_exit(cfg)  # the real channels of the sim-to-real check: refused in seconds, not after the episodes
    with Progress(
        TextColumn("[bold]stress"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as progress:
        task = progress.add_task("stress", total=episodes or cfg.stress.episodes)
        try:
            summary = run_stress(
                ctx,
                checkpoint,
                catalogue,
                out,
                episodes=episodes,
                on_progress=lambda done, total: progress.update(task, completed=done),
            )
        except AgentFlowError as exc:
            err_console.print(f"[bold red]stress failed[/]: {one_line(exc)}")
            raise typer.Exit(code=1) from None
    report = build_report(
        summary, summary["policy"], summary["checkpoint"], summary["created_at"], summary.get("plots")
    )
    console.print(rich_tree(report_tree(report)))
    m = summary["metrics"]
    console.print(
        f"robustness_score [bold]{m['robustness_score']:.3f}[/], consistency {m['consistency']:.3f} "
        f"(random policy {m['consistency_random']:.3f}), "
        f"process success {m['success_rate']:.3f}, goal success ({summary.get('goal')}) "
        f"{m['goal_success_rate']:.3f}, "
        f"crash episodes {m['crash_episodes']} -> {out or Path(cfg.base.data_dir) / 'stress'}"
    )
    if strict and not summary["passed"]:
        err_console.print(f"[bold red]{escape(str(summary['gate']))}[/]")
        raise typer.Exit(code=1)


def report_command(
    params: Path = PARAMS,
    checkpoint: str | None = CHECKPOINT,
    champion: str | None = CHAMPION,
    out: Path | None = REPORT_OUT,
    strict: bool = REPORT_STRICT,
) -> None:
    """Write the evaluation report (md/html/json + PNGs), running the stress phase first if needed."""
    from tasks.rollout import resolve_checkpoint
    from tasks.steps.report import load_stress_summary, run_champion_challenger, run_report
    from tasks.steps.stress import run_stress

    ctx = phase_context_or_exit(params)
    cfg = ctx.cfg
    try:
        ref = resolve_checkpoint(ctx, checkpoint)
        stress_summary = load_stress_summary(ctx.paths.stress)
        if stress_summary is None or stress_summary.get("checkpoint") != ref:
            run_stress(ctx, ref)
        decision = None
        if champion is not None:
            decision = run_champion_challenger(
                ctx, checkpoint or ctx.paths.checkpoints, None if champion == "none" else champion
            )
        summary = run_report(ctx, checkpoint, out_dir=out, champion=decision)
    except AgentFlowError as exc:
        err_console.print(f"[bold red]report failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    report = (
        json.loads((Path(summary["report_dir"]) / "report.json").read_text()) if "json" in cfg.report.formats else None
    )
    if report is not None:
        console.print(rich_tree(report_tree(report)))
    else:
        console.print(summary["tree"])
    console.print(escape(f"report -> {summary['report_dir']}: {', '.join(summary['files'])}"))
    if strict and not summary["passed"]:
        err_console.print(
            f"[bold red]{escape(str(summary['gate']))}[/] (the report says why: {escape(summary['report_dir'])})"
        )
        raise typer.Exit(code=1)
