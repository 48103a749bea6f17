"""An env worker hosted in a child process, so a hung env step can be ended by killing it.

A thread cannot be stopped from outside: :class:`~agentflow_core.pool.watchdog.BatchWatchdog` gives up
on a hung step after ``step_timeout_s`` but the thread stays, and a busy-looping env keeps a core and
half the GIL for the rest of the process. :class:`ProcessWorker` has the surface of an
:class:`~agentflow_core.pool.worker.EnvWorker` (``reset``/``step``/``release``/``stats``/``close``)
and runs the real ``EnvWorker`` in a child process started with ``spawn`` (no inherited threads or
locks). The child's watchdog answers a hung step as ``env_timeout`` after one step timeout,
finishes the batch and interrupts the stuck thread: one looping in Python code ends at once, one
blocked in a C call (a sleep, a socket read) ends when the call returns and meanwhile costs no CPU.
A child is *tainted* when an abandoned thread keeps burning CPU (a loop in C code that releases the
GIL) or more than ``max_abandoned_alive`` of them are alive at once; it is then retired:

- a spare child, started ahead of need, takes the new episodes at once (a new spare boots in the
  background);
- a tainted child whose thread spins is killed at once (its remaining episodes end as
  ``worker_lost``); otherwise it keeps stepping the episodes it hosts (they are not lost) and is
  killed once it hosts none, or after ``drain_s`` at the latest;
- a child that stops answering altogether (a C call that holds the GIL, a crash) is killed when its
  heartbeat -- written before every env reset and step -- is older than the step timeout plus a
  margin (``stale_s``); its slots in that call end as ``worker_lost`` and the spare takes over.

So a hang costs the pool one step timeout (one the child cannot answer: the step timeout plus the
margin); the only threads that outlive it are ones blocked in a C call, until that call returns, at
most ``max_abandoned_alive`` per child; no child outlives its drain or the pool.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from agentflow_core.pool.base import WORKER_LOST, EnvFactory, PoolError, VariantLike, factory_vocabulary
from agentflow_core.pool.batch import WorkerBatch
from agentflow_core.pool.watchdog import LOAD_GRACE
from agentflow_core.pool.worker import EnvWorker

logger = logging.getLogger("agentflow.pool")

_CTX = multiprocessing.get_context("spawn")
# counters a child reports that only make sense for the live process (not summed over retired children)
_LIVE_KEYS = ("live", "active", "idle", "catalogue", "worker")


class _HostedWorker(EnvWorker):
    """The child's EnvWorker: stamps a shared heartbeat before each env reset and step, and knows
    which threads are still inside one after the watchdog gave up on them (and how much CPU they burn)."""

    def __init__(self, heartbeat: Any, *args: Any) -> None:
        super().__init__(*args)
        self.heartbeat = heartbeat
        self._inside: dict[threading.Thread, float] = {}  # thread in an env call -> its CPU time at the call's start
        self._waited: set[threading.Thread] = set()  # abandoned threads already given their moment to exit

    def _reset_one(self, item: Any) -> Any:
        return self._stamped(super()._reset_one, item)

    def _step_one(self, item: Any) -> Any:
        return self._stamped(super()._step_one, item)

    def _stamped(self, fn: Callable[[Any], Any], item: Any) -> Any:
        self.heartbeat.value = time.monotonic()
        me = threading.current_thread()
        self._inside[me] = time.thread_time()
        try:
            return fn(item)
        finally:
            self._inside.pop(me, None)

    def stats(self) -> dict[str, Any]:
        """EnvWorker stats plus the abandoned threads still alive and the CPU they used in their env call.

        Called between batches: any thread still inside an env call was abandoned by the watchdog,
        which has already interrupted it; one that looped in Python is given a moment to exit.
        """
        cpu, alive = 0.0, 0
        for thread, started in list(self._inside.items()):
            if thread not in self._waited:
                self._waited.add(thread)
                thread.join(timeout=0.05)
            if not thread.is_alive() or thread.ident is None:
                continue
            try:
                cpu += time.clock_gettime(time.pthread_getcpuclockid(thread.ident)) - started
            except (OSError, ProcessLookupError):  # the thread ended meanwhile
                continue
            alive += 1
        return {**super().stats(), "abandoned_alive": alive, "abandoned_cpu_s": cpu}


def _child_main(
    conn: Connection,
    heartbeat: Any,
    factory: EnvFactory,
    variants: Mapping[int, VariantLike],
    max_live: int,
    step_timeout_s: float,
    worker_index: int,
) -> None:
    """The child's loop: one ``(method, args)`` request in, ``(ok, result, counters)`` out."""
    worker = _HostedWorker(heartbeat, factory, variants, max_live, step_timeout_s, worker_index)
    # A fresh process imports env modules, starts servers and builds templates on its first env of
    # each base env: done here, before "ready", so a first real step does not run into the step timeout.
    first_of_base: dict[str, int] = {}
    for v, spec in variants.items():
        first_of_base.setdefault(spec.base_env_id, v)
    for v in first_of_base.values():
        try:
            worker.prewarm({v: variants[v]}, seed=0)
        except Exception:  # a broken env fails its own episodes later, as in-process; it must not stop the child
            logger.debug("env worker %d: prewarm of variant %d failed", worker_index, v, exc_info=True)
    conn.send(("ready", None, worker.stats()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):  # the parent is gone
            break
        if request is None:
            break
        method, args = request
        heartbeat.value = time.monotonic()
        try:
            result: Any = getattr(worker, method)(*args)
            reply: tuple[Any, ...] = (True, result, worker.stats())
        except Exception as exc:  # handed back to the caller, who raises it
            reply = (False, RuntimeError(f"{type(exc).__name__}: {exc}"), worker.stats())
        conn.send(reply)
    worker.close()


@dataclass(eq=False)
class _Child:
    process: Any
    conn: Connection
    heartbeat: Any
    ready: bool = False
    tainted_at: float | None = None
    slots: set[int] = field(default_factory=set)
    counters: dict[str, Any] = field(default_factory=dict)
    sent_at: float = 0.0

    @property
    def pid(self) -> int:
        return int(self.process.pid)


class ChildLost(PoolError):
    """The child did not answer in time or died; it has been killed."""


class ProcessWorker:
    """An :class:`EnvWorker` in a killable child process (see the module docstring)."""

    def __init__(
        self,
        factory: EnvFactory,
        variants: Mapping[int, VariantLike],
        max_live: int,
        step_timeout_s: float,
        worker_index: int = 0,
        drain_s: float | None = None,
        max_abandoned_alive: int = 8,
    ) -> None:
        self._args = (factory, dict(variants), int(max_live), float(step_timeout_s), int(worker_index))
        self.vocabulary = factory_vocabulary(factory)
        self.worker_index = int(worker_index)
        self.step_timeout_s = float(step_timeout_s)
        # A hung child's own watchdog answers after one step timeout; its heartbeat is stale only when the
        # whole child is stuck (a C call holding the GIL) or gone. The margin absorbs a loaded machine.
        # A reset is timed on its thread's CPU clock, up to LOAD_GRACE timeouts of wall clock: not stale before that.
        self.stale_s = max(self.step_timeout_s + max(self.step_timeout_s, 2.0), LOAD_GRACE * self.step_timeout_s + 1.0)
        self.drain_s = float(drain_s) if drain_s is not None else max(20.0 * self.step_timeout_s, 10.0)
        # an abandoned thread that used this much CPU is spinning: its child goes at once, not after a drain
        self.spin_cpu_s = 0.25 * self.step_timeout_s
        # abandoned threads blocked in a C call (a sleep, a read) cost no CPU and end when the call returns;
        # past this many at once the child is retired all the same
        self.max_abandoned_alive = int(max_abandoned_alive)
        self.current = self._spawn()
        self.spare: _Child | None = self._spawn()  # boots meanwhile: a replacement is ready when needed
        self.draining: list[_Child] = []
        self._retired: dict[str, int] = {}
        self.host_counters = {
            "children_started": 2,
            "children_retired": 0,
            "children_killed_spinning": 0,
            "children_killed_hung": 0,
            "episodes_lost_with_child": 0,
        }
        self._await_ready(self.current)

    # ------------------------------------------------------------------ child lifecycle
    def _spawn(self) -> _Child:
        parent_conn, child_conn = _CTX.Pipe()
        heartbeat = _CTX.RawValue("d", time.monotonic())
        process = _CTX.Process(
            target=_child_main,
            args=(child_conn, heartbeat, *self._args),
            name=f"agentflow-env-worker-{self._args[4]}",
            daemon=True,
        )
        process.start()
        child_conn.close()
        return _Child(process, parent_conn, heartbeat)

    def _await_ready(self, child: _Child, timeout_s: float = 120.0) -> None:
        if not child.conn.poll(timeout_s):
            self._kill(child)
            raise ChildLost(f"env worker {self.worker_index}: the child process did not start in {timeout_s:g} s")
        self._take_ready(child)

    def _take_ready(self, child: _Child) -> None:
        try:
            tag, _, counters = child.conn.recv()
        except (EOFError, OSError) as exc:  # it died while starting
            self._kill(child)
            raise ChildLost(f"env worker {self.worker_index}: a child process died while starting") from exc
        assert tag == "ready", tag
        child.ready, child.counters = True, counters

    def _kill(self, child: _Child) -> None:
        """End the child's process (SIGKILL) and keep its last counters."""
        if child.process.is_alive():
            child.process.kill()
        child.process.join(timeout=5.0)
        child.conn.close()
        for key, value in child.counters.items():
            if key not in _LIVE_KEYS and isinstance(value, int | float):
                self._retired[key] = self._retired.get(key, 0) + int(value)
        child.counters = {}

    def _children(self) -> list[_Child]:
        return [self.current, *self.draining]

    def _new_spare(self) -> None:
        if self.spare is None:
            self.spare = self._spawn()
            self.host_counters["children_started"] += 1

    def _maintain(self) -> None:
        """Swap in a ready spare for a tainted child; kill drained, spinning or overdue tainted children.

        A child whose abandoned thread sleeps (or waits on I/O) costs nothing while its other episodes
        run to their end. One whose abandoned thread spins takes a core and, through the GIL, slows every
        env call of that child, so the whole synchronous pool step: it is killed at once and its
        remaining episodes end as ``worker_lost``.
        """
        if self.current.tainted_at is not None:
            self._new_spare()
            assert self.spare is not None
            if self.spare.ready or self.spare.conn.poll():
                if not self.spare.ready:
                    try:
                        self._take_ready(self.spare)
                    except ChildLost:  # the next call starts another
                        self.spare = None
                        return
                self.draining.append(self.current)
                self.current, self.spare = self.spare, None
                self._new_spare()
        now = time.monotonic()
        for child in list(self.draining):
            assert child.tainted_at is not None
            spinning = child.counters.get("abandoned_cpu_s", 0.0) >= self.spin_cpu_s
            if child.slots and not spinning and now - child.tainted_at <= self.drain_s:
                continue
            if child.slots:
                logger.warning(
                    "env worker %d: tainted child %d killed (%s) with %d episodes",
                    self.worker_index,
                    child.pid,
                    "its abandoned thread spins" if spinning else f"still draining after {self.drain_s:g} s",
                    len(child.slots),
                )
                self.host_counters["episodes_lost_with_child"] += len(child.slots)
            self.host_counters["children_killed_spinning"] += spinning
            self.draining.remove(child)
            self._kill(child)
            child.slots.clear()
            self.host_counters["children_retired"] += 1

    def _replace_lost(self, child: _Child) -> None:
        """``child`` was killed mid-call: if it was the current one, a spare (or a new child) takes over."""
        self.host_counters["children_killed_hung"] += 1
        self.host_counters["episodes_lost_with_child"] += len(child.slots)
        child.slots.clear()
        if child in self.draining:
            self.draining.remove(child)
            return
        self._new_spare()
        assert self.spare is not None
        if not self.spare.ready:
            self._await_ready(self.spare)
        self.current, self.spare = self.spare, None
        self._new_spare()

    # ------------------------------------------------------------------ one request
    def _send(self, child: _Child, method: str, *args: Any) -> None:
        child.sent_at = time.monotonic()
        try:
            child.conn.send((method, args))
        except OSError:  # the child died: _recv finds it dead and replaces it
            logger.debug("env worker %d: send to child %d failed", self.worker_index, child.pid, exc_info=True)

    def _recv(self, child: _Child) -> Any:
        """The child's answer; kills the child (ChildLost) if its heartbeat goes stale or it dies."""
        while not child.conn.poll(min(0.1, self.stale_s)):
            beat = max(child.heartbeat.value, child.sent_at)
            if not child.process.is_alive() or time.monotonic() - beat > self.stale_s:
                logger.warning(
                    "env worker %d: child %d gave no sign of life for %.1f s; killed",
                    self.worker_index,
                    child.pid,
                    time.monotonic() - beat,
                )
                self._kill(child)
                raise ChildLost(f"env worker {self.worker_index}: child {child.pid} hung or died")
        try:
            ok, result, counters = child.conn.recv()
        except (EOFError, OSError) as exc:
            self._kill(child)
            raise ChildLost(f"env worker {self.worker_index}: child {child.pid} died") from exc
        if child.tainted_at is None and (
            counters.get("abandoned_alive", 0) > self.max_abandoned_alive
            or counters.get("abandoned_cpu_s", 0.0) >= self.spin_cpu_s
        ):
            child.tainted_at = time.monotonic()
        child.counters = counters
        if not ok:
            raise result
        return result

    def _call(self, child: _Child, method: str, *args: Any) -> Any:
        self._send(child, method, *args)
        return self._recv(child)

    def wait_spare(self, timeout_s: float = 120.0) -> bool:
        """Block until the spare child has started (tests, benchmarks); True if one is ready."""
        self._new_spare()
        assert self.spare is not None
        if not self.spare.ready:
            try:
                self._await_ready(self.spare, timeout_s)
            except ChildLost:
                self.spare = None
                return False
        return True

    # ------------------------------------------------------------------ the EnvWorker surface
    def pid(self) -> int:
        """OS process id of the child that starts new episodes."""
        return self.current.pid

    def ping(self) -> int:
        """Answers with the worker index (the child is asked, so a hung child is found)."""
        return int(self._call(self.current, "ping"))

    def release(self, slots: Sequence[int] | np.ndarray) -> None:
        """End the slots' episodes without stepping, wherever they are hosted."""
        slots_list = np.asarray(slots, dtype=np.int64).tolist()
        for child in self._children():
            mine = [s for s in slots_list if s in child.slots]
            if mine:
                child.slots.difference_update(mine)
                try:
                    self._call(child, "release", np.asarray(mine, dtype=np.int64))
                except ChildLost:
                    self._replace_lost(child)
        self._maintain()

    def start(self, method: str, *args: Any) -> Callable[[], Any]:
        """Send ``method`` to the children now and return the call that collects the answer.

        The pool starts every worker's ``step``/``reset`` before it collects any, so the children
        run in parallel; other methods run when collected.
        """
        if method == "step":
            return self._step_start(*args)
        if method == "reset":
            return self._reset_start(*args)
        return lambda: getattr(self, method)(*args)

    def reset(self, slots: np.ndarray, variant_indices: np.ndarray, seeds: np.ndarray) -> WorkerBatch:
        """Start the slots' episodes on the child that takes new episodes."""
        out: WorkerBatch = self._reset_start(slots, variant_indices, seeds)()
        return out

    def _reset_start(self, slots: np.ndarray, variant_indices: np.ndarray, seeds: np.ndarray) -> Callable[[], Any]:
        slots = np.asarray(slots, dtype=np.int64)
        for draining in self.draining:  # a slot restarting here must not keep an episode on a retiring child
            if draining.slots.intersection(slots.tolist()):
                self.release([s for s in slots.tolist() if s in draining.slots])
        child = self.current
        self._send(child, "reset", slots, variant_indices, seeds)
        return lambda: self._reset_finish(child, slots)

    def _reset_finish(self, child: _Child, slots: np.ndarray) -> WorkerBatch:
        try:
            out: WorkerBatch = self._recv(child)
        except ChildLost:
            self._replace_lost(child)
            out = WorkerBatch.empty(slots, self.vocabulary)
            out.truncated[:] = True
            out.failure_reason = [WORKER_LOST] * len(slots)
            return out
        child.slots.difference_update(slots.tolist())
        child.slots.update(s for s, r in zip(slots.tolist(), out.failure_reason, strict=True) if r is None)
        self._maintain()
        return out

    def step(self, slots: np.ndarray, actions: np.ndarray) -> WorkerBatch:
        """Step each slot on the child hosting its episode (children in parallel); others are worker_lost."""
        out: WorkerBatch = self._step_start(slots, actions)()
        return out

    def _step_start(self, slots: np.ndarray, actions: np.ndarray) -> Callable[[], Any]:
        slots, actions = np.asarray(slots, dtype=np.int64), np.asarray(actions)
        sent: list[tuple[_Child, np.ndarray]] = []
        slot_list = slots.tolist()
        for child in self._children():
            rows = np.flatnonzero([s in child.slots for s in slot_list]) if child.slots else np.empty(0, np.int64)
            if rows.size:
                sent.append((child, rows))
                self._send(child, "step", slots[rows], actions[rows])
        return lambda: self._step_finish(slots, sent)

    def _step_finish(self, slots: np.ndarray, sent: list[tuple[_Child, np.ndarray]]) -> WorkerBatch:
        out = WorkerBatch.empty(slots, self.vocabulary)
        out.truncated[:] = True
        out.failure_reason = [WORKER_LOST] * len(slots)
        for child, rows in sent:
            try:
                part: WorkerBatch = self._recv(child)
            except ChildLost:
                self._replace_lost(child)
                continue
            _place(out, rows, part)
            ended = part.slots[part.terminated | part.truncated]
            child.slots.difference_update(ended.tolist())
        self._maintain()
        return out

    def stats(self) -> dict[str, Any]:
        """The EnvWorker counters summed over every child this worker ran, plus the host's own counters."""
        fresh = self._call(self.current, "stats")
        merged: dict[str, Any] = {**fresh, "worker": self.worker_index}
        for child in self.draining:
            for key, value in child.counters.items():
                if isinstance(value, int | float) and key != "worker":
                    merged[key] = merged.get(key, 0) + value
        for key, value in self._retired.items():
            merged[key] = merged.get(key, 0) + value
        alive = [c for c in (*self._children(), self.spare) if c is not None and c.process.is_alive()]
        merged.update(self.host_counters, child_pids=[c.pid for c in alive])
        return merged

    def close(self) -> None:
        """Close the envs of every child and end the child processes."""
        for child in (*self._children(), self.spare):
            if child is None:
                continue
            if child.tainted_at is None and child.process.is_alive():
                try:
                    child.conn.send(None)
                    child.process.join(timeout=2.0)
                except (OSError, BrokenPipeError):
                    pass
            self._kill(child)
        self.draining.clear()
        self.spare = None


def _place(out: WorkerBatch, rows: np.ndarray, part: WorkerBatch) -> None:
    """Write ``part`` (one child's answer) into ``out`` at positions ``rows``."""
    out.obs[rows], out.action_mask[rows], out.reward[rows] = part.obs, part.action_mask, part.reward
    out.terminated[rows], out.truncated[rows] = part.terminated, part.truncated
    out.step_id[rows], out.risk[rows], out.business_value[rows] = part.step_id, part.risk, part.business_value
    for row, reason in zip(rows.tolist(), part.failure_reason, strict=True):
        out.failure_reason[row] = reason
