"""``agentflow bench …``: benchmarks measured side by side in one run, as ratios.

Each benchmark writes ``data/bench/<name>.json``; after every run ``BENCHMARKS.md`` is rendered
from all JSON files present, with the command that produced each table.
"""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import typer

from agentflow_core.atomic import write_json
from flows.cli.common import config_or_exit, phase_config_or_exit

bench_app = typer.Typer(
    help="Benchmarks (results in BENCHMARKS.md and data/bench/*.json).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
BENCH_DIR = Path("data/bench")
# One-off measurements whose code is gone (e.g. a removed fast path measured against its replacement):
# kept verbatim after the generated tables so regenerating BENCHMARKS.md does not drop them.
MEASUREMENTS_DIR = Path("docs/measurements")
BENCHMARKS_MD = Path("BENCHMARKS.md")
# agentflow bench forgetting --shift catalogue / family / recovery
FORGETTING = ("forgetting", "forgetting_family", "forgetting_recovery")
REPEAT_OPTION = typer.Option(
    1, "--repeat", min=1, help="Run the benchmark this many times; a target is met only if every run meets it."
)
PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")

COMMANDS = {
    "pool": "agentflow bench pool",
    "ppo": "agentflow bench ppo",
    "scheduler": "agentflow bench scheduler",
    "train": "agentflow bench train",
    "learning": "agentflow bench learning",
    "sql": "agentflow bench sql",
    "soak": "agentflow bench soak",
    "soak_ray": "agentflow bench soak --backend ray",
    "browser": "agentflow bench browser",
    "offline": "agentflow bench offline",
    "validator": "agentflow bench validator",
    "forgetting": "agentflow bench forgetting",
    "forgetting_family": "agentflow bench forgetting",
    "forgetting_recovery": "agentflow bench forgetting",
    "tune": "agentflow bench tune",
    "onboarding": "agentflow bench onboarding",
    "transfer": "agentflow bench transfer",
    "transfer_refund": "agentflow bench transfer --params params-refund.yaml",
}
TITLES = {
    "pool": "Env pool: semantic overhead, Ray speed-up, memory, scheduler, recovery",
    "ppo": "PPO: throughput vs stable-baselines3, update time",
    "scheduler": "Scheduler strategies on a synthetic learner (1,000 variants, 100k draws)",
    "train": "End-to-end `agentflow train` on the Ray vs in-process backend, and a worker SIGKILL mid-train",
    "learning": "Learning: AgentFlow vs sb3-contrib MaskablePPO, same catalogue, settings, reward and test split",
    "sql": "SQL channel: SQLite vs a real PostgreSQL server (embedded), the same expert episodes",
    "offline": "Offline stage: PPO's start and steps to the expert after BC vs after BC + CQL",
    "soak": "Soak: 300 live envs for a fixed time, clean vs 1% faulty variants of each kind (raise, sleep, spin, NaN)",
    "soak_ray": "Soak on the Ray backend: the same sides, env workers in Ray actors",
    "browser": "Web channel in a real browser: step latency, live envs per GB, sim-to-real gap per family",
    "validator": "Reward validator: planted reward-hacking episodes caught vs honest episodes flagged",
    "forgetting": "Forgetting: a retrain on a shifted catalogue, with and without EWC, on the previous test split",
    "forgetting_family": "Forgetting: a retrain on the SQL channel alone, with and without EWC, on the previous test split",
    "forgetting_recovery": "Forgetting: a retrain on failure-free variants, with and without EWC, on the previous test split",
    "tune": "Auto-tuner (impedance matching): `agentflow train` with its choice vs the static settings",
    "onboarding": "Onboarding: OpenAPI spec to a trainable env for the refund service; the refund process's expert",
    "transfer": "Cross-channel transfer: trained on all channels but one, played on the held-out channel's test split",
    "transfer_refund": "Cross-channel transfer, refund process: trained on one channel, played on the other's test split",
}


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# Targets from the issues, for keys a benchmark reports without its own verdict; (bound, higher is better).
KNOWN_TARGETS: dict[str, tuple[float, bool]] = {
    "sps_ratio_vs_sb3": (3.0, True),
    "update_s_2048": (0.1, False),
    "cold_share_vs_round_robin": (3.0, True),
    "max_visit_gap_over_n": (5.0, False),
    "draws_to_90pct_vs_round_robin": (1.0, False),
}


def _verdicts(result: dict[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
    targets, met = dict(result.get("targets", {})), dict(result.get("targets_met", {}))
    runs = result.get("runs", {})
    for key, (bound, higher) in KNOWN_TARGETS.items():
        value = result.get(key)
        if isinstance(value, int | float) and key not in met:
            targets.setdefault(key, bound)
            values = runs.get(key, [value])  # repeated runs: met only if every run met it
            met[key] = all(v >= bound if higher else v <= bound for v in values)
    return targets, met


def _targets_table(result: dict[str, Any]) -> list[str]:
    targets, met = _verdicts(result)
    runs = result.get("runs", {})
    header = "| metric | value | target | met |"
    if runs:
        header += f" all {result.get('repeats', len(next(iter(runs.values()))))} runs |"
    lines = [header, "|---|---|---|---|" + ("---|" if runs else "")]
    rows = sorted(result.items(), key=lambda item: item[0] not in targets)  # metrics with a target first
    for key, value in rows:
        if isinstance(value, dict | list) or key in ("targets", "targets_met", "runs", "repeats", "command_options"):
            continue
        target = targets.get(key)
        line = (
            f"| `{key}` | {_fmt(value)} | {'' if target is None else _fmt(target)} | "
            f"{'' if key not in met else ('yes' if met[key] else '**no**')} |"
        )
        if runs:
            line += f" {' / '.join(_fmt(v) for v in runs.get(key, []))} |"
        lines.append(line)
    return lines


def _scheduler_table(result: dict[str, Any]) -> list[str]:
    lines = [
        "| strategy | cold share | vs round-robin | longest gap / n | draws to 90% | vs round-robin |",
        "|---|---|---|---|---|---|",
    ]
    for name, m in result.get("strategies", {}).items():
        lines.append(
            f"| {name} | {m['cold_share']:.4f} | {_fmt(m['cold_share_vs_round_robin'])} | "
            f"{m['max_visit_gap_over_n']:.2f} | {m['draws_to_90pct']} | {_fmt(m['draws_to_90pct_vs_round_robin'])} |"
        )
    return lines


def render_benchmarks(bench_dir: Path = BENCH_DIR, measurements_dir: Path = MEASUREMENTS_DIR) -> str:
    """BENCHMARKS.md from every ``data/bench/<name>.json``, then the recorded one-off measurements."""
    out = [
        "# Benchmarks",
        "",
        "Measured on this project's reference machine (2 cores, 24 GiB, no GPU, Python 3.11). Each side of",
        "every ratio is measured in the same run. With `--repeat N` the value column is the last run, the",
        "last column every run, and a target counts as met only if all runs met it. Regenerate with the",
        "command above each table (`agentflow bench all --repeat 3` runs them all).",
        "",
    ]
    for name in (
        "learning",
        "train",
        "pool",
        "ppo",
        "scheduler",
        "sql",
        "offline",
        "validator",
        *FORGETTING,
        "soak",
        "soak_ray",
        "browser",
        "tune",
        "onboarding",
        "transfer",
        "transfer_refund",
    ):
        path = bench_dir / f"{name}.json"
        if not path.exists():
            continue
        result = json.loads(path.read_text())
        command = COMMANDS[name] + (f" --repeat {result['repeats']}" if result.get("repeats", 1) > 1 else "")
        if name == "train":
            command += f" --total-steps {result['total_steps']}"
        if name == "learning":
            command += f" --steps {result['config']['train']['total_steps']}"
        if name == "sql":
            command += f" --episodes {result['episodes']}"
        if name == "browser":
            command += (
                f" --episodes {result['latency_episodes']} --live-envs {result['live_envs']}"
                f" --gap-episodes {result['gap_episodes_per_family']}"
            )
        if name == "offline":
            command += f" --steps {result['config']['ppo_total_steps']} --settings " + ",".join(
                f"{v['behaviour']}:{v['explore_steps']}" for v in result["settings"].values()
            )
        if name == "validator":
            command += f" --episodes {result['episodes_per_policy']} --train-steps {result['train_steps']}"
        if name in FORGETTING:
            command += f" --steps {result['total_steps_cap']} --shift {result.get('shift_name', 'catalogue')}"
        command += result.get("command_options", "")  # a benchmark that records its own options
        if name == "tune":
            command += (
                f" --total-steps {result['total_steps']} --cluster-cpus {result['cluster_cpus']}"
                f" --cluster-workers {result['cluster_static_workers']} --rounds {result['rounds']}"
            )
        if name in (
            "soak",
            "soak_ray",
        ):  # its runs are the clean/faulty/clean sides, not repeats; its verdicts are "met"
            command += f" --seconds {result['seconds']:g} --isolation {result['step_isolation']}"
            command += f" --step-patience-s {result['step_patience_s'] or 0:g}"
            result = {k: v for k, v in result.items() if k not in ("runs", "met")} | {"targets_met": result["met"]}
        out += [f"## {TITLES[name]}", "", f"Command: `{command}` → `{path}`", ""]
        out += _scheduler_table(result) if name == "scheduler" else _targets_table(result)
        if result.get("notes"):
            out += ["", *[f"- {note}" for note in result["notes"]]]
        if result.get("plot"):
            out += ["", f"![learning curves]({result['plot']})"]
        out.append("")
    for note in sorted(measurements_dir.glob("*.md")):
        out += [note.read_text(encoding="utf-8").rstrip(), ""]
    return "\n".join(out)


def bench_section(title: str) -> str:
    """The section of the rendered BENCHMARKS.md under ``## title``."""
    return next((part for part in render_benchmarks().split("## ") if part.startswith(title)), "")


def write_benchmarks_md(bench_dir: Path = BENCH_DIR, target: Path = BENCHMARKS_MD) -> None:
    """Re-render BENCHMARKS.md after a benchmark, so the committed table follows the JSON results."""
    target.write_text(render_benchmarks(bench_dir), encoding="utf-8")


@bench_app.command("pool")
def pool(
    params: Path = PARAMS_OPTION,
    num_envs: int = typer.Option(300, help="Slots for the Ray vs in-process comparison and the live-memory probe."),
    steps: int = typer.Option(30, help="Timed pool steps per side."),
    all_live: bool = typer.Option(True, help="Build all catalogue variants live at once (else extrapolate)."),
    repeat: int = REPEAT_OPTION,
) -> None:
    """Pool: semantic overhead, Ray speed-up, memory, scheduler ratios, worker-kill recovery."""
    from flows.cli.pool import bench_pool

    bench_pool(params, BENCH_DIR / "pool.json", num_envs, steps, all_live, repeat)
    write_benchmarks_md()


@bench_app.command("scheduler")
def scheduler(
    n_variants: int = typer.Option(1000), draws: int = typer.Option(100_000), seed: int = typer.Option(0)
) -> None:
    """Scheduler strategies: cold share, longest visit gap, draws to 90% success (synthetic learner)."""
    from tasks.bench.scheduler_bench import run_scheduler_bench

    result = run_scheduler_bench(n_variants=n_variants, draws=draws, seed=seed)
    result["machine"] = platform.machine()
    write_json(BENCH_DIR / "scheduler.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["scheduler"]))


@bench_app.command("ppo")
def ppo(
    quick: bool = typer.Option(False, "--quick", help="Fewer repeats (a smoke run, not for BENCHMARKS.md)."),
    repeat: int = REPEAT_OPTION,
) -> None:
    """PPO: end-to-end throughput vs stable-baselines3 and update time (learning: `agentflow bench learning`)."""
    from flows.cli.train import bench_ppo

    bench_ppo(BENCH_DIR, quick, repeat)
    write_benchmarks_md()


@bench_app.command("train")
def train(
    params: Path = PARAMS_OPTION,
    total_steps: int | None = typer.Option(
        None, "--total-steps", min=1024, help="PPO steps per side [default: the params' train.total_steps]."
    ),
    repeat: int = REPEAT_OPTION,
) -> None:
    """`agentflow train` end to end with pool.backend ray vs inprocess (shipped params), plus a worker SIGKILL."""
    import tempfile

    from tasks.bench.train_bench import TARGETS, run_train_bench
    from tasks.bench_runs import run_repeated

    steps = total_steps if total_steps is not None else config_or_exit(params).train.total_steps
    with tempfile.TemporaryDirectory(prefix="agentflow-bench-train-") as tmp:
        result = run_repeated(lambda i: run_train_bench(params, Path(tmp) / f"run{i}", steps), repeat, TARGETS)
    write_json(BENCH_DIR / "train.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["train"]))


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
    from tasks.bench.learning_bench import run_learning_bench
    from tasks.plots import plot_learning_bench

    cfg = phase_config_or_exit(params)
    if steps is not None:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"total_steps": steps})})
    result = run_learning_bench(
        cfg,
        eval_every=eval_every_updates,
        test_episodes=test_episodes,
        progress=typer.echo,
    )
    result["plot"] = str(plot_learning_bench(result, BENCH_DIR / "learning.png"))
    write_json(BENCH_DIR / "learning.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["learning"]))


@bench_app.command("sql")
def sql(
    params: Path = PARAMS_OPTION,
    episodes: int = typer.Option(200, "--episodes", min=10, help="Expert episodes per database."),
) -> None:
    """SQL channel: reset/step latency on SQLite vs an embedded PostgreSQL server, the same episodes."""
    from tasks.bench.sql_bench import ENV_ID, run_sql_bench
    from tasks.registry_io import load_registry

    entry = load_registry(config_or_exit(params)).get(ENV_ID)
    write_json(BENCH_DIR / "sql.json", run_sql_bench(entry, episodes))
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["sql"]))


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
    from tasks.bench.browser_bench import run_browser_bench
    from tasks.real_channels import BROWSER_ENV_ID
    from tasks.registry_io import load_registry
    from tasks.rollout import load_policy, resolve_checkpoint

    cfg = config_or_exit(params)
    sim = load_registry(cfg).get("web_checkout_v2")
    real = load_registry(config_dir=Path(cfg.stress.sim_to_real.env_config_dir)).get(BROWSER_ENV_ID)
    policy = load_policy(resolve_checkpoint(cfg, checkpoint))
    result = run_browser_bench(
        cfg, sim, real, policy, episodes=episodes, live_envs=live_envs, gap_episodes=gap_episodes
    )
    write_json(BENCH_DIR / "browser.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["browser"]))


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

    from tasks.bench.offline_bench import HARDER_BEHAVIOUR, run_offline_bench

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
        result = run_offline_bench(cfg, Path(tmp), parsed, eval_every_updates, test_episodes, progress=typer.echo)
    write_json(BENCH_DIR / "offline.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["offline"]))


@bench_app.command("onboarding")
def onboarding(
    repeats: int = typer.Option(5, "--repeat", min=1, help="Spec-to-env runs (the p50 is reported)."),
    seeds: int = typer.Option(2, "--seeds", min=1, help="Expert episodes per scenario and channel."),
) -> None:
    """OpenAPI spec -> trainable env for the refund service (timed), and the refund expert on every refund channel."""
    from tasks.bench.onboarding_bench import run_onboarding_bench

    write_json(BENCH_DIR / "onboarding.json", run_onboarding_bench(repeats, seeds))
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["onboarding"]))


