"""``agentflow bench …``: benchmarks measured side by side in one run, as ratios.

Each benchmark writes ``data/bench/<name>.json``; after every run ``BENCHMARKS.md`` is rendered
from all JSON files present, with the command that produced each table (:mod:`benchmarks.markdown`).
The benchmarks package is imported inside the commands only: the pipeline's commands load this
module with the CLI, and no DVC stage depends on the benchmarks.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from agentflow_core.atomic import write_json
from flows.cli.common import config_or_exit, phase_config_or_exit

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


@bench_app.command("pool")
def pool(
    params: Path = PARAMS_OPTION,
    num_envs: int = typer.Option(300, help="Slots for the Ray vs in-process comparison and the live-memory probe."),
    steps: int = typer.Option(30, help="Timed pool steps per side."),
    all_live: bool = typer.Option(True, help="Build all catalogue variants live at once (else extrapolate)."),
    repeat: int = REPEAT_OPTION,
) -> None:
    """Pool: semantic overhead, Ray speed-up, memory, scheduler ratios, worker-kill recovery.

    With ``--repeat`` > 1 the JSON holds the last run plus every run's target metrics (``runs``).
    The all-live probe (a 20-second, ~1 GB build of every variant) runs in the last run only.
    """
    import logging

    import ray

    from benchmarks.pool_bench import TARGETS, run_pool_bench
    from benchmarks.runs import run_repeated
    from flows.cli.pool import catalogue_and_factory, config_or_defaults
    from tasks.ray_runtime import start_ray

    logging.getLogger("agentflow.pool").setLevel(logging.ERROR)  # the recovery run kills a worker on purpose
    cfg = config_or_defaults(params)
    variants, factory = catalogue_and_factory(cfg)

    def run(i: int) -> dict[str, Any]:
        console.print(f"pool benchmark run {i + 1} of {repeat}")
        start_ray(cfg)
        try:
            return run_pool_bench(
                variants,
                factory,
                config=cfg.pool,
                num_envs=num_envs,
                steps=steps,
                measure_all_live=all_live and i == repeat - 1,
                seed=cfg.base.seed,
            )
        finally:
            if ray.is_initialized():
                ray.shutdown()

    result = run_repeated(run, repeat, TARGETS)
    write_json(BENCH_DIR / "pool.json", result)
    print_targets(result, "pool benchmark")
    console.print(f"wrote {BENCH_DIR / 'pool.json'}")
    publish("pool", show=False)


@bench_app.command("scheduler")
def scheduler(
    n_variants: int = typer.Option(1000), draws: int = typer.Option(100_000), seed: int = typer.Option(0)
) -> None:
    """Scheduler strategies: cold share, longest visit gap, draws to 90% success (synthetic learner)."""
    from benchmarks.scheduler_bench import run_scheduler_bench

    result = run_scheduler_bench(n_variants=n_variants, draws=draws, seed=seed)
    result["machine"] = platform.machine()
    publish("scheduler", result)


@bench_app.command("ppo")
def ppo(
    quick: bool = typer.Option(False, "--quick", help="Fewer repeats (a smoke run, not for BENCHMARKS.md)."),
    repeat: int = REPEAT_OPTION,
) -> None:
    """PPO: end-to-end throughput vs stable-baselines3 and update time (learning: `agentflow bench learning`).

    With ``--repeat`` > 1 the JSON holds the last run plus every run's target metrics (``runs``).
    """
    from benchmarks.ppo_bench import TARGETS, run_ppo_bench
    from benchmarks.runs import run_repeated

    kwargs: dict[str, Any] = {"sps_updates": 2, "repeats": 1, "update_repeats": 3} if quick else {}

    def run(i: int) -> dict[str, Any]:
        console.print(f"PPO benchmark run {i + 1} of {repeat}")
        return run_ppo_bench(**kwargs)

    publish("ppo", run_repeated(run, repeat, TARGETS), show=False)


@bench_app.command("train")
def train(
    params: Path = PARAMS_OPTION,
    total_steps: int | None = typer.Option(
        None, "--total-steps", min=1024, help="PPO steps per side [default: the params' train.total_steps]."
    ),
    repeat: int = REPEAT_OPTION,
    quick: bool = typer.Option(
        False, "--quick", help="One run per backend and the kill after update 2 (a smoke run, not for BENCHMARKS.md)."
    ),
) -> None:
    """`agentflow train` end to end with pool.backend ray vs inprocess (shipped params), plus a worker SIGKILL."""
    import tempfile

    from benchmarks.runs import run_repeated
    from benchmarks.train_bench import QUICK_KILL_AFTER_UPDATE, QUICK_SIDE_ORDER, TARGETS, run_train_bench

    cfg = config_or_exit(params)
    steps = total_steps if total_steps is not None else cfg.train.total_steps
    sizes: dict[str, Any] = {"rollout_steps": cfg.train.num_envs * cfg.train.n_steps}
    if quick:
        sizes.update(side_order=QUICK_SIDE_ORDER, kill_after_update=QUICK_KILL_AFTER_UPDATE)
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-train-") as tmp:
        result = run_repeated(lambda i: run_train_bench(params, Path(tmp) / f"run{i}", steps, **sizes), repeat, TARGETS)
    if quick:
        result["command_options"] = " --quick"
    publish("train", result)


@bench_app.command("learning")
def learning(
    params: Path = PARAMS_OPTION,
    steps: int | None = typer.Option(
        None, "--steps", min=1, help="Env steps per learner [default: the params' train.total_steps]."
    ),
    eval_every_updates: int = typer.Option(
        4, "--eval-every-updates", min=1, help="Rollouts between the checkpoints both learners are evaluated at."
    ),
    test_episodes: int | None = typer.Option(
        None, "--test-episodes", min=1, help="Test episodes per evaluation [default: as `agentflow train`'s final one]."
    ),
) -> None:
    """AgentFlow's training vs sb3-contrib MaskablePPO: same catalogue, settings, reward, test split, one run."""
    from benchmarks.learning_bench import run_learning_bench
    from tasks.context import PhaseContext
    from tasks.plots import plot_learning_bench

    cfg = phase_config_or_exit(params)
    if steps is not None:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"total_steps": steps})})
    result = run_learning_bench(
        PhaseContext.of(cfg),
        eval_every=eval_every_updates,
        test_episodes=test_episodes,
        progress=typer.echo,
    )
    result["plot"] = str(plot_learning_bench(result, BENCH_DIR / "learning.png"))
    publish("learning", result)


