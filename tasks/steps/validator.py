"""Validator step: train the discriminator reward validator on the exploration dataset (docs/design-003.md §3.2).

Runs after explore (``agentflow validator``, the DVC stage ``validator``, the Prefect task). Reads
``data/trajectories``: the rows whose action was the behaviour's own (``explored == False``; with
the shipped ``explore.behaviour: expert`` these are the scripted expert's steps) are the real
class, a uniformly drawn other legal action at the same state the policy class
(``agentflow_core.evaluation.validator``). Writes ``data/validator/discriminator.safetensors`` and
``summary.json``, and ``data/metrics/validator.json``. Train loads it to down-weight suspicious
episodes' rewards and stress to flag suspicious episodes (:func:`load_validator`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.atomic import atomic_dir, check_output, write_json
from agentflow_core.evaluation.validator import (
    VALIDATOR_FILE,
    Discriminator,
    RolloutValidator,
    fit_discriminator,
    load_discriminator,
    save_discriminator,
)
from agentflow_core.rl.trajectories import read_steps
from agentflow_core.semantics import Vocabulary
from tasks.budgets import budget_metrics
from tasks.context import PhaseContext


def validator_dir(ctx: PhaseContext) -> Path:
    """``<data_dir>/validator``: the discriminator and its summary."""
    return ctx.paths.root / "validator"


def expert_rows(
    trajectories: Path, max_samples: int, seed: int, vocabulary: Vocabulary
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(obs, action_mask, action)`` of the behaviour's own steps, at most ``max_samples`` (a seeded subsample)."""
    table = read_steps(trajectories, vocabulary=vocabulary)
    keep = ~np.asarray(table.column("explored").to_numpy(zero_copy_only=False), dtype=bool)
    obs = np.asarray(table.column("obs").combine_chunks().flatten(), dtype=np.float32)
    obs = obs.reshape(-1, vocabulary.obs_dim)[keep]
    masks = np.asarray(
        table.column("action_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False), dtype=bool
    ).reshape(-1, vocabulary.n_actions)[keep]
    actions = table.column("action").to_numpy().astype(np.int64)[keep]
    if len(actions) > max_samples:
        idx = np.sort(np.random.default_rng(seed).choice(len(actions), max_samples, replace=False))
        obs, masks, actions = obs[idx], masks[idx], actions[idx]
    return obs, masks, actions


def run_validator(
    ctx: PhaseContext,
    trajectories: Path | None = None,
    out_dir: Path | None = None,
    metrics_path: Path | None = None,
) -> dict[str, Any]:
    """Fit the discriminator on the exploration dataset; write it, its summary and the metrics."""
    cfg = ctx.cfg
    vc = cfg.validator
    paths = ctx.paths
    trajectories = paths.trajectories if trajectories is None else Path(trajectories)
    out_dir = validator_dir(ctx) if out_dir is None else Path(out_dir)
    check_output(out_dir)
    started = time.perf_counter()
    summary: dict[str, Any] = {"enabled": vc.enabled, "threshold": vc.threshold, "weight": vc.suspicious_weight}
    with atomic_dir(out_dir) as tmp:
        if vc.enabled:
            vocabulary = ctx.vocabulary
            obs, masks, actions = expert_rows(trajectories, vc.max_samples, cfg.base.seed, vocabulary)
            model, fit = fit_discriminator(
                obs,
                masks,
                actions,
                n_tokens=vocabulary.n_tokens,
                hidden=vc.hidden,
                epochs=vc.epochs,
                seed=cfg.base.seed,
            )
            save_discriminator(model, Path(tmp) / VALIDATOR_FILE)
            summary.update(fit.to_dict())
        accuracy = summary.get("validator/heldout_accuracy", 1.0)
        summary["passed"] = not vc.enabled or accuracy >= vc.min_heldout_accuracy
        summary["gate"] = (
            "validator off"
            if not vc.enabled
            else f"validator: heldout_accuracy {accuracy:.3f} {'>=' if summary['passed'] else '<'} "
            f"{vc.min_heldout_accuracy:g} on {summary['validator/heldout_states']:.0f} held-out of "
            f"{summary['validator/expert_samples']:.0f} expert steps"
        )
        summary.update(budget_metrics("validator", time.perf_counter() - started, vc.budget_s))
        write_json(Path(tmp) / "summary.json", summary)
    if metrics_path is not None:
        write_json(metrics_path, {k: v for k, v in summary.items() if isinstance(v, int | float)})
    return summary


def load_validator(ctx: PhaseContext) -> Discriminator | None:
    """The trained discriminator, or None when the validator is off or has not run."""
    cfg = ctx.cfg
    path = validator_dir(ctx) / VALIDATOR_FILE
    if not cfg.validator.enabled or not path.exists():
        return None
    return load_discriminator(path)


def training_validator(ctx: PhaseContext) -> RolloutValidator | None:
    """PPO's reward hook over the trained discriminator (None when off or not trained)."""
    cfg = ctx.cfg
    model = load_validator(ctx)
    if model is None:
        return None
    return RolloutValidator(model, cfg.validator.threshold, cfg.validator.suspicious_weight)
