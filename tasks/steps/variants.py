"""Variants step: generate the variant catalogue from ``params.yaml`` and write it atomically.

Called by ``agentflow variants`` (and so by the DVC stage) and by the Prefect task. Output,
under ``data/variants/``: ``catalogue.parquet`` (one row per variant), ``splits.json`` (the
train/validation/test split, ``agentflow_core.splits``) and ``_meta.json`` (the generator
parameters, seed, the variants calibration quarantined (left out, with the reason), counts by family and dimension overall and per split, the catalogue's sha256). The
variant count also goes to ``data/metrics/variants.json`` when a metrics path is given.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agentflow_core.atomic import check_output, write_json
from agentflow_core.splits import write_split_catalogue
from agentflow_core.variants import generate_variants, read_meta
from tasks.budgets import budget_metrics
from tasks.compose import base_env_infos
from tasks.context import PhaseContext
from tasks.steps.calibrate import read_quarantine


def run_variants(
    ctx: PhaseContext, out_dir: Path, metrics_path: Path | None = None, *, source: str = "params.yaml"
) -> dict[str, Any]:
    """Generate and write the catalogue; returns the summary. Errors name ``source``, the params file read."""
    cfg = ctx.cfg
    check_output(out_dir)
    started = time.perf_counter()
    v = cfg.variants
    bases = base_env_infos(ctx)
    generated = generate_variants(
        bases,
        v.dimensions,
        v.perturbations,
        v.samples_per_combination,
        cfg.base.seed,
        source=source,
        scenario=ctx.vocabulary.scenario,
    )
    quarantine = read_quarantine(ctx.paths.calibration)
    excluded = {q["content_hash"] for q in quarantine}
    variants = [spec for spec in generated if spec.content_hash not in excluded]
    meta = {
        "generator": "agentflow_core.variants.generate_variants",
        "seed": cfg.base.seed,
        "base_envs": [{"base_env_id": b.base_env_id, "family": b.family, "version": b.version} for b in bases],
        "dimensions": v.dimensions,
        "perturbations": {name: spec.model_dump(exclude_none=True) for name, spec in v.perturbations.items()},
        "samples_per_combination": v.samples_per_combination,
        "quarantined": [
            {"env_id": q["env_id"], "content_hash": q["content_hash"], "reason": q["reason"]} for q in quarantine
        ],
    }
    path, splits = write_split_catalogue(
        variants,
        out_dir,
        meta,
        validation=v.split.validation,
        test=v.split.test,
        seed=cfg.base.seed,
        dimensions=sorted(v.dimensions),
    )
    card = read_meta(out_dir)
    summary = {
        "catalogue": str(path),
        "variants": card["counts"]["total"],
        "by_family": card["counts"]["by_family"],
        "by_dimension": card["counts"]["by_dimension"],
        "splits": {name: len(hashes) for name, hashes in splits.items()},
        "catalogue_sha256": card["catalogue_sha256"],
        "quarantined": len(generated) - len(variants),
        "seconds": round(time.perf_counter() - started, 3),
    }
    budget = budget_metrics("variants", time.perf_counter() - started, v.budget_s)
    if metrics_path is not None:
        write_json(
            metrics_path,
            {
                "variants": summary["variants"],
                "by_family": summary["by_family"],
                **{f"{name}_variants": n for name, n in summary["splits"].items()},
                "quarantined": summary["quarantined"],
                **budget,
            },
        )
    return summary