@bench_app.command("sql")
def sql(
    params: Path = PARAMS_OPTION,
    episodes: int = typer.Option(200, "--episodes", min=10, help="Expert episodes per database."),
) -> None:
    """SQL channel: reset/step latency on SQLite vs an embedded PostgreSQL server, the same episodes."""
    from benchmarks.sql_bench import ENV_ID, run_sql_bench
    from tasks.registry_io import load_registry

    entry = load_registry(config_or_exit(params)).get(ENV_ID)
    publish("sql", run_sql_bench(entry, episodes))


@bench_app.command("browser")
def browser(
    params: Path = PARAMS_OPTION,
    episodes: int = typer.Option(20, "--episodes", min=1, help="Expert episodes per side for the step latency."),
    live_envs: int = typer.Option(16, "--live-envs", min=1, help="Browser envs open at once for the memory figure."),
    gap_episodes: int = typer.Option(32, "--gap-episodes", min=1, help="Paired episodes per family (sim-to-real)."),
    checkpoint: str | None = typer.Option(
        None, "--checkpoint", help="Policy for the gap: a checkpoint, 'expert' [default: the best under data/]."
    ),
) -> None:
    """Browser channel: step latency p50/p95, live envs per GB, and the sim-to-real gap of a policy."""
    from benchmarks.browser_bench import run_browser_bench
    from tasks.context import PhaseContext
    from tasks.real_channels import BROWSER_ENV_ID
    from tasks.registry_io import load_registry
    from tasks.rollout import load_policy, resolve_checkpoint

    ctx = PhaseContext.of(config_or_exit(params))
    cfg = ctx.cfg
    sim = ctx.registry.get("web_checkout_v2")
    real = load_registry(config_dir=Path(cfg.stress.sim_to_real.env_config_dir)).get(BROWSER_ENV_ID)
    policy = load_policy(resolve_checkpoint(ctx, checkpoint))
    result = run_browser_bench(
        ctx, sim, real, policy, episodes=episodes, live_envs=live_envs, gap_episodes=gap_episodes
    )
    publish("browser", result)


