"""The rollout loop over any :class:`EnvPool`, and the rollout source that runs it from the learner's process.

:func:`collect_slice` is CleanRL's rollout: reset, then ``n_steps`` of one batched no-grad forward
and one pool step, written into a :class:`~agentflow_core.contracts.RolloutSlice`. It runs inside
an env worker over that worker's slice (:mod:`agentflow_core.pool.slices`) or here over a whole
pool (:class:`CentralRollouts`). Randomness is a pure function of (run seed, update, slice):
:func:`slice_seeds`. The learner takes either kind of source through the
:class:`~agentflow_core.contracts.RolloutSource` protocol (:func:`rollout_source`), so nothing in
``rl`` imports the pool package that hosts the envs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch

from agentflow_core.contracts import EnvPool, RolloutSlice, RolloutSource, StatefulScheduler, VariantLike
from agentflow_core.rl.policy import ActorCritic


def slice_seeds(seed: int, update: int, worker: int) -> tuple[int, int]:
    """(pool reset seed, action sampling seed) of one slice's rollout: a pure function of its arguments.

    Nothing carries over from one rollout to the next, so a resumed run (and a slice run again on
    a replacement worker) draws exactly what an uninterrupted one draws.
    """
    reset_seed, sample_seed = np.random.SeedSequence([seed, update, worker]).generate_state(2, dtype=np.uint32)
    return int(reset_seed), int(sample_seed)


def collect_slice(
    pool: EnvPool,
    policy: ActorCritic,
    n_steps: int,
    reset_seed: int,
    generator: torch.Generator,
    variant_ids: np.ndarray | None = None,
) -> RolloutSlice:
    """The rollout loop: reset ``pool`` from ``reset_seed``, then ``n_steps`` of one batched forward + one pool step.

    ``variant_ids`` maps the pool's variant indices to the catalogue's (a slice pool numbers its
    own variants from 0). Runs under ``torch.no_grad`` on the policy's device.
    """
    device = next(policy.parameters()).device
    batch = pool.reset(seed=reset_seed)
    out = RolloutSlice.empty(n_steps, pool.num_envs, policy.obs_dim, policy.n_actions)
    with torch.no_grad():
        for t in range(n_steps):
            out.obs[t], out.masks[t] = batch.obs, batch.action_mask
            obs = torch.from_numpy(out.obs[t]).to(device)
            mask = torch.from_numpy(out.masks[t]).to(device)
            action, logprob, value = policy.sample(obs, mask, generator=generator)
            out.actions[t], out.logprobs[t], out.values[t] = action.cpu(), logprob.cpu(), value.cpu()
            batch = pool.step(out.actions[t])
            out.rewards[t], out.terminated[t], out.truncated[t] = batch.reward, batch.terminated, batch.truncated
            out.final_obs[t] = batch.final_obs
            infos = batch.infos
            out.variant_index[t] = [info.get("variant_index", -1) for info in infos]
            out.risk[t] = [info.get("risk", 0.0) for info in infos]
            for i in np.flatnonzero(batch.terminated | batch.truncated).tolist():
                info = infos[i]
                out.episode_return[t, i] = float(info.get("episode_return", np.nan))
                out.episode_length[t, i] = int(info.get("episode_length", 0))
                out.success[t, i] = bool(info.get("success", False))
    out.last_obs, out.last_masks = batch.obs, batch.action_mask
    if variant_ids is not None:
        known = out.variant_index >= 0
        out.variant_index[known] = variant_ids[out.variant_index[known]]
    return out


class CentralRollouts:
    """Rollouts of an arbitrary :class:`EnvPool` stepped from this process: one slice, the whole pool."""

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self.num_envs = int(pool.num_envs)
        self.rollout_started_at = 0.0  # when the last rollout collected began (perf_counter)

    @property
    def variants(self) -> Sequence[VariantLike]:
        """The pool's catalogue."""
        return self.pool.variants

    @property
    def scheduler(self) -> StatefulScheduler:
        """The pool's scheduler."""
        return self.pool.scheduler

    def prefetch(self, policy: ActorCritic, n_steps: int, seed: int, update: int) -> None:
        """Nothing to send ahead: this process steps the pool itself, in :meth:`collect`."""

    def collect(self, policy: ActorCritic, n_steps: int, seed: int, update: int) -> list[RolloutSlice]:
        """One slice over every slot, seeded as slice 0."""
        self.rollout_started_at = time.perf_counter()
        reset_seed, sample_seed = slice_seeds(seed, update, 0)
        device = next(policy.parameters()).device
        generator = torch.Generator(device=device).manual_seed(sample_seed)
        return [collect_slice(self.pool, policy, n_steps, reset_seed, generator)]

    def set_value_loss(
        self, variant_indices: Sequence[int] | np.ndarray, value_loss: Sequence[float] | np.ndarray
    ) -> None:
        """The pool's PLR feedback."""
        self.pool.set_value_loss(variant_indices, value_loss)

    def feedback_state(self) -> list[float | None]:
        """The pool's pending feedback."""
        return self.pool.feedback_state()

    def load_feedback_state(self, state: Sequence[float | None]) -> None:
        """Restore the pool's pending feedback."""
        self.pool.load_feedback_state(state)


def rollout_source(pool: EnvPool | RolloutSource[ActorCritic]) -> RolloutSource[ActorCritic]:
    """The pool itself when it is a rollout source (worker-side rollouts), else the pool stepped from this process."""
    return pool if isinstance(pool, RolloutSource) else CentralRollouts(pool)
