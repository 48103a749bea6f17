"""Fine-tuning on the django-oscar store: PPO continues from the champion on Oscar's own pages, a small budget.

``agentflow train --channel oscar`` runs :func:`finetune_on_oscar`:

1. **before**: the champion on the stress phase's Oscar episodes (the test split's stratified sample,
   paired with the simulator: :func:`tasks.real_channels.run_sim_to_real_oscar`);
2. **fine-tune**: PPO from the champion's weights on variants of the paired family's *train* split,
   stratified over the dimensions that apply on Oscar (``stress.sim_to_real.oscar_dimensions``), their
   envs on a live store (:mod:`tasks.oscar_site`), stepped in this thread by :class:`SiteRollouts`. One
   env: every episode restores the store's one database, so two envs would overwrite each other's
   baskets. ``train``'s PPO settings apply, with ``n_steps`` and ``minibatch_size`` cut to the budget (a
   real step takes 0.1-0.5 s with the faults);
3. **after**: the fine-tuned policy on the same Oscar episodes as *before*.

Writes ``<out>/checkpoints/`` (the fine-tuned policy, loadable like training's) and ``<out>/summary.json``
(before, after, the per-update curve); the report shows before and after when the summary exists.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.atomic import write_json
from agentflow_core.contracts import RolloutSlice
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.sim_to_real import stratify
from agentflow_core.evaluation.stress import stratified_sample
from agentflow_core.registry import EnvEntry
from agentflow_core.semantics import Vocabulary
from agentflow_core.variants import VariantSpec
from tasks.context import PhaseContext
from tasks.oscar_site import site_entry_of, site_pairing
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


def oscar_train_variants(ctx: PhaseContext, count: int, site: EnvEntry) -> list[VariantSpec]:
    """Train-split variants of the site's paired family stratified over Oscar's dimensions, re-based on the site env.

    Only the scenario fields the store accepts are kept in the params (the others take the Oscar env's
    defaults), as the stress phase's Oscar episodes do.
    """
    dimensions = list(ctx.cfg.stress.sim_to_real.oscar_dimensions)
    paired, accepted = site_pairing(site, dimensions)
    train = [v for v in load_variants(ctx, split="train") if v.family == paired]
    return [
        dataclasses.replace(v, base_env_id=site.env_id, params={k: v.params[k] for k in accepted if k in v.params})
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
    variants = oscar_train_variants(ctx, max(settings.oscar_episodes, 8), site)
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
    """PPO from ``checkpoint``'s weights on ``variants`` (one env on a live site); the saved checkpoint, the curve."""
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
    manager = CheckpointManager(checkpoints, 1, 1e9, vocabulary=vocab)
    curve: list[dict[str, float]] = []
    with live_site(site, Path(cfg.stress.sim_to_real.oscar_env_config_dir)) as entry:
        rollouts = SiteRollouts(variants, lambda v: entry.make(v.params, v.env_id), vocab)
        try:
            with reward_function(ctx, 1) as reward_fn:
                shaped = reward_transform(cfg, rollouts, reward_fn)
                ppo = PPO(policy, rollouts, train_cfg, seed=cfg.base.seed, reward_transform=shaped)
                while ppo.global_step < total_steps:
                    metrics = ppo.train_iteration()
                    keys = ("global_step", "rollout/success_rate", "losses/approx_kl")
                    # a rollout in which no episode ended has no success rate (NaN): left out
                    curve.append({k: float(metrics[k]) for k in keys if k in metrics and math.isfinite(metrics[k])})
                    if on_update is not None:
                        on_update(ppo.update, train_cfg.num_updates, metrics)
            saved = manager.save(ppo, extra={"finetuned_on": site.env_id, "warm_start": checkpoint})
        finally:
            rollouts.close()
    return saved, curve


@dataclass
class _Cycle:
    """The variants in catalogue order, cyclically (checkpointed like a pool's scheduler)."""

    n_variants: int
    cursor: int = 0

    def next(self) -> int:
        index, self.cursor = self.cursor, (self.cursor + 1) % self.n_variants
        return index

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.cursor = int(state["cursor"])


