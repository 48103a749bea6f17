"""Worker-side rollouts (RLlib's EnvRunner pattern): each env worker runs its own slots for a whole rollout.

Stepping a pool centrally costs the driver two worker round trips per pool step (the step, then the
autoreset's resets) and leaves the workers idle while the driver samples variants, builds infos and
runs the policy. Here the driver ships the policy weights once per rollout and every worker runs its
*slice* -- a fixed share of the slots, the variants of its catalogue slice, its own scheduler --
for all ``n_steps`` locally, then returns the whole slice in one call:

- :class:`SlicePool` is the unchanged :class:`~agentflow_core.pool.driver.PoolDriver` (scheduler,
  SAME_STEP autoreset, fault isolation, quarantine) over one worker's
  :class:`~agentflow_core.pool.worker.EnvWorker`, living next to it (inside the Ray actor);
- :func:`collect_slice` is the one per-step rollout loop (policy forward, pool step), run over a
  slice inside a worker, or over a whole :class:`EnvPool` in this process (:class:`CentralRollouts`);
- :class:`SlicedRollouts` is the driver side: it owns each slice's state (scheduler, pending PLR
  feedback, failure counts), ships it with the request and takes the new state back with the
  result. A worker therefore holds nothing a run needs: a lost worker's slice is simply run again,
  with the same request, on its replacement, and gives the same transitions.

Both backends run the same slices with the same requests (the in-process one calls them one after
the other), so they give the same rollouts and policies. Randomness is a pure function of
(run seed, update, slice): see :func:`slice_seeds`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from agentflow_core.config import PoolConfig
from agentflow_core.contracts import EnvPool, PoolBatch, StatefulScheduler, VariantLike
from agentflow_core.pool.base import PoolError
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.strategies import make_scheduler
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
    """What a worker returns: its transitions, its slice's new state and the rollout's pool counters."""

    rollout: RolloutSlice
    state: SliceState
    counters: dict[str, int]


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
        super().__init__(variants, num_slots, config, scheduler, n_workers=1)

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
                self._policy = ActorCritic(hidden_sizes=request.hidden_sizes)
        self._policy.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()})
        generator = torch.Generator().manual_seed(request.sample_seed)
        rollout = collect_slice(pool, self._policy, request.n_steps, request.reset_seed, generator, pool.global_index)
        return SliceResult(rollout, pool.dump(), dict(pool.counters))


# ---------------------------------------------------------------------------------------- driver side
class SliceBackend(Protocol):
    """Where the slices run: env workers in this process, or Ray actors (``RayPool.run_rollouts``)."""

    n_workers: int
    worker_of: np.ndarray
    loss_events: list[dict[str, float]]

    def run_rollouts(self, requests: Mapping[int, SliceRequest], weights: Weights) -> dict[int, SliceResult | None]:
        """Run every worker's request concurrently; ``None`` marks a worker lost (and already replaced)."""

    def stats(self) -> dict[str, Any]:
        """The pool's stats (worker restarts, recoveries, per-worker env counts)."""

    def close(self) -> None:
        """Release the workers."""


class InProcessSlices:
    """The in-process backend of worker-side rollouts: the slices one after the other in this process."""

    def __init__(self, pool: Any) -> None:  # an InProcessPool, whose env workers host the slices
        self.pool = pool
        self.n_workers, self.worker_of, self.loss_events = pool.n_workers, pool.worker_of, pool.loss_events
        self.runners = [SliceRunner(worker) for worker in pool.workers]

    def run_rollouts(self, requests: Mapping[int, SliceRequest], weights: Weights) -> dict[int, SliceResult | None]:
        """Each request on its worker, in worker order (an in-process worker cannot be lost)."""
        return {w: self.runners[w].rollout(request, weights) for w, request in requests.items()}

    def stats(self) -> dict[str, Any]:
        """The in-process pool's stats."""
        return dict(self.pool.stats())

    def close(self) -> None:
        """Close every env of every worker."""
        self.pool.close()


