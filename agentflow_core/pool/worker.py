"""The batched env worker: owns a slice of the variant catalogue and steps many envs per call.

One :class:`EnvWorker` lives in the driver process (``InProcessPool``) or inside a Ray actor
(``RayPool``); either way one call advances every slot the worker hosts, never one env per call.
Envs are created lazily on first use and kept in an LRU cache of idle envs, so the live count
stays under ``max_live`` however large the slice is. A reset takes, in order of preference: an
idle env of the same variant, an idle env of the same base env re-targeted to the variant (the
factory's ``reuse``: a cold variant costs a reconfigure, not a new database or HTTP client), a
new env.

Fault isolation: each env is stepped under a watchdog (:class:`BatchWatchdog`). An env that
raises (``env_crash``), returns NaN/inf (``env_invalid``) or does not answer within
``step_timeout_s`` (``env_timeout``) ends its own episode with that failure reason and is
discarded; the other rows of the batch are unaffected. Ray never detects a hung call, so the
timeout has to live here. A step's clocks leave out the interpreter's garbage collections
(:func:`gc_seconds`): a full collection of a large heap stops every thread for a quarter of a
second or more, which is no env's fault.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentflow_core.envs.semantic_env import SemanticEnv
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
from agentflow_core.semantics import CHECKOUT, Vocabulary

logger = logging.getLogger("agentflow.pool")


class _Timeout:
    """Result marker of an item abandoned by the watchdog."""


TIMED_OUT = _Timeout()
# CPU time a stuck step must have used to count as computing (not waiting) at its patience.
COMPUTING_MIN_CPU_S = 0.002
# Wall-clock bound, in step timeouts, of an item timed on its thread's CPU clock (``cpu_clock``),
# and the shortest wait before such an item's CPU clock is read again.
LOAD_GRACE = 4.0
CPU_RECHECK_S = 0.005
# Failures a worker's stats keep, newest last (``recent_failures``).
RECENT_FAILURES = 10

_gc_total_s = 0.0  # seconds spent in finished garbage collections since the callback was installed
_gc_began: float | None = None  # when the collection in progress began


def _on_gc(phase: str, _info: Mapping[str, Any]) -> None:
    global _gc_total_s, _gc_began
    if phase == "start":
        _gc_began = time.perf_counter()
    elif _gc_began is not None:
        _gc_total_s += time.perf_counter() - _gc_began
        _gc_began = None


def gc_seconds() -> float:
    """Seconds this interpreter has spent collecting garbage (every thread stops meanwhile), as a clock.

    A step timed by the watchdog subtracts what this clock advanced while it ran: a full
    collection of a large heap (a pool of 300 envs beside torch: 0.2-0.3 s measured) ends no
    healthy step. Counted from the first :class:`BatchWatchdog` on.
    """
    began = _gc_began
    return _gc_total_s + (time.perf_counter() - began if began is not None else 0.0)


def _install_gc_clock() -> None:
    if _on_gc not in gc.callbacks:
        gc.callbacks.append(_on_gc)


@dataclass
class DetachedStep:
    """An item still running after the batch's patience: the batch went on without it.

    Its thread keeps running it; ``result`` is set (and ``done``) when it returns. The owner gives
    up on it after the step timeout (:meth:`BatchWatchdog.give_up`).
    """

    started: float
    thread: threading.Thread | None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    gc_started: float = 0.0  # :func:`gc_seconds` when the step started

    def elapsed(self, now: float) -> float:
        """Wall-clock seconds the step has run by ``now``, garbage collections left out."""
        return _run_time(self.started, self.gc_started, now)


@dataclass
class _Job:
    fn: Callable[[Any], Any]
    items: Sequence[Any]
    start: int
    results: list[Any]
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    current: int = -1
    started: float = 0.0
    cpu_started: float = 0.0  # the stepping thread's CPU clock when the current item started
    gc_started: float = 0.0  # and gc_seconds()
    process_cpu_started: float = 0.0  # and the whole process's
    abandoned: bool = False
    detached: DetachedStep | None = None
    thread: threading.Thread | None = None


class AbandonedStep(BaseException):
    """Raised inside an env step the watchdog gave up on, to end its thread (see :func:`interrupt_thread`)."""


def _importing(ident: int) -> bool:
    """Whether the thread ``ident`` is inside an import (a frame of ``importlib._bootstrap`` on its stack)."""
    frame = sys._current_frames().get(ident)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def interrupt_thread(thread: threading.Thread | None) -> bool:
    """Ask ``thread`` to raise :class:`AbandonedStep` at its next Python bytecode; True while it is to be asked again.

    CPython's ``PyThreadState_SetAsyncExc``: a step that loops in Python code (a busy-looping env)
    ends at once and its thread exits; one blocked in a C call (``time.sleep``, a socket read) ends
    when the call returns. The env of that step is discarded either way, so the half-done step
    leaves nothing behind that is used again -- except an import: an exception that lands between
    a submodule's execution and its binding on the package leaves it in ``sys.modules`` but never
    bound, for the rest of the process (seen in the Ray soak: a slow first ``order_db`` reset,
    importing SQLAlchemy's sqlite dialect, timed out, and every later ``order_db`` reset of that
    worker failed with "module 'sqlalchemy' has no attribute 'dialects'"). A thread inside an import
    is therefore not interrupted now; it stays on the list of threads asked again at the next batch.
    """
    if thread is None or thread.ident is None or not thread.is_alive():
        return False
    if _importing(thread.ident):
        return True
    import ctypes

    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    return bool(set_async(ctypes.c_ulong(thread.ident), ctypes.py_object(AbandonedStep)) == 1)


def _item_cpu_s(job: _Job) -> float | None:
    """CPU time the item in progress has used on its own thread, less the garbage collections since it
    started (one may have run on that thread); None where that cannot be read."""
    if job.thread is None or job.thread.ident is None:
        return None
    try:
        cpu = time.clock_gettime(time.pthread_getcpuclockid(job.thread.ident)) - job.cpu_started
    except (AttributeError, OSError):  # no per-thread CPU clocks here, or the thread just ended
        return None
    return max(cpu - (gc_seconds() - job.gc_started), 0.0)


def _run_time(started: float, gc_started: float, now: float) -> float:
    """Wall-clock seconds from ``started`` to ``now``, the garbage collections since ``gc_started`` left out."""
    return now - started - (gc_seconds() - gc_started)


def _item_waited(job: _Job) -> float:
    """Wall-clock seconds the item in progress has run, garbage collections left out."""
    return _run_time(job.started, job.gc_started, time.perf_counter())


def _computing(job: _Job) -> bool:
    """Whether the item in progress has been using the CPU: most of the process's CPU time since it
    started, and at least ``COMPUTING_MIN_CPU_S``.

    Such a step holds the GIL most of the time: going on beside it would not step the others
    faster (every GIL release of theirs, e.g. around a SQLite call, waits a switch interval behind
    it), and waiting for it holds the whole call -- in a Ray actor the driver and the other workers
    too. So a step still computing at its patience is ended there (``env_timeout``) and its thread
    interrupted (once its thread has used the patience's worth of CPU: a healthy step starved by a
    loaded machine is not ended); a step that waits (a sleep, a socket, a lock) uses no CPU and is detached. Measured
    against the process's own CPU time, not the wall clock, so a busy loop on a loaded machine (a
    small CPU share) still counts as computing.
    """
    cpu = _item_cpu_s(job)
    return (
        cpu is not None and cpu >= COMPUTING_MIN_CPU_S and cpu >= 0.5 * (time.process_time() - job.process_cpu_started)
    )


class BatchWatchdog:
    """Run ``fn`` over items in a helper thread; an item past ``timeout_s`` is abandoned.

    One thread steps the whole batch (a future per env would cost more than a semantic env step);
    the caller waits on the deadline of the item in progress. On a hang the rest of the batch
    continues on a fresh thread and the stuck one is interrupted (:func:`interrupt_thread`): a step
    looping in Python ends there; one blocked in a C call stays until the call returns (a daemon,
    so it cannot block interpreter exit) -- only a process can be killed, see
    :mod:`agentflow_core.pool.process_host`.
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self.abandoned_threads = 0
        _install_gc_clock()
        self._queue: queue.SimpleQueue[_Job | None] | None = None
        self._stuck: list[threading.Thread] = []  # abandoned threads not yet seen to end

    def _spawn(self) -> queue.SimpleQueue[_Job | None]:
        jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        threading.Thread(target=self._loop, args=(jobs,), name="agentflow-env-step", daemon=True).start()
        return jobs

    @staticmethod
    def _loop(jobs: queue.SimpleQueue[_Job | None]) -> None:
        try:
            BatchWatchdog._run_jobs(jobs)
        except AbandonedStep:  # interrupted outside the env call (its answer was dropped anyway)
            return

    @staticmethod
    def _run_jobs(jobs: queue.SimpleQueue[_Job | None]) -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            job.thread = threading.current_thread()
            for i in range(job.start, len(job.items)):
                with job.lock:
                    if job.abandoned:
                        return
                    job.current, job.started, job.gc_started = i, time.perf_counter(), gc_seconds()
                    job.cpu_started, job.process_cpu_started = time.thread_time(), time.process_time()
                try:
                    out: Any = job.fn(job.items[i])
                except BaseException as exc:  # isolate whatever the env raised
                    out = exc
                with job.lock:
                    if job.abandoned:  # the batch went on without this thread: a detached item's
                        if job.detached is not None:  # answer is kept for its owner, a timed-out one dropped
                            job.detached.result = out
                            job.detached.done.set()
                        return
                    job.results[i] = out
            job.done.set()

    def run(
        self,
        fn: Callable[[Any], Any],
        items: Sequence[Any],
        detach_after_s: float | None = None,
        cpu_clock: bool = False,
    ) -> list[Any]:
        """``[fn(item) or the exception it raised or TIMED_OUT or a DetachedStep]`` in item order.

        With ``detach_after_s`` an item still running after that long is not waited for: the rest
        of the batch goes on on a fresh thread and the item's result is a :class:`DetachedStep` (its
        answer arrives later, or its owner gives up on it at the step timeout) -- unless it is
        computing (:func:`_computing`): then it is ended (``TIMED_OUT``, its thread interrupted) once
        its own thread has used the patience's worth of CPU, up to the timeout. With ``cpu_clock``
        (resets) an item computing at the timeout is waited for until its thread has used the
        timeout's worth of CPU, up to ``LOAD_GRACE`` timeouts: a loaded machine's small CPU share
        does not end a healthy item.
        """
        results: list[Any] = [None] * len(items)
        if self._stuck:  # an interrupt can be swallowed (it may land in a __del__ or weakref callback): ask again
            self._stuck = [t for t in self._stuck if t.is_alive() and interrupt_thread(t)]
        patience = self.timeout_s if detach_after_s is None else min(float(detach_after_s), self.timeout_s)
        start = 0
        while start < len(items):
            if self._queue is None:
                self._queue = self._spawn()
            job = _Job(fn, items, start, results)
            self._queue.put(job)
            start = len(items)
            # A computing item is ended once its own thread has used ``cpu_budget`` of CPU (the patience,
            # or with ``cpu_clock`` the timeout), so a loaded machine's small CPU share does not end a
            # healthy one; ``wall_cap`` bounds the wait all the same.
            detaching = patience < self.timeout_s
            cpu_budget = patience if detaching else self.timeout_s
            wall_cap = LOAD_GRACE * self.timeout_s if cpu_clock and not detaching else self.timeout_s
            rechecking, cpu_left = -1, 0.0  # the item granted more time on its CPU clock, and its CPU to go
            while True:
                if job.current < 0:
                    wait_s = patience
                elif rechecking == job.current:
                    wait_s = min(wall_cap - _item_waited(job), max(cpu_left, CPU_RECHECK_S))
                else:
                    wait_s = patience - _item_waited(job)
                if job.done.wait(max(wait_s, 0.0)):
                    break
                with job.lock:
                    if job.done.is_set():
                        break
                    waited = _item_waited(job)
                    if job.current < 0 or waited < patience:
                        continue
                    computing = _computing(job)
                    cpu_left = cpu_budget - (_item_cpu_s(job) or 0.0)
                    if waited < wall_cap and computing and cpu_left > 0.0:
                        rechecking = job.current
                        continue
                    job.abandoned = True
                    start = job.current + 1
                    self._queue = None  # the stuck thread keeps its queue; the next job gets a new thread
                    if waited < self.timeout_s and not computing:
                        job.detached = DetachedStep(job.started, job.thread, gc_started=job.gc_started)
                        results[job.current] = job.detached
                    else:
                        results[job.current] = TIMED_OUT
                        self._abandon(job.thread)
                    break
        return results

    def give_up(self, step: DetachedStep) -> None:
        """A detached item did not answer within the step timeout: interrupt its thread and forget it."""
        self._abandon(step.thread)

    def _abandon(self, thread: threading.Thread | None) -> None:
        self.abandoned_threads += 1
        if interrupt_thread(thread):  # a step looping in Python ends now, not never (one importing: later)
            self._stuck.append(thread)  # type: ignore[arg-type]

    def close(self) -> None:
        """Stop the helper thread once it finishes its current job (an abandoned one is left to end alone)."""
        if self._queue is not None:
            self._queue.put(None)
            self._queue = None


