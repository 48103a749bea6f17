"""``agentflow profile-envs``: env costs per family, written to data/bench/; the catalogue the pool benchmarks use.

Edge code: loads ``params.yaml``, builds the registry (YAML injected), generates the variant
catalogue from the config, writes CSV/JSON and prints rich tables. The measurements themselves are
the core's pure functions (``agentflow_core.pool.profiler``).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from agentflow_core.atomic import atomic_file, write_text
from agentflow_core.config import AgentFlowConfig
from agentflow_core.pool.base import RegistryEnvFactory
from agentflow_core.variants import BaseEnvInfo, VariantSpec, generate_variants
from tasks.config_io import DEFAULT_PARAMS, load_config
from tasks.process_io import load_process
from tasks.registry_io import load_registry

console = Console()
DEFAULT_BENCH_DIR = Path("data/bench")


def config_or_defaults(params: Path) -> AgentFlowConfig:
    """``params`` parsed, or the defaults when there is no such file."""
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
        scenario=load_process(cfg).vocabulary.scenario,
    )
    return variants, RegistryEnvFactory({e.env_id: e for e in entries})


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

    cfg = config_or_defaults(params)
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