class _SlicedSchedulers:
    """The slices' schedulers as one checkpointable scheduler (:class:`StatefulScheduler`)."""

    def __init__(self, owner: SlicedRollouts) -> None:
        self.owner = owner

    def state_dict(self) -> dict[str, Any]:
        """One scheduler state per slice, in worker order."""
        return {"slices": [s.scheduler.state_dict() for s in self.owner.states.values()]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; a checkpoint of a centrally stepped pool does not fit."""
        slices = state.get("slices")
        if slices is None or len(slices) != len(self.owner.states):
            raise PoolError(
                f"the checkpoint's scheduler state is not one of {len(self.owner.states)} rollout slices "
                "(saved by a run with another pool layout)"
            )
        for s, saved in zip(self.owner.states.values(), slices, strict=True):
            s.scheduler.load_state_dict(saved)


_COUNTERS = ("steps", "episodes", "successes", "steps_lost")


class SlicedRollouts:
    """The driver side of worker-side rollouts over ``num_envs`` slots and a catalogue of variants.

    Worker ``w`` owns a fixed share of the slots (:func:`numpy.array_split` order, so slots are
    worker-major) and the variants ``stable_worker`` assigns it; its scheduler is built from
    ``(seed, w)``. A worker lost mid-rollout is replaced by the backend; its slice is run again with
    the same request, and the discarded attempt is counted (``worker_lost`` per slot, ``steps_lost``
    the slice's whole rollout, an upper bound on what the dead worker had done).
    """

    def __init__(
        self,
        backend: SliceBackend,
        variants: Sequence[VariantLike],
        num_envs: int,
        config: PoolConfig,
        seed: int = 0,
    ) -> None:
        self.backend, self.config = backend, config
        self._variants = list(variants)
        self.num_envs = int(num_envs)
        hosts = [w for w in range(backend.n_workers) if (backend.worker_of == w).any()]
        if not hosts:
            raise PoolError("the variant catalogue is empty")
        self.slots = dict(zip(hosts, np.array_split(np.arange(self.num_envs), len(hosts)), strict=True))
        self.slots = {w: s for w, s in self.slots.items() if len(s)}
        self.global_index = {w: np.flatnonzero(backend.worker_of == w) for w in self.slots}
        self.local_of = np.full(len(self._variants), -1, np.int64)
        for idx in self.global_index.values():
            self.local_of[idx] = np.arange(len(idx))
        self.states = {
            w: SliceState(
                make_scheduler(config.scheduler, len(idx), np.random.default_rng([seed, w]), config),
                np.full(len(idx), np.nan),
                np.zeros(len(idx), np.int64),
            )
            for w, idx in self.global_index.items()
        }
        self.counters = dict.fromkeys((*_COUNTERS, "worker_lost"), 0)
        self.failure_counters: dict[str, int] = {}

    @property
    def variants(self) -> Sequence[VariantLike]:
        """The catalogue, indexed by ``variant_index``."""
        return self._variants

    @property
    def scheduler(self) -> StatefulScheduler:
        """The slices' schedulers, checkpointed together."""
        return _SlicedSchedulers(self)

    def collect(self, policy: ActorCritic, n_steps: int, seed: int, update: int) -> list[RolloutSlice]:
        """One rollout of every slice (policy weights shipped once), in slot order."""
        weights = {k: v.detach().cpu().numpy().copy() for k, v in policy.state_dict().items()}
        requests = {}
        for w, slots in self.slots.items():
            reset_seed, sample_seed = slice_seeds(seed, update, w)
            requests[w] = SliceRequest(
                w,
                len(slots),
                self.global_index[w],
                self.states[w],
                self.config,
                n_steps,
                reset_seed,
                sample_seed,
                tuple(policy.hidden_sizes),
            )
        results: dict[int, SliceResult] = {}
        pending = dict(requests)
        while pending:
            for w, res in self.backend.run_rollouts(pending, weights).items():
                if res is None:  # lost and replaced: the same request again gives the same slice
                    self.counters["worker_lost"] += len(self.slots[w])
                    self.counters["steps_lost"] += n_steps * len(self.slots[w])
                    logger.warning("pool: worker %d lost mid-rollout; its slice runs again on the replacement", w)
                    continue
                results[w] = res
                del pending[w]
        for w, res in results.items():
            self.states[w] = res.state
            for name, count in res.counters.items():
                if name in _COUNTERS:
                    self.counters[name] += count
                elif count:
                    self.failure_counters[name] = self.failure_counters.get(name, 0) + count
        return [results[w].rollout for w in self.slots]

    def set_value_loss(
        self, variant_indices: Sequence[int] | np.ndarray, value_loss: Sequence[float] | np.ndarray
    ) -> None:
        """PLR feedback per catalogue variant, routed to the slice that schedules it."""
        idx = np.asarray(variant_indices, np.int64)
        loss = np.asarray(value_loss, np.float64)
        hosts = self.backend.worker_of[idx]
        for w, state in self.states.items():
            sel = hosts == w
            state.value_loss = state.value_loss.copy()  # a result from Ray is read-only
            state.value_loss[self.local_of[idx[sel]]] = loss[sel]

    def feedback_state(self) -> list[float | None]:
        """Pending feedback per catalogue variant (JSON-able), as :meth:`EnvPool.feedback_state`."""
        out: list[float | None] = [None] * len(self._variants)
        for w, state in self.states.items():
            for g, x in zip(self.global_index[w].tolist(), state.value_loss.tolist(), strict=True):
                out[g] = None if np.isnan(x) else float(x)
        return out

    def load_feedback_state(self, state: Sequence[float | None]) -> None:
        """Inverse of :meth:`feedback_state`."""
        if len(state) != len(self._variants):
            raise PoolError(f"feedback state has {len(state)} variants, the pool has {len(self._variants)}")
        values = np.array([np.nan if x is None else x for x in state], dtype=np.float64)
        for w, s in self.states.items():
            s.value_loss = values[self.global_index[w]]

    def stats(self) -> dict[str, Any]:
        """The backend's stats with this driver's counters (steps, episodes, worker_lost, steps_lost, failures)."""
        out = self.backend.stats()
        out.update(self.counters)
        out.update(self.failure_counters)
        env_id = {g: v.env_id for g, v in enumerate(self._variants)}
        quarantined: dict[str, str] = {}
        failing: dict[str, int] = {}
        for w, state in self.states.items():
            index = self.global_index[w]
            quarantined.update({env_id[int(index[v])]: r for v, r in state.quarantined.items()})
            failing.update(
                {env_id[int(index[v])]: int(state.failures[v]) for v in np.flatnonzero(state.failures).tolist()}
            )
        out["quarantined"] = dict(sorted(quarantined.items()))
        out["failing_variants"] = dict(sorted(failing.items()))
        out["num_envs"] = self.num_envs
        return out

    def close(self) -> None:
        """Release the workers."""
        self.backend.close()


class CentralRollouts:
    """Rollouts of an arbitrary :class:`EnvPool` stepped from this process: one slice, the whole pool."""

    def __init__(self, pool: EnvPool) -> None:
        self.pool = pool
        self.num_envs = int(pool.num_envs)

    @property
    def variants(self) -> Sequence[VariantLike]:
        """The pool's catalogue."""
        return self.pool.variants

    @property
    def scheduler(self) -> StatefulScheduler:
        """The pool's scheduler."""
        return self.pool.scheduler

    def collect(self, policy: ActorCritic, n_steps: int, seed: int, update: int) -> list[RolloutSlice]:
        """One slice over every slot, seeded as slice 0."""
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


RolloutSource = SlicedRollouts | CentralRollouts


def rollout_source(pool: EnvPool | SlicedRollouts) -> RolloutSource:
    """Worker-side rollouts when the pool offers them, else the pool stepped from this process."""
    return pool if isinstance(pool, SlicedRollouts) else CentralRollouts(pool)
