"""Driver-side pool logic shared by :class:`InProcessPool` and :class:`RayPool`.

The driver owns the slots: which variant each slot is playing, episode returns and lengths,
the scheduler, per-variant failure counts and quarantine. Workers only host envs. A pool step is
at most two rounds of worker calls (all workers in parallel each round): step every live slot,
then reset the slots whose episodes ended on the variants the scheduler picked (SAME_STEP).
Subclasses supply the transport (:meth:`PoolDriver._invoke`) and worker recovery.
"""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import (
    POOL_FAILURES,
    STEP_PENDING,
    WORKER_LOST,
    PoolBatch,
    PoolError,
    VariantLike,
    as_variant_list,
)
from agentflow_core.pool.batch import WorkerBatch
from agentflow_core.pool.scheduler import EpisodeStats
from agentflow_core.pool.step_infos import LazyInfoBatch, SlotInfoRows, SlotInfos
from agentflow_core.semantics import Vocabulary
from agentflow_core.variants import stable_worker

logger = logging.getLogger("agentflow.pool")

# A slot whose resets keep failing (every sampled variant broken) stops the pool instead of spinning.
MAX_RESET_ROUNDS = 16
# How often a pool step whose every slot is pending asks again whether one of them returned.
PENDING_POLL_S = 0.005


def _all_pending(results: dict[int, WorkerBatch | None]) -> bool:
    return all(res is not None and all(r == STEP_PENDING for r in res.failure_reason) for res in results.values())