class SiteRollouts:
    """PPO's rollout source over one env of a live site, stepped in this thread.

    Not a pool: a pool steps its envs on a helper thread, and Playwright's objects belong to the thread
    that made them (closing them from another fails). One env, because every episode restores the site's
    one database. Like the pool's rollouts (:func:`agentflow_core.rl.rollout.collect_slice`), each rollout
    starts fresh episodes, seeded from (run seed, update), and records the SAME_STEP autoreset layout.
    """

    num_envs = 1

    def __init__(self, variants: list[VariantSpec], make: Callable[[VariantSpec], Any], vocabulary: Vocabulary) -> None:
        self._variants, self._make, self.vocabulary = variants, make, vocabulary
        self._cycle = _Cycle(len(variants))
        self._env: Any = None
        self.rollout_started_at = 0.0

    @property
    def variants(self) -> list[VariantSpec]:
        """The catalogue, indexed by the slices' ``variant_index``."""
        return self._variants

    @property
    def scheduler(self) -> _Cycle:
        """The variant cycle (its cursor goes into checkpoints)."""
        return self._cycle

    def prefetch(self, policy: Any, n_steps: int, seed: int, update: int) -> None:
        """Nothing to send ahead: this thread steps the env in :meth:`collect`."""

    def set_value_loss(self, variant_indices: Any, value_loss: Any) -> None:
        """No prioritised scheduling here: the feedback is not used."""

    def feedback_state(self) -> list[float | None]:
        """No pending feedback."""
        return []

    def load_feedback_state(self, state: Any) -> None:
        """Nothing to restore."""

    def _start(self, rng: np.random.Generator) -> tuple[int, Any, np.ndarray, dict[str, Any]]:
        """The next variant's episode on a fresh env (made before the last one closes: the browser stays up)."""
        index = self._cycle.next()
        env, previous = self._make(self._variants[index]), self._env
        self._env = env
        if previous is not None:
            previous.close()
        obs, info = env.reset(seed=int(rng.integers(0, 2**31 - 1)))
        return index, env, obs, info

    def collect(self, policy: Any, n_steps: int, seed: int, update: int) -> list[RolloutSlice]:
        """One rollout of ``n_steps`` on the site, from fresh episodes."""
        import torch

        from agentflow_core.rl.rollout import slice_seeds

        self.rollout_started_at = time.perf_counter()
        reset_seed, sample_seed = slice_seeds(seed, update, 0)
        rng = np.random.default_rng(reset_seed)
        generator = torch.Generator().manual_seed(sample_seed)
        out = RolloutSlice.empty(n_steps, 1, policy.obs_dim, policy.n_actions)
        index, env, obs, info = self._start(rng)
        episode_return, length = 0.0, 0
        with torch.no_grad():
            for t in range(n_steps):
                out.obs[t, 0], out.masks[t, 0] = obs, info["action_mask"]
                action, logprob, value = policy.sample(
                    torch.from_numpy(out.obs[t]), torch.from_numpy(out.masks[t]), generator=generator
                )
                out.actions[t], out.logprobs[t], out.values[t] = action, logprob, value
                obs, reward, terminated, truncated, info = env.step(int(action[0]))
                episode_return, length = episode_return + float(reward), length + 1
                out.rewards[t, 0], out.terminated[t, 0], out.truncated[t, 0] = reward, terminated, truncated
                out.variant_index[t, 0], out.risk[t, 0] = index, float(info.get("risk", 0.0))
                if terminated or truncated:
                    params = self._variants[index].params
                    out.final_obs[t, 0] = obs
                    out.episode_return[t, 0], out.episode_length[t, 0] = episode_return, length
                    out.success[t, 0] = self.vocabulary.process_success(params, info["tokens"], terminated)
                    index, env, obs, info = self._start(rng)
                    episode_return, length = 0.0, 0
        out.last_obs[0], out.last_masks[0] = obs, info["action_mask"]
        return [out]

    def close(self) -> None:
        """Close the env (in this thread, where it was made)."""
        if self._env is not None:
            self._env.close()
            self._env = None