@bench_app.command("offline")
def offline(
    params: Path = PARAMS_OPTION,
    steps: int = typer.Option(32768, "--steps", min=1, help="PPO env steps per learner at most."),
    settings: str = typer.Option(
        "",
        "--settings",
        help="Comma-separated BEHAVIOUR:STEPS exploration settings [default: the params' explore, then policy:STEPS].",
    ),
    eval_every_updates: int = typer.Option(2, "--eval-every-updates", min=1, help="Updates between test checkpoints."),
    test_episodes: int | None = typer.Option(None, "--test-episodes", min=1, help="Test episodes per checkpoint."),
) -> None:
    """PPO's starting test process success and env steps to the expert, after BC vs after BC + CQL."""
    import tempfile

    from benchmarks.offline_bench import HARDER_BEHAVIOUR, run_offline_bench
    from tasks.context import PhaseContext

    cfg = phase_config_or_exit(params)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"total_steps": steps})})
    parsed: list[tuple[str, int]] = []
    for item in (v.strip() for v in settings.split(",") if v.strip()):
        behaviour, _, count = item.partition(":")
        if behaviour not in ("expert", "policy") or not count.isdigit() or int(count) < 1:
            raise typer.BadParameter(f"--settings takes expert:N or policy:N items, got {item!r}")
        parsed.append((behaviour, int(count)))
    n = cfg.explore.total_steps
    parsed = parsed or [(cfg.explore.behaviour, n), (HARDER_BEHAVIOUR, n)]
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-offline-") as tmp:
        result = run_offline_bench(
            PhaseContext.of(cfg), Path(tmp), parsed, eval_every_updates, test_episodes, progress=typer.echo
        )
    publish("offline", result)


@bench_app.command("onboarding")
def onboarding(
    repeats: int = typer.Option(5, "--repeat", min=1, help="Spec-to-env runs (the p50 is reported)."),
    seeds: int = typer.Option(2, "--seeds", min=1, help="Expert episodes per scenario and channel."),
) -> None:
    """OpenAPI spec -> trainable env for the refund service (timed), and the refund expert on every refund channel."""
    from benchmarks.onboarding_bench import run_onboarding_bench

    publish("onboarding", run_onboarding_bench(repeats, seeds))


def _trained_or_expert(params: Path) -> str | None:
    """None (the best trained checkpoint under data/) when there is one, else the scripted expert.

    A clean clone has no trained policy until `agentflow run` (or `dvc pull`); the browser bench then
    measures the sim-to-real gap of the expert, and its JSON names the policy it played.
    """
    from agentflow_core.errors import AgentFlowError
    from tasks.context import PhaseContext
    from tasks.rollout import resolve_checkpoint

    try:
        resolve_checkpoint(PhaseContext.of(config_or_exit(params)), None)
    except AgentFlowError:
        typer.echo("bench browser: no trained checkpoint under data/, the sim-to-real gap is the scripted expert's")
        return "expert"
    return None


@bench_app.command("all")
def run_all(
    params: Path = PARAMS_OPTION,
    repeat: int = REPEAT_OPTION,
    quick: bool = typer.Option(
        False, "--quick", help="Every benchmark at its smallest size (a smoke run, not for BENCHMARKS.md)."
    ),
) -> None:
    """Every benchmark, then BENCHMARKS.md."""
    if quick:  # the sizes the smoke suite runs each benchmark at (tests/test_smoke_commands.py)
        scheduler(n_variants=50, draws=2000, seed=0)
        learning(params, steps=1024, eval_every_updates=1, test_episodes=8)
        train(params, total_steps=1024, repeat=repeat, quick=True)
        ppo(quick=True, repeat=repeat)
        pool(params, num_envs=8, steps=5, all_live=False, repeat=repeat)
        sql(params, episodes=10)
        browser(params, episodes=1, live_envs=1, gap_episodes=1, checkpoint="expert")
        onboarding(repeats=1, seeds=1)
        return
    scheduler(n_variants=1000, draws=100_000, seed=0)
    learning(params, steps=None, eval_every_updates=4, test_episodes=None)
    train(params, total_steps=None, repeat=repeat, quick=False)
    ppo(quick=False, repeat=repeat)
    pool(params, num_envs=300, steps=30, all_live=True, repeat=repeat)
    sql(params, episodes=200)
    browser(params, episodes=20, live_envs=16, gap_episodes=32, checkpoint=_trained_or_expert(params))
    onboarding(repeats=5, seeds=2)


