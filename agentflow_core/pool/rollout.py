"""Worker-side rollouts (RLlib's EnvRunner pattern): each env worker runs its own slots for a whole rollout.

Stepping a pool centrally costs the driver two worker round trips per pool step (the step, then the
autoreset's resets) and leaves the workers idle while the driver samples variants, builds infos and
runs the policy. Here the driver ships the policy weights once per rollout and every worker runs its
*slice* -- a fixed share of the slots, the variants of its catalogue slice, its own scheduler --
for all ``n_steps`` locally, then returns the whole slice in one call:

- (:mod:`agentflow_core.pool.slices`, the worker side) :class:`SlicePool` is the unchanged :class:`~agentflow_core.pool.driver.PoolDriver` (scheduler,
  SAME_STEP autoreset, fault isolation, quarantine) over one worker's
  :class:`~agentflow_core.pool.worker.EnvWorker`, living next to it (inside the Ray actor);
- :func:`~agentflow_core.rl.rollout.collect_slice` is the one per-step rollout loop (policy forward,
  pool step), run over a slice inside a worker, or over a whole :class:`EnvPool` in this process
  (:class:`~agentflow_core.rl.rollout.CentralRollouts`);
- :class:`SlicedRollouts` is the driver side: it owns each slice's state (scheduler, pending PLR
  feedback, failure counts), ships it with the request and takes the new state back with the
  result. A worker therefore holds nothing a run needs: a lost worker's slice is simply run again,
  with the same request, on its replacement, and gives the same transitions.

Both backends run the same slices with the same requests (the in-process one calls them one after
the other), so they give the same rollouts and policies. Randomness is a pure function of
(run seed, update, slice): see :func:`~agentflow_core.rl.rollout.slice_seeds`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.contracts import RolloutSlice, StatefulScheduler, VariantLike
from agentflow_core.pool.base import InFlight, PoolError
from agentflow_core.pool.episodes import (
    EVAL_KEY_BASE,
    ActorSpec,
    EpisodePlayer,
    EpisodeRecord,
    EvalRequest,
    actor_weights,
    episode_seed,
)
from agentflow_core.pool.slices import SliceRequest, SliceResult, SliceRunner, SliceState, Weights
from agentflow_core.pool.strategies import make_scheduler
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.rollout import slice_seeds

logger = logging.getLogger("agentflow.pool")


# ---------------------------------------------------------------------------------------- driver side
class SliceBackend(Protocol):
    """Where the slices run: env workers in this process, or Ray actors (``RayPool.run_rollouts``)."""

    n_workers: int
    worker_of: np.ndarray
    loss_events: list[dict[str, float]]

    def run_rollouts(self, requests: Mapping[int, SliceRequest], weights: Weights) -> dict[int, SliceResult | None]:
        """Run every worker's request concurrently; ``None`` marks a worker lost (and already replaced)."""

    def submit_rollouts(
        self, requests: Mapping[int, SliceRequest], weights: Weights
    ) -> InFlight[dict[int, SliceResult | None]]:
        """:meth:`run_rollouts`, answered by the returned ticket's ``result()``."""

    def run_evaluations(
        self, requests: Mapping[int, EvalRequest], weights: Weights | None
    ) -> dict[int, list[EpisodeRecord] | None]:
        """Every worker plays its evaluation episodes concurrently; ``None`` marks a worker lost (and replaced)."""

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
        self.players = [EpisodePlayer(worker) for worker in pool.workers]

    def run_rollouts(self, requests: Mapping[int, SliceRequest], weights: Weights) -> dict[int, SliceResult | None]:
        """Each request on its worker, in worker order (an in-process worker cannot be lost)."""
        return {w: self.runners[w].rollout(request, weights) for w, request in requests.items()}

    def submit_rollouts(
        self, requests: Mapping[int, SliceRequest], weights: Weights
    ) -> InFlight[dict[int, SliceResult | None]]:
        """The rollouts, run when the ticket's ``result()`` asks (this process has no one to hand them to)."""
        requests = dict(requests)
        return InFlight(lambda: self.run_rollouts(requests, weights), deferred=True)

    def run_evaluations(
        self, requests: Mapping[int, EvalRequest], weights: Weights | None
    ) -> dict[int, list[EpisodeRecord] | None]:
        """Each worker's evaluation episodes, in worker order."""
        return {w: self.players[w].play(request, weights) for w, request in requests.items()}

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


