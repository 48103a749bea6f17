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

from agentflow_core.atomic import write_json
from flows.cli.bench_common import (
    BENCH_DIR,
    REFERENCE_PARAMS,
    REFERENCE_PARAMS_OPTION,
    REPEAT_OPTION,
    bench_app,
    console,
    print_targets,
    publish,
)
from flows.cli.bench_policy import forgetting, learning, offline, transfer, validator
from flows.cli.common import config_or_exit

__all__ = ["bench_app", "forgetting", "learning", "offline", "transfer", "validator"]


@bench_app.command("pool")
def pool(
    params: Path = REFERENCE_PARAMS_OPTION,
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
    params: Path = REFERENCE_PARAMS_OPTION,
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


@bench_app.command("sql")
def sql(
    params: Path = REFERENCE_PARAMS_OPTION,
    episodes: int = typer.Option(200, "--episodes", min=10, help="Expert episodes per database."),
) -> None:
    """SQL channel: reset/step latency on SQLite vs an embedded PostgreSQL server, the same episodes."""
    from benchmarks.sql_bench import ENV_ID, run_sql_bench
    from tasks.registry_io import load_registry

    entry = load_registry(config_or_exit(params)).get(ENV_ID)
    publish("sql", run_sql_bench(entry, episodes))


@bench_app.command("browser")
def browser(
    params: Path = REFERENCE_PARAMS_OPTION,
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
    policy = load_policy(resolve_checkpoint(ctx, checkpoint), ctx.process)
    result = run_browser_bench(
        ctx, sim, real, policy, episodes=episodes, live_envs=live_envs, gap_episodes=gap_episodes
    )
    publish("browser", result)


@bench_app.command("oscar")
def oscar(
    params: Path = REFERENCE_PARAMS_OPTION,
    episodes: int = typer.Option(10, "--episodes", min=1, help="Expert episodes on the live store."),
) -> None:
    """The django-oscar store in Chromium: step and reset latency of the checkout expert (targets 150 ms / 1 s)."""
    from benchmarks.browser_bench import run_oscar_bench

    cfg = config_or_exit(params)
    publish("oscar", run_oscar_bench(Path(cfg.stress.sim_to_real.oscar_env_config_dir), episodes))


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
    params_option: Path | None = typer.Option(
        None,
        "--params",
        "-p",
        help="One run configuration for every benchmark [default: params.yaml for the learning benchmark, "
        "the reference workload params-checkout.yaml for the others].",
    ),
    repeat: int = REPEAT_OPTION,
    quick: bool = typer.Option(
        False, "--quick", help="Every benchmark at its smallest size (a smoke run, not for BENCHMARKS.md)."
    ),
) -> None:
    """Every benchmark, then BENCHMARKS.md."""
    shipped = params_option or Path("params.yaml")
    params = params_option or REFERENCE_PARAMS
    if quick:  # the sizes the smoke suite runs each benchmark at (tests/test_smoke_commands.py)
        scheduler(n_variants=50, draws=2000, seed=0)
        learning(shipped, steps=1024, eval_every_updates=1, test_episodes=8, out=None)
        train(params, total_steps=1024, repeat=repeat, quick=True)
        ppo(quick=True, repeat=repeat)
        pool(params, num_envs=8, steps=5, all_live=False, repeat=repeat)
        sql(params, episodes=10)
        browser(params, episodes=1, live_envs=1, gap_episodes=1, checkpoint="expert")
        oscar(params, episodes=1)
        onboarding(repeats=1, seeds=1)
        return
    scheduler(n_variants=1000, draws=100_000, seed=0)
    learning(shipped, steps=None, eval_every_updates=4, test_episodes=None, out=None)
    train(params, total_steps=None, repeat=repeat, quick=False)
    ppo(quick=False, repeat=repeat)
    pool(params, num_envs=300, steps=30, all_live=True, repeat=repeat)
    sql(params, episodes=200)
    browser(params, episodes=20, live_envs=16, gap_episodes=32, checkpoint=_trained_or_expert(params))
    oscar(params, episodes=10)
    onboarding(repeats=5, seeds=2)


@bench_app.command("tune")
def tune(
    params: Path = REFERENCE_PARAMS_OPTION,
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
    params: Path = REFERENCE_PARAMS_OPTION,
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