@bench_app.command("tune")
def tune(
    params: Path = PARAMS_OPTION,
    total_steps: int | None = typer.Option(
        None, "--total-steps", min=1024, help="PPO steps per side [default: the params' train.total_steps]."
    ),
    cluster_cpus: int = typer.Option(
        8, "--cluster-cpus", min=1, help="Logical CPUs the simulated cluster's Ray advertises."
    ),
    cluster_workers: int = typer.Option(
        8, "--cluster-workers", min=1, help="Env workers of the cluster's static side."
    ),
    rounds: int = typer.Option(
        1, "--rounds", min=1, help="Run every side this many times, static and tuned alternating."
    ),
    cluster: bool = typer.Option(
        True, "--cluster/--no-cluster", help="Also the simulated larger cluster (--no-cluster: half the commands)."
    ),
) -> None:
    """`agentflow train` with the auto-tuner's choice vs the static settings: here, and on a simulated larger cluster."""
    import tempfile

    from benchmarks.tune_bench import run_tune_bench

    steps = total_steps if total_steps is not None else config_or_exit(params).train.total_steps
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-tune-") as work:
        result = run_tune_bench(
            params, Path(work), steps, cluster_cpus, cluster_workers, rounds, log=console.print, cluster=cluster
        )
    if not cluster:
        result["command_options"] = " --no-cluster"
    publish("tune", result, show=False)
    keys = [k for k in result if k.startswith("sps_ratio") or k.endswith(("env_steps_per_s", "_passed", "_success"))]
    console.print(json.dumps({k: result[k] for k in keys}, indent=1, default=str))
    console.print(f"-> {BENCH_DIR / 'tune.json'}")


@bench_app.command("soak")
def soak(
    params: Path = PARAMS_OPTION,
    seconds: float = typer.Option(45.0, min=1.0, help="Seconds each side (clean, faulty, clean, faulty, clean) steps."),
    num_envs: int = typer.Option(300, min=1, help="Live envs (pool slots)."),
    n_variants: int = typer.Option(300, min=8, help="Catalogue variants sampled for the soak."),
    share: float = typer.Option(0.01, min=0.0, max=0.2, help="Share of the variants faulty per fault kind."),
    step_timeout_s: float = typer.Option(0.25, min=0.01, help="pool.step_timeout_s for the soak."),
    step_patience_s: float | None = typer.Option(
        None,
        min=0.0,
        help="pool.step_patience_s for the soak (0: off, every pool step waits for its env steps) "
        "[default: the params' pool.step_patience_s].",
    ),
    patience_engages: str | None = typer.Option(
        None,
        help="pool.step_patience_engages, after_timeout or always [default: the params' pool.step_patience_engages].",
    ),
    isolation: str | None = typer.Option(
        None, help="pool.step_isolation, thread or process [default: the params' pool.step_isolation]."
    ),
    backend: str = typer.Option(
        "inprocess", help="pool.backend: inprocess (writes soak.json) or ray (writes soak_ray.json)."
    ),
) -> None:
    """Soak: the pool for a fixed time, clean vs 1% faulty variants of each kind (raise, sleep, spin, NaN)."""
    import logging

    from benchmarks.markdown import fmt
    from benchmarks.soak_bench import TARGETS, run_soak_bench
    from flows.cli.pool import catalogue_and_factory

    cfg = config_or_exit(params)
    logging.getLogger("agentflow.pool").setLevel(logging.ERROR)  # the faulty side fails on purpose
    if isolation not in (None, "thread", "process"):
        raise typer.BadParameter(f"--isolation must be thread or process, got {isolation!r}")
    if backend not in ("inprocess", "ray"):
        raise typer.BadParameter(f"--backend must be inprocess or ray, got {backend!r}")
    if patience_engages not in (None, "after_timeout", "always"):
        raise typer.BadParameter(f"--patience-engages must be after_timeout or always, got {patience_engages!r}")
    pool_cfg = cfg.pool.model_copy(
        update={
            "backend": backend,
            "step_isolation": isolation or cfg.pool.step_isolation,
            "step_timeout_s": step_timeout_s,
            "step_patience_s": cfg.pool.step_patience_s if step_patience_s is None else step_patience_s or None,
            "step_patience_engages": patience_engages or cfg.pool.step_patience_engages,
        }
    )
    variants, factory = catalogue_and_factory(cfg)
    app = cfg.model_copy(update={"pool": pool_cfg})
    result = run_soak_bench(list(variants), factory, app, num_envs, n_variants, seconds, share, seed=cfg.base.seed)
    write_json(BENCH_DIR / ("soak_ray.json" if backend == "ray" else "soak.json"), result)
    keys = ("clean_env_steps_per_s", "faulty_env_steps_per_s", "throughput_ratio", "extra_healthy_episodes_lost")
    for key in keys:
        target = TARGETS.get(key)
        met = result["met"].get(key)
        typer.echo(f"{key}: {fmt(result[key])}" + ("" if target is None else f" (target {target}, met: {met})"))
    for name, side in result["runs"].items():
        typer.echo(
            f"{name}: {side['env_steps_per_s']:,.0f} env-steps/s, {side['failures'] or 'no'} episodes lost, "
            f"slowest pool step {side['slowest_pool_step_s']:.2f} s"
        )
    publish("soak_ray" if backend == "ray" else "soak", show=False)