class PoolDriver(ABC):
    """Slots, scheduling, SAME_STEP autoreset and fault accounting over ``n_workers`` env workers."""

    def __init__(
        self,
        variants: Sequence[VariantLike],
        num_envs: int,
        config: PoolConfig,
        scheduler: Any,
        n_workers: int,
        seed: int,
        vocabulary: Vocabulary,
    ) -> None:
        if num_envs < 1:
            raise PoolError(f"num_envs must be >= 1, got {num_envs}")
        self.variants = as_variant_list(variants)
        self.num_envs = int(num_envs)
        self.config = config
        self.scheduler = scheduler
        self.n_workers = max(int(n_workers), 1)
        # the widths, goal and token names of the process the envs speak
        self.vocabulary = vocabulary
        self._n_tokens = vocabulary.n_tokens
        self._goal = vocabulary.token_index()[vocabulary.goal]
        self._token_names = np.array(vocabulary.tokens, dtype=object)
        self.env_ids = [v.env_id for v in self.variants]
        self.variant_hashes = [v.content_hash for v in self.variants]
        self._slot_infos = SlotInfos(self.env_ids, self.variant_hashes, self._token_names)
        self.worker_of = np.fromiter(
            (stable_worker(e, self.n_workers) for e in self.env_ids), np.int64, len(self.env_ids)
        )
        self._rng = np.random.default_rng(seed)
        n = self.num_envs
        self._slot_variant = np.full(n, -1, np.int64)
        self._slot_live = np.zeros(n, bool)
        self._obs = np.zeros((n, vocabulary.obs_dim), np.float32)
        self._mask = np.ones((n, vocabulary.n_actions), bool)
        self._ep_return = np.zeros(n, np.float64)
        self._ep_length = np.zeros(n, np.int64)
        self._step_id = np.zeros(n, np.int64)
        self._ep_seed = np.zeros(n, np.int64)
        self._ep_tokens = np.zeros((n, vocabulary.n_tokens), bool)
        # Slots whose step has not returned (and the action it was given): left out of the pool steps
        # until it does. ``detach_after_s`` None waits for every step (deterministic, e.g. training slices).
        self.detach_after_s: float | None = config.step_patience_s
        self._pending = np.zeros(n, bool)
        self._pending_action = np.zeros(n, np.int64)
        self._value_loss = np.full(len(self.variants), np.nan)
        self.failures = np.zeros(len(self.variants), np.int64)
        self.quarantined: dict[int, str] = {}
        self.worker_restarts = 0
        self._restart_times: deque[float] = deque()
        self.clock: Callable[[], float] = time.monotonic
        self.counters: dict[str, int] = {
            "steps": 0,
            "episodes": 0,
            "successes": 0,
            "steps_lost": 0,  # steps of the episodes that closed with worker_lost
            **{r: 0 for r in sorted(POOL_FAILURES)},
        }
        # one entry per lost worker: {"worker", "detected_at" (monotonic s), "restored_at"}
        self.loss_events: list[dict[str, float]] = []

    # ------------------------------------------------------------------ transport (subclasses)
    @abstractmethod
    def _invoke(self, calls: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, WorkerBatch | None]:
        """Run ``{worker: (method, args)}`` concurrently; ``None`` marks a worker lost (and recovered)."""

    @abstractmethod
    def _worker_call(self, worker: int, method: str, *args: Any) -> Any:
        """One call on one worker, for stats and bookkeeping (not on the hot path)."""

    def _worker_lost(self, worker: int, error: BaseException) -> None:
        """Count a lost worker; past ``max_worker_restarts`` within ``restart_window_s`` the pool stops.

        The budget is per window, not per life: a multi-day run that loses a worker now and then
        keeps going, while a crash loop still stops it with :class:`PoolError`.
        """
        now, window = self.clock(), self.config.restart_window_s
        self.worker_restarts += 1
        self._restart_times.append(now)
        while self._restart_times and self._restart_times[0] <= now - window:
            self._restart_times.popleft()
        recent = len(self._restart_times)
        logger.error(
            "pool: worker %d lost (%s: %s); restart %d of %d in the last %gs",
            worker,
            type(error).__name__,
            error,
            recent,
            self.config.max_worker_restarts,
            window,
        )
        if recent > self.config.max_worker_restarts:
            raise PoolError(
                f"worker {worker} lost again ({type(error).__name__}); the pool already restarted workers "
                f"{recent - 1} times in the last {window:g}s (max_worker_restarts={self.config.max_worker_restarts})"
            ) from error

    # ------------------------------------------------------------------ public API
    def reset(self, seed: int) -> PoolBatch:
        """Start a fresh episode in every slot; the scheduler picks the variants."""
        self._rng = np.random.default_rng(seed)
        live = np.flatnonzero(self._slot_live)
        if live.size:
            for w, slots in self._by_worker(live, self.worker_of[self._slot_variant[live]]).items():
                self._worker_call(w, "release", slots)
        self._slot_live[:] = False
        self._pending[:] = False  # release() ended the workers' pending steps too
        rows = WorkerBatch.empty(np.arange(self.num_envs), self.vocabulary)
        rows.truncated[:] = True  # no episode is running: a worker lost here closes none
        infos: list[dict[str, Any]] = [{} for _ in range(self.num_envs)]
        self._autoreset(list(range(self.num_envs)), rows, infos, rows.obs.copy())
        for slot, info in enumerate(infos):
            v = int(self._slot_variant[slot])
            info.update(
                env_id=self.env_ids[v],
                variant_index=v,
                variant_hash=self.variant_hashes[v],
                episode_seed=int(self._ep_seed[slot]),
                step_id=0,
                failure_reason=None,
                tokens=self._tokens(rows.obs[slot]),
                risk=0.0,
            )
            for key in ("next_env_id", "next_variant_index", "next_variant_hash", "next_episode_seed"):
                info.pop(key, None)
        self._obs, self._mask = rows.obs, rows.action_mask
        zeros = np.zeros(self.num_envs, bool)
        return PoolBatch(
            rows.obs, rows.action_mask, np.zeros(self.num_envs, np.float32), zeros, zeros.copy(), rows.obs.copy(), infos
        )

    def step(self, actions: np.ndarray, active: np.ndarray | None = None) -> PoolBatch:
        """Advance every slot by its action; ended episodes autoreset in the same step.

        ``active`` (a boolean mask) steps only those slots: the others are paused, their episode
        kept as it is, and their row repeats the current observation with no reward and no end
        (an evaluation that has its episodes from a slot stops paying for its steps).
        """
        actions = np.asarray(actions).reshape(self.num_envs)
        if not self._slot_live.all():
            raise PoolError("step() before reset(): every slot needs a live episode")
        stepping = np.arange(self.num_envs)
        rows = WorkerBatch.empty(stepping, self.vocabulary)
        if active is not None:
            active = np.asarray(active, dtype=bool).reshape(self.num_envs)
            stepping = np.flatnonzero(active)
            paused = np.flatnonzero(~active)
            rows.obs[paused], rows.action_mask[paused] = self._obs[paused], self._mask[paused]
            rows.step_id[paused] = self._step_id[paused]
        hosts = self.worker_of[self._slot_variant[stepping]]
        after_timeout = self.config.step_patience_engages == "after_timeout"
        patience = () if self.detach_after_s is None else (self.detach_after_s, after_timeout)
        calls = {
            w: ("step", (slots, actions[slots], *patience)) for w, slots in self._by_worker(stepping, hosts).items()
        }
        lost = np.zeros(self.num_envs, bool)
        results = self._invoke(calls)
        # Nothing else to step: wait for a pending step to return (or time out) instead of spinning.
        while stepping.size and self._pending[stepping].all() and _all_pending(results):
            time.sleep(PENDING_POLL_S)
            results = self._invoke(calls)
        for w, res in results.items():
            if res is None:
                lost[calls[w][1][0]] = True
            else:
                rows.scatter(res)
        if lost.any():
            self._mark_lost(rows, np.flatnonzero(lost), self._obs)
        was_pending = self._pending.copy()
        sent = np.zeros(self.num_envs, bool)
        sent[stepping] = True
        pending = self._hold_pending(rows, actions, lost, sent)
        reasons = rows.failure_reason
        failed = [] if POOL_FAILURES.isdisjoint(reasons) else [i for i, r in enumerate(reasons) if r in POOL_FAILURES]
        rows.truncated[failed] = True
        rows.terminated[failed] = False
        # A failed step has no valid observation: the episode's last good one is its final obs.
        rows.obs[failed] = self._obs[failed]
        rows.step_id[failed] = self._step_id[failed] + 1
        self._ep_return += rows.reward
        hot = rows.obs[:, : self._n_tokens] > 0.5
        self._ep_tokens |= hot
        stepped = ~lost & ~pending if active is None else active & ~lost & ~pending
        self._ep_length += stepped
        self._step_id = rows.step_id.copy()
        self.counters["steps"] += int(stepped.sum())
        # The infos are built when first read, from this step's values; the step adds entries to some slots.
        infos: defaultdict[int, dict[str, Any]] = defaultdict(dict)
        build = partial(
            self._slot_infos.build,
            self._slot_variant.copy(),
            rows.step_id,
            list(rows.failure_reason),
            hot,
            rows.risk,
            infos,
        )
        for s in np.flatnonzero(pending).tolist():
            infos[s]["step_pending"] = True
        for s in np.flatnonzero(was_pending & ~pending).tolist():  # the step that was pending returned
            infos[s]["action"] = int(self._pending_action[s])
        done = rows.terminated | rows.truncated
        final_obs = rows.obs.copy()
        ended = np.flatnonzero(done).tolist()
        self._finish_episodes(ended, rows, infos)
        self._autoreset(ended, rows, infos, final_obs)
        self._obs, self._mask = rows.obs, rows.action_mask
        return LazyInfoBatch(
            rows.obs,
            rows.action_mask,
            rows.reward,
            rows.terminated,
            rows.truncated,
            final_obs,
            build,
            pending if pending.any() else None,
        )

    def _hold_pending(self, rows: WorkerBatch, actions: np.ndarray, lost: np.ndarray, sent: np.ndarray) -> np.ndarray:
        """Turn the workers' ``STEP_PENDING`` rows into paused rows; returns the slots pending now.

        A slot that goes pending keeps its action (its outcome is delivered with it); one paused by
        ``active`` stays pending; one lost with its worker is no longer pending.
        """
        if STEP_PENDING not in rows.failure_reason and not self._pending.any():  # the common case: nothing pending
            return np.zeros(self.num_envs, bool)
        answered = np.fromiter((r == STEP_PENDING for r in rows.failure_reason), bool, self.num_envs)
        pending = answered | (self._pending & ~sent)
        new = answered & ~self._pending
        self._pending_action[new] = actions[new]
        self._pending = pending & ~lost
        for s in np.flatnonzero(answered).tolist():
            rows.failure_reason[s] = None
        rows.obs[pending], rows.action_mask[pending] = self._obs[pending], self._mask[pending]
        rows.reward[pending], rows.terminated[pending], rows.truncated[pending] = 0.0, False, False
        rows.step_id[pending] = self._step_id[pending]
        return self._pending.copy()

    def oracle_actions(self) -> np.ndarray:
        """Every slot's env's oracle action (it reads the hidden state): for evaluating the oracle only."""
        slots = np.arange(self.num_envs)
        actions = np.zeros(self.num_envs, np.int64)
        for w, part in self._by_worker(slots, self.worker_of[self._slot_variant]).items():
            actions[part] = self._worker_call(w, "oracle_actions", part)
        return actions

    def slot_variants(self) -> np.ndarray:
        """Variant index each slot is playing now (for feeding per-variant scores back)."""
        return self._slot_variant.copy()

    def set_value_loss(
        self, variant_indices: Sequence[int] | np.ndarray, value_loss: Sequence[float] | np.ndarray
    ) -> None:
        """Learner feedback (PLR's learning signal): reported with each variant's next finished episode."""
        idx = np.asarray(variant_indices, dtype=np.int64)
        self._value_loss[idx] = np.asarray(value_loss, dtype=np.float64)

    def feedback_state(self) -> list[float | None]:
        """Pending learner feedback (JSON-able), so a resumed run schedules exactly as an uninterrupted one."""
        return [None if np.isnan(x) else float(x) for x in self._value_loss]

    def load_feedback_state(self, state: Sequence[float | None]) -> None:
        """Inverse of :meth:`feedback_state`."""
        if len(state) != len(self._value_loss):
            raise PoolError(f"feedback state has {len(state)} variants, the pool has {len(self._value_loss)}")
        self._value_loss = np.array([np.nan if x is None else x for x in state], dtype=np.float64)

    def stats(self) -> dict[str, Any]:
        """Counters, quarantined variants (env_id -> reason), restarts and per-worker env counts."""
        try:
            workers = [self._worker_call(w, "stats") for w in range(self.n_workers)]
        except PoolError:
            raise
        except Exception as exc:  # a transport error (e.g. a Ray actor gone after the restart budget)
            raise PoolError(
                f"pool stats: a worker did not answer ({type(exc).__name__}: {str(exc)[:200]}); "
                f"{self.worker_restarts} worker restart(s) so far"
            ) from exc
        return {
            **self.counters,
            "num_envs": self.num_envs,
            "n_variants": len(self.variants),
            "worker_restarts": self.worker_restarts,
            "recoveries": [
                {"worker": int(e["worker"]), "recovery_s": round(e["restored_at"] - e["detected_at"], 4)}
                for e in self.loss_events
            ],
            "quarantined": {self.env_ids[v]: reason for v, reason in sorted(self.quarantined.items())},
            "failing_variants": {self.env_ids[v]: int(c) for v, c in enumerate(self.failures) if c},
            "live_envs": int(sum(w["live"] for w in workers)),
            "workers": workers,
        }

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _by_worker(slots: np.ndarray, hosts: np.ndarray) -> dict[int, np.ndarray]:
        order = np.argsort(hosts, kind="stable")
        slots, hosts = slots[order], hosts[order]
        bounds = np.flatnonzero(np.diff(hosts)) + 1
        return {int(h[0]): s for s, h in zip(np.split(slots, bounds), np.split(hosts, bounds), strict=True) if len(s)}

    def _tokens(self, obs_row: np.ndarray) -> list[str]:
        return self._token_names[obs_row[: self._n_tokens] > 0.5].tolist()

    def _mark_lost(self, rows: WorkerBatch, slots: np.ndarray, last_obs: np.ndarray) -> None:
        rows.obs[slots] = last_obs[slots]
        rows.truncated[slots], rows.terminated[slots], rows.reward[slots] = True, False, 0.0
        rows.step_id[slots] = self._step_id[slots]
        for s in slots.tolist():
            rows.failure_reason[s] = WORKER_LOST

    def _finish_episodes(self, slots: Sequence[int], rows: WorkerBatch, infos: SlotInfoRows) -> None:
        """Episode-end bookkeeping: infos, scheduler update, failure counts and quarantine."""
        for s in slots:
            v = int(self._slot_variant[s])
            reason = rows.failure_reason[s]
            success = bool(rows.terminated[s] and rows.obs[s, self._goal] > 0.5)
            ret, length = float(self._ep_return[s]), int(self._ep_length[s])
            infos[s].update(episode_return=ret, episode_length=length, success=success)
            if not np.isnan(rows.business_value[s]):  # the channel prices its episodes
                infos[s]["business_value"] = float(rows.business_value[s])
            self._slot_live[s] = False
            self.counters["episodes"] += 1
            self.counters["successes"] += success
            if reason in POOL_FAILURES:
                self.counters[reason] += 1
                self._count_failure(v, reason)
            if reason == WORKER_LOST:
                self.counters["steps_lost"] += length
            loss = self._value_loss[v]
            self.scheduler.update(
                v,
                EpisodeStats(
                    return_=ret,
                    success=success,
                    length=length,
                    failure_reason=reason,
                    tokens=frozenset(self._token_names[self._ep_tokens[s]].tolist()),
                    value_loss=None if np.isnan(loss) else float(loss),
                ),
            )

    def _count_failure(self, v: int, reason: str) -> None:
        if reason == WORKER_LOST:  # the worker died, not this variant
            return
        self.failures[v] += 1
        if self.failures[v] >= self.config.quarantine_after and v not in self.quarantined:
            self.quarantined[v] = reason
            self.scheduler.quarantine(v, reason)
            logger.warning(
                "pool: variant %s quarantined after %d failures (last: %s)",
                self.env_ids[v],
                int(self.failures[v]),
                reason,
            )

    def _sample(self, n: int) -> np.ndarray:
        try:
            return np.asarray(self.scheduler.sample(n), dtype=np.int64)
        except Exception as exc:  # e.g. every variant quarantined
            raise PoolError(
                f"the scheduler cannot pick variants: {exc} (quarantined: {len(self.quarantined)} "
                f"of {len(self.variants)})"
            ) from exc

    def _autoreset(self, slots: list[int], rows: WorkerBatch, infos: SlotInfoRows, final_obs: np.ndarray) -> None:
        """Reset ``slots`` on scheduler-picked variants, retrying failed resets and lost workers."""
        pending = list(slots)
        for _ in range(MAX_RESET_ROUNDS):
            if not pending:
                return
            slot_arr = np.asarray(pending, np.int64)
            variants = self._sample(len(pending))
            seeds = self._rng.integers(0, 2**31 - 1, size=len(pending))
            hosts = self.worker_of[variants]
            calls: dict[int, tuple[str, tuple[Any, ...]]] = {}
            for w in np.unique(hosts).tolist():
                sel = hosts == w
                calls[w] = ("reset", (slot_arr[sel], variants[sel], seeds[sel]))
            pending = []
            for w, res in self._invoke(calls).items():
                w_slots, w_variants = calls[w][1][0], calls[w][1][1]
                if res is None:
                    pending.extend(w_slots.tolist())
                    pending.extend(self._orphans_of(w, rows, infos, final_obs))
                    continue
                w_seeds = calls[w][1][2].tolist()
                for row, (s, v) in enumerate(zip(w_slots.tolist(), w_variants.tolist(), strict=True)):
                    reason = res.failure_reason[row]
                    if reason is not None:
                        self.counters[reason] = self.counters.get(reason, 0) + 1
                        self._count_failure(v, reason)
                        self.scheduler.update(
                            v, EpisodeStats(return_=0.0, success=False, length=0, failure_reason=reason)
                        )
                        pending.append(s)
                        continue
                    self._slot_variant[s], self._slot_live[s] = v, True
                    self._ep_return[s], self._ep_length[s], self._step_id[s] = 0.0, 0, 0
                    self._ep_seed[s] = w_seeds[row]
                    self._ep_tokens[s] = res.obs[row, : self._n_tokens] > 0.5
                    rows.obs[s], rows.action_mask[s] = res.obs[row], res.action_mask[row]
                    infos[s].update(
                        next_env_id=self.env_ids[v],
                        next_variant_index=v,
                        next_variant_hash=self.variant_hashes[v],
                        next_episode_seed=w_seeds[row],
                    )
        if pending:
            raise PoolError(
                f"could not start episodes in slots {pending[:8]} after {MAX_RESET_ROUNDS} rounds of resets "
                f"(quarantined {len(self.quarantined)} of {len(self.variants)} variants)"
            )

    def _orphans_of(self, worker: int, rows: WorkerBatch, infos: SlotInfoRows, final_obs: np.ndarray) -> list[int]:
        """Slots whose live episode sat on a worker that was just lost: close them as worker_lost."""
        live = np.flatnonzero(self._slot_live & (self.worker_of[np.maximum(self._slot_variant, 0)] == worker))
        closing = [s for s in live.tolist() if not (rows.terminated[s] or rows.truncated[s])]
        for s in closing:  # stepped fine this step, but the episode is gone with its worker
            rows.truncated[s], rows.failure_reason[s] = True, WORKER_LOST
            infos[s]["failure_reason"] = WORKER_LOST
            final_obs[s] = rows.obs[s]
        self._finish_episodes(closing, rows, infos)
        self._slot_live[live] = False
        return live.tolist()
