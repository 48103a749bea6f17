"""``agentflow tune`` (the impedance-matching probe before train) and ``agentflow bench tune``.

Register on the main app with ``app.command("tune")(tune_command)``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape

from agentflow_core.atomic import write_json
from agentflow_core.errors import AgentFlowError
from flows.cli.common import one_line, phase_config_or_exit
from tasks.paths import DataPaths

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

    cfg = phase_config_or_exit(params)
    paths = DataPaths.of(cfg)
    try:
        summary = run_tune(
            cfg,
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


def bench_tune(
    params: Path, out_dir: Path, total_steps: int, cluster_cpus: int, cluster_workers: int, rounds: int = 1
) -> dict[str, Any]:
    """Run the tune benchmark; write ``tune.json`` under ``out_dir``."""
    import tempfile

    from tasks.bench.tune_bench import run_tune_bench

    with tempfile.TemporaryDirectory(prefix="agentflow-bench-tune-") as work:
        result = run_tune_bench(
            params, Path(work), total_steps, cluster_cpus, cluster_workers, rounds, log=console.print
        )
    write_json(out_dir / "tune.json", result)
    return result


def print_bench(result: dict[str, Any], out_dir: Path) -> None:
    """The headline figures of ``tune.json``."""
    keys = [k for k in result if k.startswith("sps_ratio") or k.endswith(("env_steps_per_s", "_passed", "_success"))]
    console.print(json.dumps({k: result[k] for k in keys}, indent=1, default=str))
    console.print(f"-> {out_dir / 'tune.json'}")