@bench_app.command("validator")
def validator(
    params: Path = PARAMS_OPTION,
    episodes: int = typer.Option(200, min=8, help="Episodes per honest policy and per planted behaviour."),
    train_steps: int | None = typer.Option(
        None,
        "--train-steps",
        min=0,
        help="PPO steps of the honest trained policy [default: train.total_steps; 0: none].",
    ),
) -> None:
    """Train the validator as the cycle does, then score honest and planted reward-hacking episodes."""
    from benchmarks.validator_bench import run_validator_bench_fresh

    cfg = phase_config_or_exit(params)
    result = run_validator_bench_fresh(cfg, episodes, train_steps, progress=typer.echo)
    result["episodes_per_policy"] = episodes
    result["train_steps"] = cfg.train.total_steps if train_steps is None else train_steps
    result["notes"] = [
        f"threshold {result['threshold']:g}; per behaviour: "
        + ", ".join(
            f"{k} {v['caught_rate'] if v['caught_rate'] is None else round(v['caught_rate'], 3)} "
            f"({v['habit_fired']}/{v['played']} fired)"
            for k, v in result["per_behaviour"].items()
        ),
        "honest: "
        + ", ".join(f"{k} FPR {v['false_positive_rate']:.3f} of {v['episodes']}" for k, v in result["honest"].items()),
        f"measured on {platform.node() or 'this machine'} (shared machine: timings are noisy, rates are not)",
    ]
    publish("validator", result)


@bench_app.command("forgetting")
def forgetting(
    params: Path = PARAMS_OPTION,
    steps: int | None = typer.Option(
        None, "--steps", min=1024, help="PPO steps of the champion and of each retrain [default: train.total_steps]."
    ),
    shift: str = typer.Option(
        "catalogue",
        "--shift",
        help="catalogue (dimensions + balances), family (SQL only) or recovery (no failures to recover from).",
    ),
) -> None:
    """Cycle A, a shifted catalogue B, retrains on B without and with EWC; forgetting on A's test variants."""
    from benchmarks.forgetting_bench import SHIFTS, run_forgetting_bench
    from benchmarks.machine import MachineLoad

    cfg = phase_config_or_exit(params)
    if shift not in SHIFTS:
        raise typer.BadParameter(f"--shift must be one of {sorted(SHIFTS)}")
    machine = MachineLoad()
    result = run_forgetting_bench(cfg, steps, progress=typer.echo, shift=shift)
    result["machine_load"] = machine.result()
    result["notes"] = [
        f"shift {result['shift_name']}: {result['shift']}",
        f"EWC lam {result['ewc_lam']:g} over {result['ewc_samples']} states of A's trajectories "
        f"(Fisher {result['fisher_s']:.1f} s); same retrain seed for both sides; {result['test_episodes']} test episodes",
        machine.note(),
    ]
    name = "forgetting" if shift == "catalogue" else f"forgetting_{shift}"
    publish(name, result)


@bench_app.command("transfer")
def transfer(
    params: Path = PARAMS_OPTION,
    steps: int | None = typer.Option(
        None,
        "--steps",
        min=1024,
        help="PPO steps of each training (all channels, and each leave-one-out) [default: 40960].",
    ),
) -> None:
    """Leave one channel out: train on the others, play greedily on its test split, next to the rules."""
    from benchmarks.machine import MachineLoad
    from benchmarks.markdown import TITLES
    from benchmarks.transfer_bench import run_transfer_bench, transfer_notes

    cfg = phase_config_or_exit(params)
    machine = MachineLoad()
    result = run_transfer_bench(cfg, steps, progress=typer.echo)
    result["machine_load"] = machine.result()
    result["notes"] = [*transfer_notes(result), machine.note()]
    result["command_options"] = f" --steps {result['total_steps_cap']}"
    name = "transfer" if result["process"] == "checkout" else f"transfer_{result['process']}"
    if name not in TITLES:
        raise typer.BadParameter(f"no BENCHMARKS.md section for process {result['process']!r}")
    publish(name, result)
