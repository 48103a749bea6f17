"""The ``agentflow`` command line. Only commands that work are registered here.

Configuration errors exit with code 2 and one message naming the file, key, value and
expectation, before anything is created or written.
"""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.tree import Tree

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import AgentFlowError, ConfigError, MappingError, RegistryError, RequirementError
from flows.cli.bench import bench_app
from flows.cli.calibrate import calibrate_command
from flows.cli.common import PARAMS_OPTION, config_or_exit, exit_on_unmet, one_line, os_error_line, requirements_or_exit
from flows.cli.envs import envs_app
from flows.cli.explore import explore_command
from flows.cli.offline import export_minari_command, offline_command
from flows.cli.pool import profile_envs_cmd
from flows.cli.process import process_app
from flows.cli.stress import report_command, stress_command
from flows.cli.train import train_command
from flows.cli.tune import tune_command
from flows.cli.validator import validator_command
from flows.cli.variants import variants
from flows.reproduce import reproduce_command
from tasks.preflight import Check, preflight

app = typer.Typer(
    help="AgentFlow: train one decision policy across web, SQL and HTTP channels.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _ppo_start(cfg: AgentFlowConfig) -> str:
    """Where PPO starts: the offline stage's actor (BC alone without the stage) or, by default, a fresh network."""
    if not cfg.train.bc_warm_start:
        return "a fresh network"
    return "the offline actor" if cfg.offline.enabled else "the BC actor"


def _offline_plan(cfg: AgentFlowConfig) -> str:
    """The offline stage's line of the plan: what it trains, and what PPO does with it."""
    o = cfg.offline
    if not o.enabled:
        return "offline: switched off (offline.enabled: false)"
    use = (
        f"PPO's KL to it {o.kl_coef:g} -> 0 over {o.kl_decay_updates} updates"
        if cfg.train.bc_warm_start
        else "a reference on the test split (train.bc_warm_start: false)"
    )
    return f"offline: CQL {o.gradient_steps} steps on the dataset, actor improved by Q (pi_BC * exp(Q/T)); {use}"


def plan_tree(cfg: AgentFlowConfig) -> Tree:
    """The planned training cycle, phase by phase, with exactly the gates the cycle enforces."""
    from agentflow_core.gates import declared_gates

    gates = {g.phase: g for g in declared_gates(cfg)}
    tree = Tree(f"[bold]AgentFlow cycle[/] run={escape(cfg.base.run_name)} seed={cfg.base.seed}")
    v = cfg.variants
    n_combos = len(v.base_envs)
    for values in v.dimensions.values():
        n_combos *= len(values)
    plans = {
        "calibrate": f"calibrate: {cfg.calibrate.variants_per_family}+ variants/family (every dimension value) x "
        f"{cfg.calibrate.resets} resets",
        "variants": f"variants: {n_combos} combinations x {v.samples_per_combination} samples = "
        f"{n_combos * v.samples_per_combination} variants, less the quarantined; budget {v.budget_s:g} s",
        "explore": f"explore: {cfg.explore.total_steps} steps on {cfg.explore.num_envs} envs "
        f"(eps {cfg.explore.epsilon_high}->{cfg.explore.epsilon_low})",
        "offline": _offline_plan(cfg),
        "train": f"train: PPO up to {cfg.train.total_steps} steps from {_ppo_start(cfg)}, clip {cfg.train.clip_range}, "
        f"target KL {cfg.train.target_kl}",
        "stress": f"stress: {cfg.stress.episodes} episodes, consistency over {cfg.stress.consistency_variants} variants",
        "report": f"report: {', '.join(cfg.report.formats)}; champion/challenger on {cfg.report.champion_slice:.0%} "
        f"slice; budget {cfg.report.budget_s:g} s",
    }
    for phase in cfg.phases:
        node = tree.add(escape(plans[phase]))
        if phase in gates:
            node.add(escape(f"gate: {gates[phase].describe()}"))
    return tree


@app.callback()
def _root() -> None:
    """AgentFlow: calibrate -> variants -> explore -> offline -> validator -> tune -> train -> stress -> report."""


def requirements_node(tree: Tree, checks: list[Check]) -> Tree:
    """The external requirements under the plan: each met one ticked, each unmet one with what to do."""
    node = tree.add("requirements (outside Python)")
    for check in checks:
        if check.problem is None:
            node.add(f"[green]ok[/] {escape(check.requirement)}")
        else:
            node.add(f"[bold red]missing[/] {escape(check.problem)}")
    return tree


@app.command()
def validate(params: Path = PARAMS_OPTION) -> None:
    """Validate params.yaml, check the cycle's external requirements, print the planned cycle and its gates."""
    cfg = config_or_exit(params)
    checks = preflight(cfg)
    console.print(requirements_node(plan_tree(cfg), checks))
    exit_on_unmet(checks)
    console.print(f"[green]{escape(str(params))} is valid[/]")


SET_OPTION = typer.Option(
    [],
    "--set",
    metavar="KEY=VALUE",
    help="Override a params.yaml key for this cycle, e.g. train.total_steps=4096 (repeatable).",
)
RETRAIN_HELP = "Warm-start from the champion with a fresh seed, explore what it fails first, append to the dataset."


@app.command()
def run(
    params: Path = PARAMS_OPTION,
    resume: bool = typer.Option(False, "--resume", help="Continue PPO from the last checkpoint."),
    run_name: str | None = typer.Option(None, "--run-name", help="MLflow parent run name."),
    retrain: bool = typer.Option(False, "--retrain", help=RETRAIN_HELP),
    sets: list[str] = SET_OPTION,
) -> None:
    """Run the whole training cycle as a Prefect flow (calibrate -> variants -> explore -> offline -> train -> stress -> report)."""
    from tasks.backend import backend_of
    from tasks.runtime import configure_services

    cfg, overrides = overrides_or_exit(params, sets)
    requirements_or_exit(cfg)  # a missing browser, database binary, service or folder stops here, in seconds
    services = configure_services(cfg)  # before prefect/mlflow are imported (and before Ray's processes start)
    pool = backend_of(cfg).place()  # joins a Ray cluster first: an unreachable one fails before anything is written
    console.print(plan_tree(cfg))
    console.print(f"  envs: {pool.describe(cfg.train.num_envs)}")
    for name, where in services.items():
        console.print(f"  {name}: {escape(str(where))}")
    from flows.training_cycle import training_cycle
    from tasks.prefect_tasks import GateFailed

    try:
        results = training_cycle(
            params_path=str(params), resume=resume, run_name=run_name, overrides=overrides or None, retrain=retrain
        )
    except GateFailed as exc:
        err_console.print(f"[bold red]{one_line(exc)}[/]")
        err_console.print("nothing promoted; every output written so far is kept")
        raise typer.Exit(code=1) from None
    print_report_tree(cfg)
    console.print(where_to_look(cfg, results))


def print_report_tree(cfg: AgentFlowConfig) -> None:
    """The evaluation report's tree, as the run's last word on the policy."""
    import json

    from agentflow_core.evaluation.report import report_tree, tree_text
    from tasks.paths import DataPaths

    path = DataPaths.of(cfg).reports / "report.json"
    if path.exists():
        console.print("\n".join(tree_text(report_tree(json.loads(path.read_text())))), highlight=False)


def where_to_look(cfg: AgentFlowConfig, results: dict) -> Tree:
    """The end-of-run pointer list: report, Prefect UI (of this run's state dir or server), MLflow UI."""
    import os

    from tasks.paths import DataPaths
    from tasks.runtime import mlflow_uri, state_dir

    tree = Tree("[bold green]cycle finished[/]")
    tree.add(escape(f"report: {DataPaths.of(cfg).reports}/report.md (also .html, .json)"))
    tree.add(escape(f"MLflow run {results.get('mlflow_run_id')}: mlflow ui --backend-store-uri {mlflow_uri(cfg)}"))
    server = os.environ.get("PREFECT_API_URL")
    prefect_home = os.environ.get("PREFECT_HOME") or str(state_dir(cfg) / "prefect")
    where = (
        f"server {server}" if server else f"PREFECT_HOME={prefect_home} prefect server start  -> http://127.0.0.1:4200"
    )
    tree.add(escape(f"Prefect runs ({cfg.process}-{results.get('run_name') or cfg.base.run_name}): {where}"))
    report = results.get("report", {})
    if "verdict" in report:
        tree.add(escape(f"verdict: {report['verdict']} — {report['verdict_reason']}"))
    train = results.get("train", {})
    if "stop_reason" in train:
        tree.add(escape(f"training stopped on {train['stop_reason']} after {train['global_step']} env steps"))
    if "test_process_success" in train and "test_process_success_rules" in train:
        from tasks.steps.evaluation import value_line  # the evaluation stack: only once a run is done

        value = value_line(train)  # policy vs rules vs oracle, where the process prices episodes
        tree.add(
            escape(
                f"test split: process success {train['test_process_success']:.3f} vs the rules' "
                f"{train['test_process_success_rules']:.3f}" + (f"; {value}" if value else "")
            )
        )
    if "cycle_report" in report:
        tree.add(escape(f"this cycle's report and decision: {report['cycle_report']} (newest cycle: reports/latest)"))
    if "retrain" in results:
        tree.add(escape(f"retrain: cycle seed {results['retrain']['cycle_seed']}, plan {results['retrain']['plan']}"))
    if "promotion_reason" in report:
        tree.add(escape(f"champion/challenger: {report['promotion_reason']}"))
    return tree


def overrides_or_exit(params: Path, sets: list[str]) -> tuple[AgentFlowConfig, dict[str, object]]:
    """params.yaml with the ``--set`` overrides applied and validated, or exit 2 naming the key."""
    from tasks.overrides import overridden_config, parse_set

    cfg = config_or_exit(params)
    try:
        overrides = parse_set(sets)
        return (overridden_config(params, overrides)[0] if overrides else cfg), overrides
    except ConfigError as exc:
        err_console.print(f"[bold red]configuration error[/]: {one_line(exc)}")
        raise typer.Exit(code=2) from None


def cycle_parameters(params: Path, retrain: bool, overrides: dict[str, object]) -> dict[str, object]:
    """A deployment's default flow parameters (every one can be changed per run from the UI or the API)."""
    return {"params_path": str(params.resolve()), "retrain": retrain, "overrides": overrides}


@app.command()
def deploy(
    params: Path = PARAMS_OPTION,
    pool: str = typer.Option("agentflow", "--pool", help="Prefect process work pool (created if missing)."),
    name: str = typer.Option("agentflow-cycle", "--name", help="Deployment name."),
    cron: str | None = typer.Option(
        None, "--cron", help="Schedule of recurring cycles (cron syntax); none by default."
    ),
    retrain: bool = typer.Option(True, "--retrain/--no-retrain", help="Default of the runs' retrain parameter."),
    sets: list[str] = SET_OPTION,
) -> None:
    """Register the cycle as a deployment on a Prefect process work pool; `prefect worker start --pool` runs it."""
    from tasks.runtime import configure_services

    _, overrides = overrides_or_exit(params, sets)
    if "PREFECT_API_URL" not in os.environ and not config_or_exit(params).base.tracking.prefect_api_url:
        err_console.print(
            "[bold red]error[/]: a work-pool deployment needs a Prefect server: start one "
            "(`prefect server start`) and export PREFECT_API_URL=http://127.0.0.1:4200/api"
        )
        raise typer.Exit(code=2)
    configure_services(config_or_exit(params))
    from tasks.deploy import deploy_cycle

    deployment_id = deploy_cycle(name, pool, cycle_parameters(params, retrain, overrides), cron=cron)
    console.print(f"deployment agentflow-training-cycle/{escape(name)} ({deployment_id}) on work pool {escape(pool)}")
    console.print(
        f"  run it: prefect worker start --pool {escape(pool)}   (then UI -> Deployments -> Run, or the schedule)"
    )


@app.command()
def serve(
    params: Path = PARAMS_OPTION,
    cron: str = typer.Option("0 3 * * *", "--cron", help="Schedule of recurring retrains (cron syntax)."),
    name: str = typer.Option("agentflow-cycle", "--name", help="Deployment name."),
    retrain: bool = typer.Option(True, "--retrain/--no-retrain", help="Default of the runs' retrain parameter."),
    sets: list[str] = SET_OPTION,
) -> None:
    """Serve the training cycle as a scheduled Prefect deployment (trigger it from the Prefect UI)."""
    from tasks.runtime import configure_services

    cfg, overrides = overrides_or_exit(params, sets)
    configure_services(cfg)
    if "PREFECT_API_URL" not in os.environ:
        err_console.print(
            "[yellow]note[/]: no PREFECT_API_URL: serving against Prefect's ephemeral API, which cannot "
            "run schedules. Start a server (`prefect server start`) and export "
            "PREFECT_API_URL=http://127.0.0.1:4200/api for the cron schedule and the UI."
        )
    from flows.training_cycle import training_cycle

    training_cycle.serve(
        name=name,
        cron=cron,
        parameters=cycle_parameters(params, retrain, overrides),
        description="AgentFlow training cycle: calibrate -> variants -> explore -> offline -> train -> stress -> report",
    )


app.command("calibrate")(calibrate_command)
app.command("variants")(variants)
app.command("explore")(explore_command)
app.command("offline")(offline_command)
app.command("export-minari")(export_minari_command)
app.command("validator")(validator_command)
app.command("tune")(tune_command)
app.command("train")(train_command)
app.command("stress")(stress_command)
app.command("report")(report_command)
app.command("reproduce")(reproduce_command)
app.command("profile-envs")(profile_envs_cmd)
app.add_typer(envs_app, name="envs")
app.add_typer(bench_app, name="bench")
app.add_typer(process_app, name="process")


def main() -> None:
    """Console entry point with library errors turned into clean messages."""
    from tasks.ray_runtime import stop_ray

    try:
        app(prog_name="agentflow")
    except AgentFlowError as exc:
        err_console.print(f"[bold red]error[/]: {one_line(exc)}")
        sys.exit(2 if isinstance(exc, ConfigError | RegistryError | MappingError | RequirementError) else 1)
    except OSError as exc:  # disk full, read-only folder, permission: one line naming the path and errno
        err_console.print(f"[bold red]I/O error[/]: {os_error_line(exc)}")
        sys.exit(2)
    except (MemoryError, RecursionError) as exc:
        err_console.print(f"[bold red]error[/]: input too large or too deeply nested to process ({type(exc).__name__})")
        sys.exit(2)
    finally:
        stop_ray()
        # The interpreter's exit collects every object the command imported (torch, MLflow, Prefect,
        # matplotlib: about 2.5 s here) only to free memory the OS frees anyway; frozen, it skips them.
        # Files, runs and checkpoints are closed explicitly before this point.
        gc.freeze()
