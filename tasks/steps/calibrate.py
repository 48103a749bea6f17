"""Phase 0 step: calibrate sampled variants of every family; write the report and reward statistics.

Called by ``agentflow calibrate`` (and so by the DVC stage) and by the Prefect task; neither
starts the other. Outputs (atomically, under ``data/calibration/``): ``report.json`` (one row
per variant), ``quarantine.json`` (the variants that failed, with the reason: the variants stage leaves them out
of the catalogue, so no later phase of the cycle sees them), ``reward_stats.json`` (per env_id and per base env step-reward mean/std of the
scripted expert, for the report) and ``audit.json`` (the mapping audit). The exit
metric ``env_stability_score`` also goes to ``data/metrics/calibrate.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.adapters.audit import audit_entry
from agentflow_core.atomic import atomic_dir, check_output, write_json
from agentflow_core.calibration import CalibrationReport, Target, VariantCalibration, calibrate
from agentflow_core.evaluation.stress import stratified_sample
from agentflow_core.gates import calibrate_gate, evaluate_gate
from agentflow_core.variants import VariantSpec, generate_variants
from tasks.budgets import budget_metrics
from tasks.compose import base_env_infos, map_chunks
from tasks.context import PhaseContext

QUARANTINE_FILE = "quarantine.json"


def sample_variants(ctx: PhaseContext, per_family: int, rng: np.random.Generator) -> list[VariantSpec]:
    """A stratified sample of the catalogue: every family x every dimension value, ``per_family`` or more each.

    The calibration gate runs before the catalogue is written, so it draws from the same generator
    with the same settings as the variants stage: every sampled variant is a catalogue member, and
    quarantining its content hash removes exactly it from the catalogue. Per family the sample holds
    at least as many variants as the largest dimension has values, so the cover always fits.
    """
    cfg = ctx.cfg
    v = cfg.variants
    bases = base_env_infos(ctx)
    catalogue = generate_variants(
        bases, v.dimensions, v.perturbations, v.samples_per_combination, cfg.base.seed, scenario=ctx.vocabulary.scenario
    )
    dimensions = sorted(v.dimensions)
    size = max(per_family, *(len(values) for values in v.dimensions.values()))
    picked: list[VariantSpec] = []
    for base in bases:
        own = [spec for spec in catalogue if spec.base_env_id == base.base_env_id]
        picked.extend(stratified_sample(own, size, dimensions, rng))
    return picked


def calibration_envs(ctx: PhaseContext, variants: list[VariantSpec]) -> list[Target]:
    """(factory, expert policy, accepted outcome tokens) for the sampled variants.

    The accepted tokens are the process's goal and the handled outcomes it declares for the variant;
    a ``calibrate.handled_outcomes`` list of failure reasons replaces the declared handled outcomes.
    """
    registry, process = ctx.registry, ctx.process
    targets: list[Target] = []
    for spec in variants:
        entry = registry.get(spec.base_env_id)
        expert = process.expert(entry.family)
        accepted = (
            process.vocabulary.accepted_outcomes(spec.params)
            if ctx.cfg.calibrate.handled_outcomes is None
            else frozenset({process.vocabulary.goal})
        )
        targets.append((functools.partial(entry.make, spec.params, spec.env_id), expert.act, accepted))
    return targets


def run_calibrate(
    ctx: PhaseContext,
    out_dir: Path,
    metrics_path: Path | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run the calibration gate's measurements; returns the summary (the gate verdict included)."""
    cfg = ctx.cfg
    check_output(out_dir)
    started = time.perf_counter()
    rng = np.random.default_rng(cfg.base.seed)
    variants = sample_variants(ctx, cfg.calibrate.variants_per_family, rng)
    c = cfg.calibrate

    def calibrate_chunk(targets: list[Target]) -> list[VariantCalibration]:
        thresholds = (c.max_reward_variance, c.max_failed_fraction, c.min_expert_success)
        outcomes = frozenset(c.handled_outcomes or ())
        return calibrate(targets, c.resets, cfg.base.seed, *thresholds, outcomes).variants

    # one chunk of variants per env worker: Ray tasks on the Ray backend, in this process otherwise
    results = map_chunks(ctx, calibrate_chunk, calibration_envs(ctx, variants), progress)
    report = CalibrationReport.of(results, c.max_failed_fraction)
    registry = ctx.registry
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
    metrics = {
        "env_stability_score": report.env_stability_score,
        "failed": len(report.failed),
        "failed_fraction": len(report.failed) / max(len(report.variants), 1),
        "audit_errors": len(errors),
    }
    verdict = evaluate_gate(calibrate_gate(cfg), metrics)
    quarantine = [
        {"env_id": spec.env_id, "content_hash": spec.content_hash, "family": spec.family, "reason": result.reason}
        for spec, result in zip(variants, report.variants, strict=True)
        if not result.stable
    ]
    wall_s = time.perf_counter() - started
    summary = {
        **metrics,
        "variants": len(report.variants),
        "passed": verdict.passed,
        "gate": verdict.message,
        "quarantine": {q["env_id"]: q["reason"] for q in quarantine},
        "message": (verdict.message if not verdict.passed else "calibration gate passed")
        + "\n"
        + report.summary()
        + (f"\n  mapping audit: {len(errors)} error finding(s)" if errors else ""),
        **budget_metrics("calibrate", wall_s, cfg.calibrate.budget_s),
    }
    with atomic_dir(out_dir) as tmp:
        # no timings in the output: its md5 keys the variants stage (and the flow's phase cache)
        stable = {k: v for k, v in summary.items() if not k.startswith("budget/")}
        write_json(tmp / "report.json", {"summary": stable, "variants": [v.to_dict() for v in report.variants]})
        write_json(tmp / "reward_stats.json", reward_stats)
        write_json(tmp / "audit.json", findings)
        write_json(tmp / QUARANTINE_FILE, {"variants": quarantine})
    if metrics_path is not None:
        budget = {k: v for k, v in summary.items() if k.startswith("budget/")}
        # keys distinct from the other phases' metrics: the cycle's MLflow parent run carries them all
        write_json(metrics_path, {**metrics, "calibrated_variants": len(report.variants), **budget})
    return summary


def read_quarantine(calibration_dir: Path) -> list[dict[str, Any]]:
    """The variants calibration quarantined (env_id, content_hash, family, reason); none if it has not run."""
    path = Path(calibration_dir) / QUARANTINE_FILE
    if not path.exists():
        return []
    return list(json.loads(path.read_text(encoding="utf-8"))["variants"])
