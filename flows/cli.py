"""The ``agentflow`` command line. Only commands that work are registered here.

Configuration errors exit with code 2 and one message naming the file, key, value and
expectation, before anything is created or written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.tree import Tree

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import AgentFlowError, ConfigError
from tasks.cli_calibrate import calibrate_command
from tasks.cli_envs import envs_app
from tasks.cli_explore import explore_command
from tasks.cli_variants import variants
from tasks.config_io import load_config

app = typer.Typer(help="AgentFlow: train one decision policy across web, SQL and HTTP channels.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")


def load_or_exit(path: Path) -> AgentFlowConfig:
    """Load params.yaml or exit 2 with the error's file/key/value/expectation."""
    try:
        return load_config(path)
    except ConfigError as exc:
        err_console.print(f"[bold red]configuration error[/]: {exc}")
        raise typer.Exit(code=2) from None


def plan_tree(cfg: AgentFlowConfig) -> Tree:
    """The planned training cycle, phase by phase, with each phase's exit gate."""
    tree = Tree(f"[bold]AgentFlow cycle[/] run={cfg.base.run_name} seed={cfg.base.seed}")
    v = cfg.variants
    n_combos = len(v.base_envs)
    for values in v.dimensions.values():
        n_combos *= len(values)
    tree.add(f"calibrate: {cfg.calibrate.variants_per_family} variants/family x {cfg.calibrate.resets} resets; "
             f"gate: reward variance < {cfg.calibrate.max_reward_variance} (env_stability_score)")
    tree.add(f"variants: {n_combos} combinations x {v.samples_per_combination} samples = "
             f"{n_combos * v.samples_per_combination} variants")
    tree.add(f"explore: {cfg.explore.total_steps} steps on {cfg.explore.num_envs} envs; "
             f"gate: state_coverage_ratio (eps {cfg.explore.epsilon_high}->{cfg.explore.epsilon_low})")
    tree.add(f"train: PPO {cfg.train.total_steps} steps, clip {cfg.train.clip_range}, target KL {cfg.train.target_kl}; "
             "gate: policy_convergence_flag")
    tree.add(f"stress: {cfg.stress.episodes} episodes, consistency over {cfg.stress.consistency_variants} variants "
             f"(target {cfg.stress.consistency_target}); gate: robustness_score")
    tree.add(f"report: {', '.join(cfg.report.formats)}; champion/challenger on {cfg.report.champion_slice:.0%} slice")
    return tree


@app.callback()
def _root() -> None:
    """AgentFlow: calibrate -> variants -> explore -> train -> stress -> report."""


@app.command()
def validate(params: Path = PARAMS_OPTION) -> None:
    """Validate params.yaml and print the planned cycle."""
    cfg = load_or_exit(params)
    console.print(plan_tree(cfg))
    console.print("[green]params.yaml is valid[/]")


app.command("calibrate")(calibrate_command)
app.command("variants")(variants)
app.command("explore")(explore_command)
app.add_typer(envs_app, name="envs")


def main() -> None:
    """Console entry point with library errors turned into clean messages."""
    try:
        app()
    except AgentFlowError as exc:
        err_console.print(f"[bold red]error[/]: {exc}")
        sys.exit(2 if isinstance(exc, ConfigError) else 1)


if __name__ == "__main__":
    main()
