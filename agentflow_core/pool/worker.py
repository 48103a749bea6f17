"""The batched env worker: owns a slice of the variant catalogue and steps many envs per call.

One :class:`EnvWorker` lives in the driver process (``InProcessPool``) or inside a Ray actor
(``RayPool``); either way one call advances every slot the worker hosts, never one env per call.
Envs are created lazily on first use and kept in an LRU cache of idle envs, so the live count
stays under ``max_live`` however large the slice is. A reset takes, in order of preference: an
idle env of the same variant, an idle env of the same base env re-targeted to the variant (the
factory's ``reuse``: a cold variant costs a reconfigure, not a new database or HTTP client), a
new env.

Fault isolation: each env is stepped under a watchdog
(:class:`~agentflow_core.pool.watchdog.BatchWatchdog`). An env that raises (``env_crash``),
returns NaN/inf (``env_invalid``) or does not answer within ``step_timeout_s`` (``env_timeout``)
ends its own episode with that failure reason and is discarded; the other rows of the batch are
unaffected.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.envs.semantic_env import SemanticEnv, StepRow
from agentflow_core.errors import EnvError
from agentflow_core.pool.base import (
    ENV_CRASH,
    ENV_INVALID,
    ENV_TIMEOUT,
    STEP_PENDING,
    WORKER_LOST,
    EnvFactory,
    PoolEnv,
    PreparingEnvFactory,
    VariantLike,
    factory_vocabulary,
)
from agentflow_core.pool.batch import WorkerBatch, business_value, oracle_action
from agentflow_core.pool.watchdog import TIMED_OUT, BatchWatchdog, DetachedStep

logger = logging.getLogger("agentflow.pool")

# Failures a worker's stats keep, newest last (``recent_failures``).
RECENT_FAILURES = 10


def _failure_of(out: Any) -> str:
    if out is TIMED_OUT:
        return ENV_TIMEOUT
    if isinstance(out, EnvError):
        return out.failure_reason
    return ENV_CRASH


@dataclass
class _Active:
    variant_index: int
    env: PoolEnv
    base_env_id: str


@dataclass
class _ResetItem:
    variant_index: int
    seed: int
    cached: PoolEnv | None  # an idle env of this very variant
    donor: PoolEnv | None  # else an idle env of the same base env, to re-target
    donor_variant: int = -1
    declined: bool = False  # the factory could not re-target the donor: it goes back to the cache


class EnvWorker:
    """Hosts the envs of its catalogue slice; ``reset`` and ``step`` take many slots per call."""

    def __init__(
        self,
        factory: EnvFactory,
        variants: Mapping[int, VariantLike],
        max_live: int,
        step_timeout_s: float,
        worker_index: int = 0,
    ) -> None:
        self.factory = factory
        self.vocabulary = factory_vocabulary(factory)
        self.variants = dict(variants)
        self.max_live = int(max_live)
        self.worker_index = worker_index
        self.watchdog = BatchWatchdog(step_timeout_s)
        self._active: dict[int, _Active] = {}
        self._pending: dict[int, DetachedStep] = {}  # slot -> its step still running (see step())
        # variant index -> idle envs of that variant, least recently used variant first
        self._idle: OrderedDict[int, list[PoolEnv]] = OrderedDict()
        # base env id -> variants holding idle envs (LRU first), and each such variant's base env
        self._idle_by_base: dict[str, OrderedDict[int, None]] = {}
        self._idle_base_of: dict[int, str] = {}
        self._n_idle = 0
        self.counters = {
            "created": 0,
            "reused": 0,
            "evicted": 0,
            ENV_CRASH: 0,
            ENV_TIMEOUT: 0,
            ENV_INVALID: 0,
            "steps": 0,
            "step_calls": 0,
            "reset_calls": 0,
        }
        # the last few failures, "<env id>: <reason>: <message>", newest last: why variants are quarantined
        self.recent_failures: deque[str] = deque(maxlen=RECENT_FAILURES)

    # ------------------------------------------------------------------ introspection
    def pid(self) -> int:
        """OS process id (the fault tests kill a Ray worker by it)."""
        return os.getpid()

    def ping(self) -> int:
        """Cheap round trip for the driver's liveness poll; answers with the worker index."""
        return self.worker_index

    @property
    def live_count(self) -> int:
        """Envs held, in an episode or idle in the cache: the count ``max_live`` bounds by evicting idle ones."""
        return len(self._active) + self._n_idle

    def stats(self) -> dict[str, Any]:
        """Counters plus live/active/idle env counts."""
        return {
            **self.counters,
            "worker": self.worker_index,
            "live": self.live_count,
            "active": len(self._active),
            "pending": len(self._pending),
            "idle": self._n_idle,
            "catalogue": len(self.variants),
            "abandoned_threads": self.watchdog.abandoned_threads,
            "recent_failures": list(self.recent_failures),
        }

    # ------------------------------------------------------------------ env lifecycle
    def _discard(self, env: PoolEnv, hung: bool) -> None:
        if hung:
            return  # its thread may still be inside step(); never touch it again
        try:
            env.close()
        except Exception:  # closing a broken env may fail too; it is dropped either way
            logger.debug("worker %d: close() of a failed env raised", self.worker_index, exc_info=True)

    def _park(self, variant_index: int, env: PoolEnv, base_env_id: str) -> None:
        """Return an env whose episode ended to the LRU cache (its variant becomes most recent)."""
        self._idle.setdefault(variant_index, []).append(env)
        self._idle.move_to_end(variant_index)
        by_base = self._idle_by_base.setdefault(base_env_id, OrderedDict())
        by_base[variant_index] = None
        by_base.move_to_end(variant_index)
        self._idle_base_of[variant_index] = base_env_id
        self._n_idle += 1
        self._evict()

    def _take_idle(self, variant_index: int) -> PoolEnv | None:
        envs = self._idle.get(variant_index)
        if not envs:
            return None
        env = envs.pop()
        self._n_idle -= 1
        if not envs:
            del self._idle[variant_index]
            base = self._idle_base_of.pop(variant_index)
            del self._idle_by_base[base][variant_index]
        return env

    def _donor_variant(self, base_env_id: str) -> int | None:
        """The least recently used variant with an idle env of ``base_env_id`` (eviction's next pick)."""
        by_base = self._idle_by_base.get(base_env_id)
        return next(iter(by_base)) if by_base else None

    def _evict(self) -> None:
        while self.live_count > self.max_live and self._idle:
            env = self._take_idle(next(iter(self._idle)))
            if env is not None:
                self._discard(env, hung=False)
                self.counters["evicted"] += 1

    def release(self, slots: Sequence[int] | np.ndarray) -> None:
        """End the slots' episodes without stepping (pool reset); their envs go to the cache."""
        for slot in np.asarray(slots, dtype=np.int64).tolist():
            active = self._active.pop(slot, None)
            detached = self._pending.pop(slot, None)
            if detached is not None and active is not None:  # its step may still run: the env is never reused
                if not detached.done.is_set():
                    self.watchdog.give_up(detached)
                self._discard(active.env, hung=True)
            elif active is not None:
                self._park(active.variant_index, active.env, active.base_env_id)

    def adopt(self, variants: Mapping[int, VariantLike], worker_index: int) -> int:
        """Take over a catalogue slice (a standby worker replacing a lost one); returns the worker index.

        Idle envs built during :meth:`prewarm` stay: any of them can be re-targeted to a variant
        of its base env in the new slice.
        """
        self.variants = dict(variants)
        self.worker_index = int(worker_index)
        return self.worker_index

    def prepare_factory(self) -> None:
        """Let the factory pay its one-off costs now (:class:`PreparingEnvFactory`), not in a timed reset."""
        if isinstance(self.factory, PreparingEnvFactory):
            self.factory.prepare()

    def prewarm(self, variants: Mapping[int, VariantLike], seed: int = 0) -> int:
        """Build, reset once and park an env per given variant (imports, adapters, templates warmed).

        A standby worker calls this before it is needed, so the slots it takes over start on
        re-targeted envs instead of new ones. Returns the idle count.
        """
        for v, variant in variants.items():
            if self.live_count >= self.max_live:
                break
            env = self.factory(variant)
            self.counters["created"] += 1
            env.reset(seed=seed + v)
            self._park(v, env, variant.base_env_id)
        return self._n_idle

    # ------------------------------------------------------------------ batched calls
    def reset(self, slots: np.ndarray, variant_indices: np.ndarray, seeds: np.ndarray) -> WorkerBatch:
        """Start one episode per slot on the given variants; a failing reset is a row with failure_reason."""
        slots = np.asarray(slots, dtype=np.int64)
        self.counters["reset_calls"] += 1
        self.release(slots)
        can_reuse = callable(getattr(self.factory, "reuse", None))
        items: list[_ResetItem] = []
        for v, seed in zip(np.asarray(variant_indices).tolist(), np.asarray(seeds).tolist(), strict=True):
            cached = self._take_idle(v)
            base = self.variants[v].base_env_id
            donor_variant = self._donor_variant(base) if cached is None and can_reuse else None
            donor = None if donor_variant is None else self._take_idle(donor_variant)
            items.append(_ResetItem(v, seed, cached, donor, -1 if donor_variant is None else donor_variant))
        results = self.watchdog.run(self._reset_one, items, cpu_clock=True)
        out = WorkerBatch.empty(slots, self.vocabulary)
        for row, (slot, item, res) in enumerate(zip(slots.tolist(), items, results, strict=True)):
            if item.declined and item.donor is not None:
                self._park(item.donor_variant, item.donor, self.variants[item.variant_index].base_env_id)
                item.donor = None
            if isinstance(res, tuple):
                env, obs, mask = res
                out.obs[row], out.action_mask[row] = obs, mask
                self._active[slot] = _Active(item.variant_index, env, self.variants[item.variant_index].base_env_id)
            else:
                self._record_failure(row, out, res, item.cached or item.donor, item.variant_index)
        self._evict()
        return out

    def _reset_one(self, item: _ResetItem) -> tuple[PoolEnv, np.ndarray, np.ndarray]:
        variant = self.variants[item.variant_index]
        env = item.cached
        if env is None and item.donor is not None:
            try:
                env = self.factory.reuse(item.donor, variant)  # type: ignore[attr-defined]
            except Exception:  # a donor that cannot be re-targeted is closed; a new env is built instead
                logger.debug("worker %d: reuse for %s failed", self.worker_index, variant.env_id, exc_info=True)
                self._discard(item.donor, hung=False)
                item.donor = None
            else:
                item.declined = env is None
                self.counters["reused"] += env is not None
        if env is None:
            env = self.factory(variant)
            self.counters["created"] += 1
        obs, info = env.reset(seed=item.seed)
        self._check_finite(obs, 0.0, item.variant_index, 0)
        mask = info.get("action_mask")
        return env, obs, env.action_masks() if mask is None else mask

    def step(
        self,
        slots: np.ndarray,
        actions: np.ndarray,
        detach_after_s: float | None = None,
        after_timeout: bool = False,
    ) -> WorkerBatch:
        """Advance every given slot by one action; ended episodes park their env in the cache.

        With ``detach_after_s`` a step still running after that long does not hold the others: its
        row says ``STEP_PENDING`` and the slot's action is ignored until the step returns; a later
        call delivers its outcome, or ends its episode as ``env_timeout`` once it has run for the
        step timeout. Without it, the batch waits for each step up to the step timeout. With
        ``after_timeout`` the patience engages only once this worker has seen a step or reset run
        into the step timeout (``pool.step_patience_engages``): until then nothing is late, so a run
        without a timeout is the same as one that always waits.
        """
        if after_timeout and self.watchdog.abandoned_threads == 0:  # no item of this worker has timed out yet
            detach_after_s = None
        slots = np.asarray(slots, dtype=np.int64)
        slot_list = slots.tolist()
        out = WorkerBatch.empty(slots, self.vocabulary)
        active_of = self._active.get
        if self._pending:
            results = self._step_with_pending(slot_list, np.asarray(actions).tolist(), detach_after_s)
        else:  # nothing pending from an earlier call: every row steps now
            items = [
                None if (active := active_of(slot)) is None else (active.env, action)
                for slot, action in zip(slot_list, np.asarray(actions).tolist(), strict=True)
            ]
            results = self.watchdog.run(self._step_one, items, detach_after_s)
            self.counters["steps"] += len(items)
        self.counters["step_calls"] += 1
        # Scalars gather in lists and land in the batch's arrays once (a numpy item write per field per row costs
        # more); rows that did not answer plainly are handled after, on the filled batch.
        n = len(slot_list)
        reward, step_id, risk, value = [0.0] * n, [0] * n, [0.0] * n, [math.nan] * n
        unusual: list[int] = []
        answered, obs_rows, mask_rows = [], [], []  # rows with an observation, written once after the loop
        terminated, truncated, failure_reason = out.terminated, out.truncated, out.failure_reason
        pending = self._pending
        for row, (slot, res) in enumerate(zip(slot_list, results, strict=True)):
            if res.__class__ is not tuple:
                unusual.append(row)
                continue
            if pending:
                pending.pop(slot, None)
            active = active_of(slot)
            if active is None:  # the slot has no episode here (this worker was restarted)
                truncated[row] = True
                failure_reason[row] = WORKER_LOST
                continue
            obs, reward[row], ended_ok, cut, step_id[row], risk[row], failure_reason[row], mask, value[row] = res
            answered.append(row)
            obs_rows.append(obs)
            mask_rows.append(mask)
            if ended_ok or cut:
                terminated[row], truncated[row] = ended_ok, cut
                del self._active[slot]
                self._park(active.variant_index, active.env, active.base_env_id)
        out.reward[:], out.step_id[:], out.risk[:], out.business_value[:] = reward, step_id, risk, value
        if answered and len(answered) == n:  # one conversion of the whole list (np.stack costs more than a row write)
            out.obs[:], out.action_mask[:] = obs_rows, mask_rows
        else:
            for row, obs, mask in zip(answered, obs_rows, mask_rows, strict=True):
                out.obs[row], out.action_mask[row] = obs, mask
        for row in unusual:
            self._unusual_row(row, slot_list[row], results[row], out)
        return out

    def _step_with_pending(self, slot_list: list[int], actions: list[int], detach_after_s: float | None) -> list[Any]:
        """Step the rows with no step pending; the others answer their pending step's outcome, or wait on."""
        items: list[tuple[PoolEnv, int] | None] = []
        fresh: list[int] = []  # rows stepped now; the others are steps still pending from an earlier call
        results: list[Any] = [None] * len(slot_list)
        now = time.perf_counter()
        for row, (slot, action) in enumerate(zip(slot_list, actions, strict=True)):
            detached = self._pending.get(slot)
            if detached is None:
                active = self._active.get(slot)
                items.append(None if active is None else (active.env, action))
                fresh.append(row)
                continue
            if detached.done.is_set():
                results[row] = detached.result
            elif detached.elapsed(now) >= self.watchdog.timeout_s:
                self.watchdog.give_up(detached)
                results[row] = TIMED_OUT
            else:
                results[row] = detached
        for row, res in zip(fresh, self.watchdog.run(self._step_one, items, detach_after_s), strict=True):
            results[row] = res
        self.counters["steps"] += len(items)
        return results

    def _unusual_row(self, row: int, slot: int, res: Any, out: WorkerBatch) -> None:
        """A row whose step did not answer plainly: still pending, no episode here, or a failure."""
        if isinstance(res, DetachedStep):
            self._pending[slot] = res
            out.failure_reason[row] = STEP_PENDING
            return
        self._pending.pop(slot, None)
        active = self._active.get(slot)
        if active is None:  # the slot has no episode here (this worker was restarted)
            out.truncated[row] = True
            out.failure_reason[row] = WORKER_LOST
            return
        del self._active[slot]
        self._record_failure(row, out, res, active.env, active.variant_index)

    def oracle_actions(self, slots: np.ndarray) -> np.ndarray:
        """Each slot's env's oracle action (it reads the hidden state): evaluation only, never training.

        An env without an oracle (no ``oracle_action()``) raises: the caller plays the oracle only
        for a process that declares one.
        """
        return np.array(
            [oracle_action(self._active[slot].env) for slot in np.asarray(slots, dtype=np.int64).tolist()],
            dtype=np.int64,
        )

    def _step_one(self, item: tuple[PoolEnv, int] | None) -> StepRow | None:
        """One env step as the row fields the batch keeps (a SemanticEnv builds no info dict for it)."""
        if item is None:
            return None
        env, action = item
        if env.__class__ is SemanticEnv:  # it raises EnvInvalidError itself
            return env.step_row(action)
        obs, reward, terminated, truncated, info = env.step(action)
        if not isinstance(env, SemanticEnv):  # a subclass checks itself too; don't check twice
            self._check_finite(obs, reward, info.get("env_id", "?"), info.get("step_id", -1))
        mask = info.get("action_mask")
        return (
            obs,
            reward,
            terminated,
            truncated,
            info.get("step_id", 0),
            info.get("risk", 0.0),
            info.get("failure_reason"),
            env.action_masks() if mask is None else mask,
            business_value(info),
        )

    @staticmethod
    def _check_finite(obs: np.ndarray, reward: float, env_id: Any, step_id: int) -> None:
        # The same guard SemanticEnv applies, for any other PoolEnv.
        if not (np.isfinite(reward) and np.isfinite(obs).all()):
            from agentflow_core.errors import EnvInvalidError

            raise EnvInvalidError(str(env_id), int(step_id), "non-finite observation or reward")

    def _record_failure(self, row: int, out: WorkerBatch, res: Any, env: PoolEnv | None, variant_index: int) -> None:
        reason = _failure_of(res)
        self.counters[reason] += 1
        out.truncated[row] = True
        out.failure_reason[row] = reason
        if isinstance(res, EnvError):
            out.step_id[row] = res.step_id
        variant = self.variants.get(variant_index)
        env_id = getattr(variant, "env_id", variant_index)
        message = "no answer within the step timeout" if res is TIMED_OUT else f"{type(res).__name__}: {res}"
        logger.warning("worker %d: %s on %s: %s", self.worker_index, reason, env_id, message)
        self.recent_failures.append(f"{env_id}: {reason}: {message[:300]}")
        if env is not None:
            self._discard(env, hung=res is TIMED_OUT)

    def close(self) -> None:
        """Close every env this worker holds (an env whose step is still running is left alone)."""
        for slot, active in self._active.items():
            self._discard(active.env, hung=slot in self._pending)
        self._pending.clear()
        for envs in self._idle.values():
            for env in envs:
                self._discard(env, hung=False)
        self._active.clear()
        self._idle.clear()
        self._idle_by_base.clear()
        self._idle_base_of.clear()
        self._n_idle = 0
        self.watchdog.close()
