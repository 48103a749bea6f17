"""``agentflow validator``: train the discriminator reward validator on the exploration dataset.

Register on the main app with ``app.command("validator")(validator_command)``.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from agentflow_core.errors import AgentFlowError
from flows.cli.common import one_line, phase_context_or_exit

console = Console()
err_console = Console(stderr=True, soft_wrap=True)

PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")
TRAJ_OPTION = typer.Option(None, "--trajectories", help="Exploration dataset (default <data_dir>/trajectories).")
OUT_OPTION = typer.Option(None, "--out", help="Validator output dir (default <data_dir>/validator).")
METRICS_OPTION = typer.Option(None, "--metrics", help="Metrics JSON (default <data_dir>/metrics/validator.json).")


def validator_command(
    params: Path = PARAMS_OPTION,
    trajectories: Path | None = TRAJ_OPTION,
    out: Path | None = OUT_OPTION,
    metrics: Path | None = METRICS_OPTION,
) -> None:
    """Fit the discriminator (expert steps vs a policy's at the same states); train and stress use it.

    Exits 1 when its held-out accuracy is below validator.min_heldout_accuracy.
    """
    from tasks.steps.validator import run_validator

    ctx = phase_context_or_exit(params)
    metrics = metrics or ctx.paths.metrics_file("validator")
    try:
        summary = run_validator(ctx, trajectories, out, metrics)
    except AgentFlowError as exc:
        err_console.print(f"[bold red]validator failed[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    console.print(summary["gate"], markup=False)
    if not summary["passed"]:
        raise typer.Exit(code=1)
