"""The worker side of worker-side rollouts (:mod:`agentflow_core.pool.rollout`): one slice, one call.

:class:`SliceRunner` lives next to an env worker (inside its Ray actor, or in this process): it
loads the policy weights and the slice's state a request carries, runs :func:`~agentflow_core.rl.rollout.collect_slice` over
its :class:`SlicePool` (the unchanged :class:`~agentflow_core.pool.driver.PoolDriver` over that
worker's :class:`~agentflow_core.pool.worker.EnvWorker`) for ``n_steps`` and returns the slice and
the new state. Randomness is a pure function of (run seed, update, slice): :func:`~agentflow_core.rl.rollout.slice_seeds`.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agentflow_core.config import PoolConfig
from agentflow_core.contracts import RolloutSlice
from agentflow_core.pool.batch import WorkerBatch
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.worker import EnvWorker
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.rollout import collect_slice

logger = logging.getLogger("agentflow.pool")

Weights = dict[str, np.ndarray]


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
        super().__init__(variants, num_slots, config, scheduler, n_workers=1, seed=0, vocabulary=worker.vocabulary)
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
