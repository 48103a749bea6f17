"""``agentflow bench`` commands that train or judge a policy: learning, offline, validator, forgetting, transfer.

Registered on the ``bench`` group by :mod:`flows.cli.bench`; the benchmarks package is imported
inside each command only, as there.
"""

from __future__ import annotations

import platform
from pathlib import Path

import typer

from flows.cli.bench_common import BENCH_DIR, PARAMS_OPTION, REFERENCE_PARAMS_OPTION, bench_app, print_targets, publish
from flows.cli.common import phase_config_or_exit


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
    out: Path | None = typer.Option(
        None,
        "--out",
        help="Write the result (and its plot beside it) here instead of data/bench/learning.json; BENCHMARKS.md is "
        "left as it is.",
    ),
) -> None:
    """AgentFlow's training vs MaskablePPO from scratch and BC-warm-started: same data, settings, reward, test split."""
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
    if out is None:
        result["plot"] = str(plot_learning_bench(result, BENCH_DIR / "learning.png"))
        publish("learning", result)
        return
    from agentflow_core.atomic import write_json

    result["plot"] = str(plot_learning_bench(result, out.with_suffix(".png")))
    write_json(out, result)
    print_targets(result, f"bench learning -> {out}")


@bench_app.command("offline")
def offline(
    params: Path = REFERENCE_PARAMS_OPTION,
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


@bench_app.command("validator")
def validator(
    params: Path = REFERENCE_PARAMS_OPTION,
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
    params: Path = REFERENCE_PARAMS_OPTION,
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
    params: Path = REFERENCE_PARAMS_OPTION,
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
