"""Resets, and steps computing at their patience, are timed on their own thread's CPU clock.

So a loaded machine does not fail (and quarantine) healthy variants. The load is real: this thread
and two busy-looping processes share one CPU, so the env gets about a third of it. A reset that
needs 0.08 s of CPU then takes longer than the 0.1 s step timeout of wall-clock time and still
succeeds; one that needs 0.5 s of CPU is ended once its thread has used the timeout's worth (well
before its 4x wall-clock bound). A step that computes 0.015 s outlives a 0.03 s patience on the wall
clock and is still delivered, not ended as a busy loop.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from agentflow_core.pool.watchdog import LOAD_GRACE
from agentflow_core.pool.worker import EnvWorker
from agentflow_core.semantics import CHECKOUT, SemanticAction
from tests.pool_fixtures import TinyFactory, tiny_variants

TIMEOUT_S = 0.1
pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity (Linux)")


@dataclass(frozen=True)
class CpuHeavyFactory:
    """Tiny shop envs whose construction uses ``cpu_s[env_id]`` seconds of the building thread's CPU."""

    cpu_s: dict[str, float] = field(default_factory=dict, hash=False)
    vocabulary = CHECKOUT

    def __call__(self, variant: Any) -> Any:
        until = time.thread_time() + self.cpu_s.get(variant.env_id, 0.0)
        while time.thread_time() < until:
            pass
        return TinyFactory()(variant)


@dataclass(frozen=True)
class CpuHeavyStepFactory:
    """Tiny shop envs whose steps use ``cpu_s`` seconds of the stepping thread's CPU."""

    cpu_s: float
    vocabulary = CHECKOUT

    def __call__(self, variant: Any) -> Any:
        return CpuHeavyStep(TinyFactory()(variant), self.cpu_s)


class CpuHeavyStep:
    """A tiny shop env whose steps use ``cpu_s`` seconds of the stepping thread's CPU."""

    def __init__(self, inner: Any, cpu_s: float) -> None:
        self.inner, self.cpu_s = inner, cpu_s

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        return self.inner.reset(seed=seed, options=options)

    def step(self, action: int) -> Any:
        until = time.thread_time() + self.cpu_s
        while time.thread_time() < until:
            pass
        return self.inner.step(action)

    def action_masks(self) -> np.ndarray:
        return self.inner.action_masks()

    def close(self) -> None:
        self.inner.close()


def _pin_threads(cpus: set[int]) -> None:
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)


@contextlib.contextmanager
def one_loaded_cpu(spinners: int = 2) -> Iterator[None]:
    """Every thread of this process (the env worker's stepping thread too) on one CPU, shared with
    ``spinners`` busy-looping processes."""
    saved = os.sched_getaffinity(0)
    cpu = min(saved)
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True:\n    pass\n"
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(spinners)]
    _pin_threads({cpu})  # a thread's affinity is its own: the ones already running are pinned one by one
    try:
        time.sleep(0.3)  # the spinners are looping
        yield
    finally:
        _pin_threads(saved)
        for proc in procs:
            proc.kill()
            proc.wait()


def test_a_reset_starved_by_load_succeeds_and_a_cpu_hungry_one_still_ends() -> None:
    variants = tiny_variants(2)
    factory = CpuHeavyFactory({variants[0].env_id: 0.08, variants[1].env_id: 0.5})
    worker = EnvWorker(factory, dict(enumerate(variants)), 8, TIMEOUT_S)
    try:
        with one_loaded_cpu():
            started = time.perf_counter()
            ok = worker.reset(np.array([0]), np.array([0]), np.array([0]))
            starved_wall = time.perf_counter() - started
            started = time.perf_counter()
            hungry = worker.reset(np.array([1]), np.array([1]), np.array([0]))
            hungry_wall = time.perf_counter() - started
        assert starved_wall > TIMEOUT_S  # past the wall-clock timeout: the load was real
        assert ok.failure_reason == [None]  # yet not a timeout: it had used less than 0.1 s of CPU
        assert hungry.failure_reason == ["env_timeout"]
        assert hungry_wall < LOAD_GRACE * TIMEOUT_S + 0.15
        assert worker.stats()["env_timeout"] == 1
    finally:
        worker.close()


def test_a_step_starved_by_load_past_its_patience_is_delivered_not_ended() -> None:
    variants = tiny_variants(1)
    worker = EnvWorker(CpuHeavyStepFactory(0.015), {0: variants[0]}, 8, 0.5)
    try:
        worker.reset(np.array([0]), np.array([0]), np.array([0]))
        with one_loaded_cpu():
            started = time.perf_counter()
            out = worker.step(np.array([0]), np.array([int(SemanticAction.LOGIN)]), detach_after_s=0.03)
            wall = time.perf_counter() - started
        assert wall > 0.03 and out.failure_reason == [None] and out.step_id.tolist() == [1]
        assert worker.stats()["env_timeout"] == 0
    finally:
        worker.close()
