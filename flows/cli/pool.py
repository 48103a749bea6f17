"""``agentflow profile-envs`` and the ``bench pool`` step: env costs and pool benchmark, written to data/bench/.

Edge code: loads ``params.yaml``, builds the registry (YAML injected), generates the variant
catalogue from the config, starts Ray from ``base.ray`` (``RAY_ADDRESS`` wins, see
``tasks.runtime``), writes CSV/JSON and prints rich tables. The measurements themselves are
the core's pure functions (``agentflow_core.pool.profiler``, ``tasks.bench.pool_bench``).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from agentflow_core.atomic import atomic_file, write_json, write_text
from agentflow_core.config import AgentFlowConfig
from agentflow_core.pool.base import RegistryEnvFactory
from agentflow_core.variants import BaseEnvInfo, VariantSpec, generate_variants
from tasks.bench_runs import run_repeated
from tasks.compose import start_ray
from tasks.config_io import DEFAULT_PARAMS, load_config
from tasks.registry_io import load_registry

pool_app = typer.Typer(
    help="Env pool: profile envs, benchmark the pool.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
DEFAULT_BENCH_DIR = Path("data/bench")


def _config(params: Path) -> AgentFlowConfig:
    return load_config(params) if params.is_file() else AgentFlowConfig()


def catalogue_and_factory(cfg: AgentFlowConfig) -> tuple[list[VariantSpec], RegistryEnvFactory]:
    """The configured variant catalogue (generated, deterministic) and a registry-backed env factory."""
    registry = load_registry(cfg)
    entries = [e for e in registry.entries() if e.env_id in cfg.variants.base_envs] or registry.entries()
    variants = generate_variants(
        [BaseEnvInfo(e.env_id, e.family, e.version) for e in entries],
        cfg.variants.dimensions,
        cfg.variants.perturbations,
        cfg.variants.samples_per_combination,
        seed=cfg.base.seed,
    )
    return variants, RegistryEnvFactory({e.env_id: e for e in entries})


@pool_app.command("profile-envs")
def profile_envs_cmd(
    params: Annotated[Path, typer.Option(help="params.yaml (defaults if missing).")] = DEFAULT_PARAMS,
    out_dir: Annotated[
        Path, typer.Option("--out", help="Folder for env_profile.csv / env_profile.json.")
    ] = DEFAULT_BENCH_DIR,
    per_family: Annotated[int, typer.Option(help="Variants sampled per family.")] = 4,
    steps: Annotated[int, typer.Option(help="Random legal steps per sampled variant.")] = 200,
    mem_envs: Annotated[int, typer.Option(help="Envs created per family for the memory estimate.")] = 50,
) -> None:
    """Per family and sampled variant: create/reset time, step p50/p95, memory per live env."""
    from agentflow_core.pool.profiler import profile_envs

    cfg = _config(params)
    variants, factory = catalogue_and_factory(cfg)
    records = [r.as_dict() for r in profile_envs(variants, factory, per_family, steps, mem_envs, seed=cfg.base.seed)]
    out_dir.mkdir(parents=True, exist_ok=True)
    with atomic_file(out_dir / "env_profile.csv") as tmp, tmp.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    write_text(out_dir / "env_profile.json", json.dumps(records, indent=2) + "\n")
    table = Table(title=f"env profile ({len(variants)} variants in the catalogue)")
    for column in (
        "family",
        "env_id",
        "create_ms",
        "reset_ms",
        "step_p50_ms",
        "step_p95_ms",
        "steps",
        "rss_kb/env",
        "py_heap_kb/env",
    ):
        table.add_column(column, justify="left" if column in ("family", "env_id") else "right")
    for r in records:
        table.add_row(
            r["family"],
            "[bold]family[/bold]" if r["env_id"] == "*" else r["env_id"],
            *(f"{r[k]:.3f}" for k in ("create_ms", "reset_ms", "step_p50_ms", "step_p95_ms")),
            str(r["steps"]),
            *("" if r[k] is None else f"{r[k]:.1f}" for k in ("mem_per_env_kb", "py_heap_per_env_kb")),
        )
    console.print(table)
    console.print(f"wrote {out_dir / 'env_profile.csv'} and {out_dir / 'env_profile.json'}")


def bench_pool(
    params: Path = DEFAULT_PARAMS,
    out: Path = DEFAULT_BENCH_DIR / "pool.json",
    num_envs: int = 300,
    steps: int = 30,
    measure_all_live: bool = True,
    repeat: int = 1,
) -> dict[str, Any]:
    """Run the pool benchmark ``repeat`` times, write ``data/bench/pool.json`` and print numbers vs targets.

    With ``repeat`` > 1 the JSON holds the last run plus every run's target metrics (``runs``), and
    a target counts as met only if it was met in every run. The all-live probe (a 20-second,
    ~1 GB build of every variant) runs in the last run only.
    """
    import ray

    from tasks.bench.pool_bench import TARGETS, run_pool_bench

    logging.getLogger("agentflow.pool").setLevel(logging.ERROR)  # the recovery run kills a worker on purpose
    cfg = _config(params)
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
                measure_all_live=measure_all_live and i == repeat - 1,
                seed=cfg.base.seed,
            )
        finally:
            if ray.is_initialized():
                ray.shutdown()

    result = run_repeated(run, repeat, TARGETS)
    write_json(out, result)
    table = Table(title="pool benchmark")
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
    console.print(f"wrote {out}")
    return result


@pool_app.command("bench-pool")
def bench_pool_cmd(
    params: Annotated[Path, typer.Option(help="params.yaml (defaults if missing).")] = DEFAULT_PARAMS,
    out: Annotated[Path, typer.Option(help="Where to write the JSON.")] = DEFAULT_BENCH_DIR / "pool.json",
    num_envs: Annotated[
        int, typer.Option(help="Slots for the Ray/in-process comparison and the live-memory probe.")
    ] = 300,
    steps: Annotated[int, typer.Option(help="Timed pool steps per side.")] = 30,
    all_live: Annotated[
        bool, typer.Option(help="Measure every variant live at once (else extrapolate, flagged).")
    ] = True,
    repeat: Annotated[int, typer.Option(help="Run the benchmark this many times; targets must hold in every run.")] = 1,
) -> None:
    """Pool benchmark (the lead wires it as ``agentflow bench pool``)."""
    bench_pool(params, out, num_envs, steps, all_live, repeat)
