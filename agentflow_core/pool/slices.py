"""The worker side of worker-side rollouts (:mod:`agentflow_core.pool.rollout`): one slice, one call.

:class:`SliceRunner` lives next to an env worker (inside its Ray actor, or in this process): it
loads the policy weights and the slice's state a request carries, runs :func:`collect_slice` over
its :class:`SlicePool` (the unchanged :class:`~agentflow_core.pool.driver.PoolDriver` over that
worker's :class:`~agentflow_core.pool.worker.EnvWorker`) for ``n_steps`` and returns the slice and
the new state. Randomness is a pure function of (run seed, update, slice): :func:`slice_seeds`.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agentflow_core.config import PoolConfig
from agentflow_core.contracts import EnvPool, PoolBatch
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.worker import EnvWorker, WorkerBatch
from agentflow_core.rl.policy import ActorCritic

logger = logging.getLogger("agentflow.pool")

Weights = dict[str, np.ndarray]


def slice_seeds(seed: int, update: int, worker: int) -> tuple[int, int]:
    """(pool reset seed, action sampling seed) of one slice's rollout: a pure function of its arguments.

    Nothing carries over from one rollout to the next, so a resumed run (and a slice run again on
    a replacement worker) draws exactly what an uninterrupted one draws.
    """
    reset_seed, sample_seed = np.random.SeedSequence([seed, update, worker]).generate_state(2, dtype=np.uint32)
    return int(reset_seed), int(sample_seed)


# ---------------------------------------------------------------------------------------- the data
@dataclass
class RolloutSlice:
    """``n_steps`` x ``k`` slots of transitions, in SAME_STEP autoreset layout (row ``t`` = step ``t``).

    ``obs[t]``/``masks[t]`` is what the policy saw; ``rewards`` are the env's own rewards (the
    training reward is applied afterwards, in step order, by the learner); ``final_obs[t]`` is the
    last observation of an episode that ended at ``t``; ``last_obs``/``last_masks`` follow the
    last step (the bootstrap value's input). ``variant_index`` is the catalogue index of the
    episode that took step ``t``; ``episode_*`` hold the pool's episode stats where it ended.
    """

    obs: np.ndarray  # [T, k, OBS_DIM] float32
    masks: np.ndarray  # [T, k, N_ACTIONS] bool
    actions: np.ndarray  # [T, k] int64
    logprobs: np.ndarray  # [T, k] float32
    values: np.ndarray  # [T, k] float32
    rewards: np.ndarray  # [T, k] float32
    terminated: np.ndarray  # [T, k] bool
    truncated: np.ndarray  # [T, k] bool
    final_obs: np.ndarray  # [T, k, OBS_DIM] float32
    variant_index: np.ndarray  # [T, k] int64
    risk: np.ndarray  # [T, k] float32
    episode_return: np.ndarray  # [T, k] float64, NaN where no episode ended
    episode_length: np.ndarray  # [T, k] int64
    success: np.ndarray  # [T, k] bool
    last_obs: np.ndarray  # [k, OBS_DIM] float32
    last_masks: np.ndarray  # [k, N_ACTIONS] bool

    @classmethod
    def empty(cls, n_steps: int, k: int, obs_dim: int, n_actions: int) -> RolloutSlice:
        """Zeroed arrays for ``n_steps`` x ``k`` slots."""
        shape = (n_steps, k)
        return cls(
            obs=np.zeros((*shape, obs_dim), np.float32),
            masks=np.zeros((*shape, n_actions), bool),
            actions=np.zeros(shape, np.int64),
            logprobs=np.zeros(shape, np.float32),
            values=np.zeros(shape, np.float32),
            rewards=np.zeros(shape, np.float32),
            terminated=np.zeros(shape, bool),
            truncated=np.zeros(shape, bool),
            final_obs=np.zeros((*shape, obs_dim), np.float32),
            variant_index=np.full(shape, -1, np.int64),
            risk=np.zeros(shape, np.float32),
            episode_return=np.full(shape, np.nan),
            episode_length=np.zeros(shape, np.int64),
            success=np.zeros(shape, bool),
            last_obs=np.zeros((k, obs_dim), np.float32),
            last_masks=np.ones((k, n_actions), bool),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[RolloutSlice]) -> RolloutSlice:
        """The slices side by side (slot axis), in the given order."""
        if len(parts) == 1:
            return parts[0]
        names = cls.__dataclass_fields__
        return cls(
            **{n: np.concatenate([getattr(p, n) for p in parts], axis=0 if n.startswith("last_") else 1) for n in names}
        )

    @property
    def done(self) -> np.ndarray:
        """[T, k]: the step ended its episode (terminated or truncated)."""
        return self.terminated | self.truncated

    def reset_batch(self) -> PoolBatch:
        """The pool's reset batch of this rollout (what a reward's per-episode state starts from)."""
        k = self.obs.shape[1]
        zeros = np.zeros(k, bool)
        infos = [{"variant_index": int(v)} for v in self.variant_index[0].tolist()]
        return PoolBatch(self.obs[0], self.masks[0], np.zeros(k, np.float32), zeros, zeros, self.obs[0], infos)

    def step_batch(self, t: int) -> PoolBatch:
        """Pool step ``t`` as :class:`PoolBatch` with the infos a training reward reads (variant, risk)."""
        last = t + 1 == self.obs.shape[0]
        obs = self.last_obs if last else self.obs[t + 1]
        masks = self.last_masks if last else self.masks[t + 1]
        infos = [
            {"variant_index": v, "risk": r}
            for v, r in zip(self.variant_index[t].tolist(), self.risk[t].tolist(), strict=True)
        ]
        return PoolBatch(obs, masks, self.rewards[t], self.terminated[t], self.truncated[t], self.final_obs[t], infos)


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


# ---------------------------------------------------------------------------------------- worker side
@dataclass
class SliceState:
    """What a slice's pool driver carries from one rollout to the next; the driver process owns it."""

    scheduler: Any  # the slice's scheduler (agentflow_core.pool.scheduler.BaseScheduler), over local indices
    value_loss: np.ndarray  # [n_local] pending PLR feedback, NaN where none
    failures: np.ndarray  # [n_local] env failures per variant (quarantine counts)
    quarantined: dict[int, str] = field(default_factory=dict)


