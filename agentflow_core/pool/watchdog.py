"""The watchdog an env worker steps its batch under: one helper thread, a deadline per item, no hung step.

:class:`BatchWatchdog` runs a function over a batch's items in a helper thread and waits on the
deadline of the item in progress. An item past ``timeout_s`` is abandoned (:data:`TIMED_OUT`), its
thread interrupted (:func:`interrupt_thread`: a step looping in Python ends there), and the rest of
the batch continues on a fresh thread; with a patience, a slow item is handed back as a
:class:`DetachedStep` the worker collects later. Ray never detects a hung call, so the timeout has to
live here. Clocks leave out the interpreter's garbage collections (:func:`gc_seconds`): a full
collection of a large heap stops every thread for a quarter of a second or more, which is no env's
fault; an item timed on its thread's CPU clock may take up to ``LOAD_GRACE`` timeouts of wall time
on a loaded machine.
"""

from __future__ import annotations

import gc
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class _Timeout:
    """Result marker of an item abandoned by the watchdog."""


TIMED_OUT = _Timeout()
# CPU time a stuck step must have used to count as computing (not waiting) at its patience.
COMPUTING_MIN_CPU_S = 0.002
# Wall-clock bound, in step timeouts, of an item timed on its thread's CPU clock (``cpu_clock``),
# and the shortest wait before such an item's CPU clock is read again.
LOAD_GRACE = 4.0
CPU_RECHECK_S = 0.005

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


def _start_item(job: _Job, i: int) -> None:
    """Item ``i`` of ``job`` starts now: its clocks (wall, garbage collections, thread and process CPU)."""
    job.current, job.started, job.gc_started = i, time.perf_counter(), gc_seconds()
    job.cpu_started, job.process_cpu_started = time.thread_time(), time.process_time()


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
            end = len(job.items)
            with job.lock:
                if job.abandoned:
                    return
                if job.start < end:
                    _start_item(job, job.start)
            for i in range(job.start, end):
                try:
                    out: Any = job.fn(job.items[i])
                except BaseException as exc:  # isolate whatever the env raised
                    out = exc
                with job.lock:  # one hand-over per item: its answer, and the next item's start
                    if job.abandoned:  # the batch went on without this thread: a detached item's
                        if job.detached is not None:  # answer is kept for its owner, a timed-out one dropped
                            job.detached.result = out
                            job.detached.done.set()
                        return
                    job.results[i] = out
                    if i + 1 < end:
                        _start_item(job, i + 1)
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