@dataclass
class WorkerBatch:
    """Rows of one worker call, aligned with ``slots`` (plain arrays: cheap to pickle through Ray)."""

    slots: np.ndarray
    obs: np.ndarray
    action_mask: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    step_id: np.ndarray
    risk: np.ndarray
    failure_reason: list[str | None]

    @classmethod
    def empty(cls, slots: np.ndarray, vocabulary: Vocabulary = CHECKOUT) -> WorkerBatch:
        """Rows for ``slots`` before anything ran: zero observations and rewards, every action legal."""
        k = len(slots)
        return cls(
            slots=np.asarray(slots, dtype=np.int64),
            obs=np.zeros((k, vocabulary.obs_dim), dtype=np.float32),
            action_mask=np.ones((k, vocabulary.n_actions), dtype=bool),
            reward=np.zeros(k, dtype=np.float32),
            terminated=np.zeros(k, dtype=bool),
            truncated=np.zeros(k, dtype=bool),
            step_id=np.zeros(k, dtype=np.int64),
            risk=np.zeros(k, dtype=np.float32),
            failure_reason=[None] * k,
        )

    def scatter(self, part: WorkerBatch) -> None:
        """Write ``part``'s rows into this batch at ``part.slots`` (``self`` spans every slot of the pool)."""
        s = part.slots
        self.obs[s], self.action_mask[s], self.reward[s] = part.obs, part.action_mask, part.reward
        self.terminated[s], self.truncated[s] = part.terminated, part.truncated
        self.step_id[s], self.risk[s] = part.step_id, part.risk
        for slot, reason in zip(s.tolist(), part.failure_reason, strict=True):
            self.failure_reason[slot] = reason


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

    def step(self, slots: np.ndarray, actions: np.ndarray, detach_after_s: float | None = None) -> WorkerBatch:
        """Advance every given slot by one action; ended episodes park their env in the cache.

        With ``detach_after_s`` a step still running after that long does not hold the others: its
        row says ``STEP_PENDING`` and the slot's action is ignored until the step returns; a later
        call delivers its outcome, or ends its episode as ``env_timeout`` once it has run for the
        step timeout. Without it, the batch waits for each step up to the step timeout.
        """
        slots = np.asarray(slots, dtype=np.int64)
        actions = np.asarray(actions)
        out = WorkerBatch.empty(slots, self.vocabulary)
        items: list[tuple[PoolEnv, int] | None] = []
        fresh: list[int] = []  # rows stepped now; the others are steps still pending from an earlier call
        results: list[Any] = [None] * len(slots)
        now = time.perf_counter()
        for row, (slot, action) in enumerate(zip(slots.tolist(), actions.tolist(), strict=True)):
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
        self.counters["step_calls"] += 1
        for row, (slot, res) in enumerate(zip(slots.tolist(), results, strict=True)):
            if isinstance(res, DetachedStep):
                self._pending[slot] = res
                out.failure_reason[row] = STEP_PENDING
                continue
            self._pending.pop(slot, None)
            active = self._active.get(slot)
            if active is None:  # the slot has no episode here (this worker was restarted)
                out.truncated[row] = True
                out.failure_reason[row] = WORKER_LOST
                continue
            if not isinstance(res, tuple):
                del self._active[slot]
                self._record_failure(row, out, res, active.env, active.variant_index)
                continue
            obs, reward, terminated, truncated, info, mask = res
            out.obs[row], out.action_mask[row], out.reward[row] = obs, mask, reward
            out.terminated[row], out.truncated[row] = terminated, truncated
            out.step_id[row] = info.get("step_id", 0)
            out.risk[row] = info.get("risk", 0.0)
            out.failure_reason[row] = info.get("failure_reason")
            if terminated or truncated:
                del self._active[slot]
                self._park(active.variant_index, active.env, active.base_env_id)
        return out

    def _step_one(self, item: tuple[PoolEnv, int] | None) -> tuple[Any, ...] | None:
        if item is None:
            return None
        env, action = item
        obs, reward, terminated, truncated, info = env.step(action)
        if not isinstance(env, SemanticEnv):  # SemanticEnv raises EnvInvalidError itself; don't check twice
            self._check_finite(obs, reward, info.get("env_id", "?"), info.get("step_id", -1))
        mask = info.get("action_mask")
        return obs, reward, terminated, truncated, info, env.action_masks() if mask is None else mask

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