@dataclass
class SliceRequest:
    """One worker's part of a rollout: small, picklable data (the weights travel beside it, once)."""

    worker: int
    num_slots: int
    global_index: np.ndarray  # [n_local] catalogue index of each of the slice's variants
    state: SliceState
    config: PoolConfig
    n_steps: int
    reset_seed: int
    sample_seed: int
    hidden_sizes: tuple[int, ...]


@dataclass
class SliceResult:
    """What a worker returns: its transitions, its slice's new state, the rollout's pool counters and the
    seconds the worker spent stepping it (its own clock: no transfer or queueing in it)."""

    rollout: RolloutSlice
    state: SliceState
    counters: dict[str, int]
    elapsed_s: float = 0.0


class SlicePool(PoolDriver):
    """The pool driver over one worker's own slots and catalogue slice, in the worker's process.

    It numbers the slice's variants ``0..n_local-1`` (its scheduler's indices) and translates them
    to the catalogue indices the :class:`EnvWorker` is keyed by. Calls are plain method calls.
    """

    def __init__(
        self,
        worker: EnvWorker,
        global_index: np.ndarray,
        num_slots: int,
        config: PoolConfig,
        scheduler: Any,
    ) -> None:
        self.worker, self.global_index = worker, np.asarray(global_index, np.int64)
        variants = [worker.variants[g] for g in self.global_index.tolist()]
        super().__init__(variants, num_slots, config, scheduler, n_workers=1, vocabulary=worker.vocabulary)
        self.detach_after_s = None  # a slice waits for every step: its rollout is a function of its seeds

    def _invoke(self, calls: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, WorkerBatch | None]:
        out: dict[int, WorkerBatch | None] = {}
        for w, (method, args) in calls.items():
            if method == "reset":
                slots, variants, seeds = args
                args = (slots, self.global_index[variants], seeds)
            out[w] = getattr(self.worker, method)(*args)
        return out

    def _worker_call(self, worker: int, method: str, *args: Any) -> Any:
        return getattr(self.worker, method)(*args)

    def close(self) -> None:
        """Nothing to release: the envs belong to the worker, which outlives this driver."""

    def load(self, state: SliceState) -> None:
        """Continue from ``state`` (counters start from zero: each rollout reports its own)."""
        self.scheduler = state.scheduler
        self._value_loss, self.failures, self.quarantined = state.value_loss, state.failures, state.quarantined
        self.counters = dict.fromkeys(self.counters, 0)

    def dump(self) -> SliceState:
        """The state the next rollout of this slice continues from."""
        return SliceState(self.scheduler, self._value_loss, self.failures, self.quarantined)


class SliceRunner:
    """Runs rollout requests on one env worker: a policy copy plus a :class:`SlicePool` kept between calls."""

    def __init__(self, worker: EnvWorker) -> None:
        self.worker = worker
        self._pool: SlicePool | None = None
        self._pool_key: tuple[int, int, int] | None = None
        self._policy: ActorCritic | None = None

    def rollout(self, request: SliceRequest, weights: Weights) -> SliceResult:
        """Load the weights and the slice's state, run ``request.n_steps`` pool steps, return the slice."""
        key = (request.worker, request.num_slots, len(request.global_index))
        if self._pool is None or self._pool_key != key:
            self._pool = SlicePool(
                self.worker, request.global_index, request.num_slots, request.config, request.state.scheduler
            )
            self._pool_key = key
        pool = self._pool
        # a private, writable copy: Ray hands arguments over zero-copy (read-only arrays), and the
        # caller's state must stay as it was should this attempt be lost
        pool.load(copy.deepcopy(request.state))
        if self._policy is None or self._policy.hidden_sizes != tuple(request.hidden_sizes):
            # its initial weights are overwritten at once: building it must not draw from torch's global
            # generator, which an in-process run checkpoints (a resumed run builds it later than an
            # uninterrupted one, and their checkpoints would differ)
            with torch.random.fork_rng(devices=[]):
                vocabulary = pool.vocabulary
                self._policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, request.hidden_sizes)
        self._policy.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
        generator = torch.Generator().manual_seed(request.sample_seed)
        began = time.perf_counter()
        rollout = collect_slice(pool, self._policy, request.n_steps, request.reset_seed, generator, pool.global_index)
        return SliceResult(rollout, pool.dump(), dict(pool.counters), time.perf_counter() - began)