@bench_app.command("all")
def run_all(params: Path = PARAMS_OPTION, repeat: int = REPEAT_OPTION) -> None:
    """Every benchmark, then BENCHMARKS.md."""
    scheduler(n_variants=1000, draws=100_000, seed=0)
    learning(params, steps=None, eval_every_updates=4, test_episodes=None)
    train(params, total_steps=None, repeat=repeat)
    ppo(quick=False, repeat=repeat)
    pool(params, num_envs=300, steps=30, all_live=True, repeat=repeat)
    sql(params, episodes=200)
    browser(params, episodes=20, live_envs=16, gap_episodes=32, checkpoint=None)
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
) -> None:
    """`agentflow train` with the auto-tuner's choice vs the static settings: here, and on a simulated larger cluster."""
    from flows.cli.tune import bench_tune, print_bench

    steps = total_steps if total_steps is not None else config_or_exit(params).train.total_steps
    result = bench_tune(params, BENCH_DIR, steps, cluster_cpus, cluster_workers, rounds)
    write_benchmarks_md()
    print_bench(result, BENCH_DIR)


@bench_app.command("soak")
def soak(
    params: Path = PARAMS_OPTION,
    seconds: float = typer.Option(45.0, min=1.0, help="Seconds each side (clean, faulty, clean, faulty, clean) steps."),
    num_envs: int = typer.Option(300, min=1, help="Live envs (pool slots)."),
    n_variants: int = typer.Option(300, min=8, help="Catalogue variants sampled for the soak."),
    share: float = typer.Option(0.01, min=0.0, max=0.2, help="Share of the variants faulty per fault kind."),
    step_timeout_s: float = typer.Option(0.25, min=0.01, help="pool.step_timeout_s for the soak."),
    step_patience_s: float = typer.Option(
        0.02, min=0.0, help="pool.step_patience_s for the soak (0: off, every pool step waits for its env steps)."
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

    from flows.cli.pool import catalogue_and_factory
    from tasks.bench.soak_bench import TARGETS, run_soak_bench

    cfg = config_or_exit(params)
    logging.getLogger("agentflow.pool").setLevel(logging.ERROR)  # the faulty side fails on purpose
    if isolation not in (None, "thread", "process"):
        raise typer.BadParameter(f"--isolation must be thread or process, got {isolation!r}")
    if backend not in ("inprocess", "ray"):
        raise typer.BadParameter(f"--backend must be inprocess or ray, got {backend!r}")
    pool_cfg = cfg.pool.model_copy(
        update={
            "backend": backend,
            "step_isolation": isolation or cfg.pool.step_isolation,
            "step_timeout_s": step_timeout_s,
            "step_patience_s": step_patience_s or None,
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
        typer.echo(f"{key}: {_fmt(result[key])}" + ("" if target is None else f" (target {target}, met: {met})"))
    for name, side in result["runs"].items():
        typer.echo(
            f"{name}: {side['env_steps_per_s']:,.0f} env-steps/s, {side['failures'] or 'no'} episodes lost, "
            f"slowest pool step {side['slowest_pool_step_s']:.2f} s"
        )
    write_benchmarks_md()


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
    from tasks.bench.validator_bench import run_validator_bench_fresh

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
    write_json(BENCH_DIR / "validator.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES["validator"]))


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
    from tasks.bench.forgetting_bench import SHIFTS, run_forgetting_bench
    from tasks.bench.machine import MachineLoad

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
    write_json(BENCH_DIR / f"{name}.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES[name]))


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
    from tasks.bench.machine import MachineLoad
    from tasks.bench.transfer_bench import run_transfer_bench

    cfg = phase_config_or_exit(params)
    machine = MachineLoad()
    result = run_transfer_bench(cfg, steps, progress=typer.echo)
    result["machine_load"] = machine.result()
    result["notes"] = [
        f"process {result['process']}, channels {result['channels']}; {result['test_episodes']} test episodes per side",
        *(
            f"held out {c}: rules {e['rules']:.3f}, held-out policy {e['held_out_policy']:.3f}, "
            f"all-channel policy {e['all_channels_policy']:.3f} (process success on its test variants)"
            for c, e in result["held_out"].items()
        ),
        f"cross-channel action consistency on {result['paired_states']} paired states: policy "
        f"{result['cross_channel_consistency_policy']:.3f}, random legal policy {result['cross_channel_consistency_random']:.3f}",
        machine.note(),
    ]
    result["command_options"] = f" --steps {result['total_steps_cap']}"
    name = "transfer" if result["process"] == "checkout" else f"transfer_{result['process']}"
    if name not in TITLES:
        raise typer.BadParameter(f"no BENCHMARKS.md section for process {result['process']!r}")
    write_json(BENCH_DIR / f"{name}.json", result)
    write_benchmarks_md()
    typer.echo(bench_section(TITLES[name]))
