"""Fine-tuning on the django-oscar store: PPO continues from the champion on Oscar's own pages, a small budget.

``agentflow train --channel oscar`` runs :func:`finetune_on_oscar`:

1. **before**: the champion on the stress phase's Oscar episodes (the test split's stratified sample,
   paired with the simulator: :func:`tasks.real_channels.run_sim_to_real_oscar`);
2. **fine-tune**: PPO from the champion's weights on web_checkout variants of the *train* split,
   stratified over the dimensions that apply on Oscar (``stress.sim_to_real.oscar_dimensions``), their
   envs on a live store (:mod:`tasks.oscar_site`). One env: every episode restores the store's one
   database, so two envs would overwrite each other's baskets. ``train``'s PPO settings apply, with
   ``n_steps`` and ``minibatch_size`` cut to the budget (a real step takes ~0.1-0.2 s);
3. **after**: the fine-tuned policy on the same Oscar episodes as *before*.

Writes ``<out>/checkpoints/`` (the fine-tuned policy, loadable like training's) and ``<out>/summary.json``
(before, after, the per-update curve); the report shows before and after when the summary exists.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.atomic import write_json
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.sim_to_real import stratify
from agentflow_core.evaluation.stress import stratified_sample
from agentflow_core.registry import EnvEntry
from agentflow_core.variants import VariantSpec
from tasks.context import PhaseContext
from tasks.oscar_site import site_entry_of
from tasks.rollout import LoadedPolicy, load_policy, load_variants

SUMMARY_FILE = "summary.json"
DEFAULT_STEPS = 256
N_STEPS = 32  # one rollout: ~5 Oscar episodes of the champion


def stress_sample(ctx: PhaseContext) -> list[VariantSpec]:
    """The stress phase's stratified test-split sample (the Oscar episodes are drawn from it)."""
    cfg = ctx.cfg
    variants = load_variants(ctx)
    dimensions = [d for d in cfg.variants.dimensions if any(d in v.params for v in variants)]
    return list(stratified_sample(variants, cfg.stress.variants, dimensions, np.random.default_rng(cfg.base.seed)))


def oscar_train_variants(ctx: PhaseContext, count: int, env_id: str) -> list[VariantSpec]:
    """Train-split web_checkout variants stratified over Oscar's dimensions, re-based on the site env ``env_id``.

    Only the dimensions that apply on Oscar are kept in the params (the others take the Oscar env's
    defaults), as the stress phase's Oscar episodes do.
    """
    dimensions = list(ctx.cfg.stress.sim_to_real.oscar_dimensions)
    train = [v for v in load_variants(ctx, split="train") if v.family == "web_checkout"]
    return [
        dataclasses.replace(v, base_env_id=env_id, params={k: v.params[k] for k in dimensions if k in v.params})
        for v in stratify(train, dimensions, count)
    ]