@dataclass(frozen=True)
class _Prefetched:
    """A rollout sent ahead: the (n_steps, seed, update) it is for, its requests, weights and ticket."""

    key: tuple[int, int, int]
    requests: dict[int, SliceRequest]
    weights: Weights
    ticket: InFlight[dict[int, SliceResult | None]]


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
        self._eval_keys: dict[str, int] = {}  # evaluation variant env id -> its workers' catalogue key
        self._inflight: _Prefetched | None = None  # the next rollout, sent by prefetch
        self.rollout_started_at = 0.0  # when the workers began the last rollout collected (perf_counter)
        # seconds each worker spent stepping its slice, one row per rollout collected (workers in slot
        # order), and the rows in which a worker was lost: a replacement's speed against the other
        # workers' in the same rollouts, which a drift of the machine's speed moves alike
        self.worker_rollout_s: list[list[float]] = []
        self.lost_in_rollouts: list[int] = []

    @property
    def variants(self) -> Sequence[VariantLike]:
        """The catalogue, indexed by ``variant_index``."""
        return self._variants

    @property
    def scheduler(self) -> StatefulScheduler:
        """The slices' schedulers, checkpointed together."""
        return _SlicedSchedulers(self)

    def prefetch(self, policy: ActorCritic, n_steps: int, seed: int, update: int) -> None:
        """Send the rollout :meth:`collect` will ask for with these arguments now: Ray's workers start
        it while the driver logs, checkpoints and reports the update before. ``policy`` must not
        change until then (the weights go now); the slices' states are those of the previous rollout
        either way, so the rollout is the same one :meth:`collect` would send."""
        requests, weights = self._requests(policy, n_steps, seed, update)
        ticket = self.backend.submit_rollouts(requests, weights)
        self._inflight = _Prefetched((n_steps, seed, update), requests, weights, ticket)

    def _requests(
        self, policy: ActorCritic, n_steps: int, seed: int, update: int
    ) -> tuple[dict[int, SliceRequest], Weights]:
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
        return requests, weights

    def collect(self, policy: ActorCritic, n_steps: int, seed: int, update: int) -> list[RolloutSlice]:
        """One rollout of every slice (policy weights shipped once), in slot order: the prefetched one
        when :meth:`prefetch` sent it."""
        inflight, self._inflight = self._inflight, None
        ticket: InFlight[dict[int, SliceResult | None]] | None = None
        if inflight is not None and inflight.key == (n_steps, seed, update):
            requests, weights, ticket = inflight.requests, inflight.weights, inflight.ticket
        else:
            requests, weights = self._requests(policy, n_steps, seed, update)
        results: dict[int, SliceResult] = {}
        pending = dict(requests)
        started: float | None = None
        while pending:
            if ticket is None:
                ticket = self.backend.submit_rollouts(pending, weights)
            answers = ticket.result()
            started = ticket.started_at if started is None else started
            ticket = None
            for w, res in answers.items():
                if res is None:  # lost and replaced: the same request again gives the same slice
                    self.lost_in_rollouts.append(len(self.worker_rollout_s))
                    self.counters["worker_lost"] += len(self.slots[w])
                    self.counters["steps_lost"] += n_steps * len(self.slots[w])
                    logger.warning("pool: worker %d lost mid-rollout; its slice runs again on the replacement", w)
                    continue
                results[w] = res
                del pending[w]
        self.rollout_started_at = started if started is not None else time.perf_counter()
        self.worker_rollout_s.append([round(results[w].elapsed_s, 4) for w in self.slots])
        for w, res in results.items():
            self.states[w] = res.state
            for name, count in res.counters.items():
                if name in _COUNTERS:
                    self.counters[name] += count
                elif count:
                    self.failure_counters[name] = self.failure_counters.get(name, 0) + count
        return [results[w].rollout for w in self.slots]

    def evaluate(
        self,
        variants: Sequence[VariantLike],
        actor: ActorSpec,
        policy: ActorCritic | None,
        n_episodes: int,
        seed: int,
        num_envs: int,
    ) -> list[EpisodeRecord]:
        """Play ``ceil(n_episodes / len(variants))`` episodes of every variant on the training env workers.

        Episode ``j`` of variant ``i`` starts from :func:`episode_seed` ``(seed, i, j)``; variant ``i``
        goes to the ``i % workers``-th worker, which plays its share ``num_envs / workers`` slots at
        a time with ``actor`` (``policy``'s weights shipped once) and returns its records in one
        call. A worker lost meanwhile is replaced and plays its share again. Records come back
        sorted by (variant, episode).
        """
        per_variant = -(-int(n_episodes) // max(len(variants), 1))
        hosts = list(self.slots)
        slots_each = max(1, -(-int(num_envs) // len(hosts)))
        requests: dict[int, EvalRequest] = {}
        for i, variant in enumerate(variants):
            w = hosts[i % len(hosts)]
            request = requests.setdefault(w, EvalRequest({}, [], actor, slots_each, seed))
            key = self._eval_keys.setdefault(variant.env_id, EVAL_KEY_BASE + len(self._eval_keys))
            request.variants[key] = variant
            request.episodes.extend((i, j, key, episode_seed(seed, i, j)) for j in range(per_variant))
        weights = actor_weights(policy)
        records: list[EpisodeRecord] = []
        pending = dict(requests)
        while pending:
            for w, res in self.backend.run_evaluations(pending, weights).items():
                if res is None:
                    logger.warning("pool: worker %d lost mid-evaluation; its episodes run again on the replacement", w)
                    continue
                records.extend(res)
                del pending[w]
        return sorted(records, key=lambda r: (r.variant, r.episode))

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
