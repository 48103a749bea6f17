"""Phase 0 step: calibrate sampled variants of every family; write the report and reward statistics.

Called by ``agentflow calibrate`` (and so by the DVC stage) and by the Prefect task; neither
starts the other. Outputs (atomically, under ``data/calibration/``): ``report.json`` (one row
per variant), ``reward_stats.json`` (per env_id and per base env step-reward mean/std of the
scripted expert, for the report) and ``audit.json`` (the mapping audit). The exit
metric ``env_stability_score`` also goes to ``data/metrics/calibrate.json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.adapters.audit import audit_entry
from agentflow_core.atomic import atomic_dir, write_json
from agentflow_core.calibration import CalibrationReport, VariantCalibration, calibrate
from agentflow_core.config import AgentFlowConfig
from agentflow_core.envs.experts import expert_for
from agentflow_core.variants import VariantSpec, generate_variants
from tasks.compose import base_env_infos, map_chunks
from tasks.registry_io import load_registry


def sample_variants(cfg: AgentFlowConfig, per_family: int, rng: np.random.Generator) -> list[VariantSpec]:
    """``per_family`` variants of every base env, one draw per dimension cell, picked at random.

    The calibration gate runs before the catalogue exists, so it samples the same generator
    (one perturbation draw per cell) rather than reading ``data/variants``.
    """
    bases = base_env_infos(cfg)
    cells = generate_variants(bases, cfg.variants.dimensions, cfg.variants.perturbations, 1, cfg.base.seed)
    picked: list[VariantSpec] = []
    for base in bases:
        own = [v for v in cells if v.base_env_id == base.base_env_id]
        picked.extend(own[i] for i in sorted(rng.choice(len(own), size=min(per_family, len(own)), replace=False)))
    return picked


def calibration_envs(cfg: AgentFlowConfig, variants: list[VariantSpec]) -> list[tuple[Callable[..., Any], Any]]:
    """(factory, expert policy) pairs for the sampled variants."""
    registry = load_registry(cfg)
    pairs = []
    for spec in variants:
        entry = registry.get(spec.base_env_id)
        expert = expert_for(entry.family)
        pairs.append(((lambda e=entry, s=spec: e.make(s.params, s.env_id)), expert.act))
    return pairs


def run_calibrate(
    cfg: AgentFlowConfig,
    out_dir: Path,
    metrics_path: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the calibration gate's measurements; returns the summary (the gate verdict included)."""
    rng = np.random.default_rng(cfg.base.seed)
    variants = sample_variants(cfg, cfg.calibrate.variants_per_family, rng)
    c = cfg.calibrate

    def calibrate_chunk(pairs: list[tuple[Callable[..., Any], Any]]) -> list[VariantCalibration]:
        thresholds = (c.max_reward_variance, c.max_failed_fraction, c.min_expert_success)
        return calibrate(pairs, c.resets, cfg.base.seed, *thresholds, frozenset(c.handled_outcomes)).variants

    # one chunk of variants per env worker: Ray tasks on the Ray backend, in this process otherwise
    results = map_chunks(cfg, calibrate_chunk, calibration_envs(cfg, variants), progress)
    report = CalibrationReport.of(results, c.max_failed_fraction)
    registry = load_registry(cfg)
    findings = [dataclasses.asdict(f) for env_id in cfg.variants.base_envs for f in audit_entry(registry.get(env_id))]
    errors = [f for f in findings if f.get("severity", "error") == "error"]
    by_base: dict[str, list[Any]] = {}
    for spec, result in zip(variants, report.variants, strict=True):
        by_base.setdefault(spec.base_env_id, []).append(result)
    reward_stats = {
        "per_env": {
            r.env_id: {"mean": r.step_reward_mean, "std": r.step_reward_std, "count": r.step_count}
            for r in report.variants
            if r.step_count
        },
        "per_base_env": {
            base: {
                "mean": float(np.mean([r.step_reward_mean for r in rs if r.step_count] or [0.0])),
                "std": float(np.mean([r.step_reward_std for r in rs if r.step_count] or [1.0])),
                "count": int(sum(r.step_count for r in rs)),
            }
            for base, rs in by_base.items()
        },
    }
    summary = {
        "env_stability_score": report.env_stability_score,
        "variants": len(report.variants),
        "failed": len(report.failed),
        "passed": report.passed and not errors,
        "audit_errors": len(errors),
        "quarantine": {v.env_id: v.reason for v in report.failed},
        "message": report.summary() + (f"\n  mapping audit: {len(errors)} error finding(s)" if errors else ""),
    }
    with atomic_dir(out_dir) as tmp:
        write_json(tmp / "report.json", {"summary": summary, "variants": [v.to_dict() for v in report.variants]})
        write_json(tmp / "reward_stats.json", reward_stats)
        write_json(tmp / "audit.json", findings)
    if metrics_path is not None:
        write_json(metrics_path, {"env_stability_score": report.env_stability_score, "failed": len(report.failed)})
    return summary