def finetune_on_oscar(
    ctx: PhaseContext,
    checkpoint: str,
    out_dir: Path,
    total_steps: int = DEFAULT_STEPS,
    on_update: Callable[[int, int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Before / fine-tune / after on the Oscar store (see the module docstring); returns the summary."""
    from tasks.real_channels import run_sim_to_real_oscar

    settings = ctx.cfg.stress.sim_to_real
    if settings.oscar_episodes <= 0:
        raise AgentFlowError(
            "stress.sim_to_real.oscar_episodes is 0: there are no Oscar episodes to measure the gap on"
        )
    started = time.perf_counter()
    sample = stress_sample(ctx)
    champion = load_policy(checkpoint, ctx.process)
    before = run_sim_to_real_oscar(ctx, champion, sample)
    site = site_entry_of(Path(settings.oscar_env_config_dir))
    variants = oscar_train_variants(ctx, max(settings.oscar_episodes, 8), site.env_id)
    saved, curve = _ppo_on_oscar(ctx, checkpoint, variants, site, out_dir / "checkpoints", total_steps, on_update)
    tuned = load_policy(str(saved), ctx.process)
    after = run_sim_to_real_oscar(ctx, LoadedPolicy(f"{tuned.name} (Oscar fine-tune)", str(saved), tuned.act), sample)
    summary = {
        "champion": {"name": champion.name, "checkpoint": champion.checkpoint},
        "finetuned": {"name": tuned.name, "checkpoint": str(saved)},
        "total_steps": int(curve[-1]["global_step"]) if curve else 0,
        "train_variants": [v.env_id for v in variants],
        "before": _drop_metrics(before),
        "after": _drop_metrics(after),
        "curve": curve,
        "seconds": round(time.perf_counter() - started, 1),
    }
    summary["metrics"] = {
        "oscar_finetune_gap_before": before["gap"],
        "oscar_finetune_gap_after": after["gap"],
        "oscar_finetune_success_before": before["real_process_success"],
        "oscar_finetune_success_after": after["real_process_success"],
    }
    write_json(out_dir / SUMMARY_FILE, summary)
    return summary


def _drop_metrics(run: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in run.items() if k != "metrics"}


def _ppo_on_oscar(
    ctx: PhaseContext,
    checkpoint: str,
    variants: list[VariantSpec],
    site: EnvEntry,
    checkpoints: Path,
    total_steps: int,
    on_update: Callable[[int, int, dict[str, float]], None] | None,
) -> tuple[Path, list[dict[str, float]]]:
    """PPO from ``checkpoint``'s weights on ``variants`` (one env on a live store); the saved checkpoint, the curve."""
    from agentflow_core.pool.base import RegistryEnvFactory
    from agentflow_core.pool.inprocess import InProcessPool
    from agentflow_core.rl.checkpoint import CheckpointManager, load_checkpoint
    from agentflow_core.rl.policy import ActorCritic
    from agentflow_core.rl.ppo import PPO
    from tasks.compose import reward_function
    from tasks.oscar_site import live_site
    from tasks.steps.train import reward_transform

    cfg = ctx.cfg
    vocab = ctx.vocabulary
    start = load_checkpoint(Path(checkpoint), vocabulary=vocab)
    policy = ActorCritic(vocab.obs_dim, vocab.n_actions, start.state["hidden_sizes"])
    policy.load_state_dict(start.model)
    n_steps = min(N_STEPS, total_steps)
    train_cfg = cfg.train.model_copy(
        update={"num_envs": 1, "n_steps": n_steps, "minibatch_size": n_steps, "total_steps": total_steps}
    )
    # one env worker: its env is made and stepped on the worker's step thread, where its browser lives
    pool_cfg = cfg.pool.model_copy(update={"num_workers": 1, "step_isolation": "thread", "scheduler": "round_robin"})
    manager = CheckpointManager(checkpoints, 1, 1e9, vocabulary=vocab)
    curve: list[dict[str, float]] = []
    config_dir = Path(cfg.stress.sim_to_real.oscar_env_config_dir)
    with live_site(site, config_dir) as entry:
        factory = RegistryEnvFactory({site.env_id: entry})
        pool = InProcessPool(variants, factory, 1, pool_cfg, seed=cfg.base.seed)
        try:
            with reward_function(ctx, 1) as reward_fn:
                ppo = PPO(
                    policy, pool, train_cfg, seed=cfg.base.seed, reward_transform=reward_transform(cfg, pool, reward_fn)
                )
                while ppo.global_step < total_steps:
                    metrics = ppo.train_iteration()
                    curve.append(  # a rollout in which no episode ended has no success rate (NaN): left out
                        {
                            k: float(metrics[k])
                            for k in ("global_step", "rollout/success_rate", "losses/approx_kl")
                            if k in metrics and math.isfinite(metrics[k])
                        }
                    )
                    if on_update is not None:
                        on_update(ppo.update, train_cfg.num_updates, metrics)
            saved = manager.save(ppo, extra={"finetuned_on": site.env_id, "warm_start": checkpoint})
        finally:
            pool.close()
    return saved, curve
