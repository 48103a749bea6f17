"""A garbage collection is no env's fault: the step watchdog leaves its pause out of a step's clocks.

A full collection of a large heap stops every thread (in the soak benchmark's pool of 300 envs beside
torch: 0.2-0.3 s, longer than the soak's 0.25 s step timeout). Healthy steps caught in one were ended
as ``env_timeout`` on clean and faulty sides alike.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import pytest

from agentflow_core.pool.watchdog import TIMED_OUT, BatchWatchdog, gc_seconds


@pytest.fixture
def big_heap() -> Iterator[float]:
    """A heap whose full collection takes a while; yields how long one took."""
    junk = [[i] for i in range(3_000_000)]  # container objects the collector walks
    gc.collect()
    began = time.perf_counter()
    gc.collect()
    yield time.perf_counter() - began
    del junk


def test_a_collection_on_the_stepping_thread_does_not_end_its_step(big_heap: float) -> None:
    timeout = big_heap / 4
    watchdog = BatchWatchdog(timeout_s=timeout)
    before = gc_seconds()

    def step(_: int) -> str:
        gc.collect()  # counted on this thread's CPU and wall clocks, as a collection triggered here would be
        return "ok"

    assert watchdog.run(step, [0]) == ["ok"]
    assert gc_seconds() - before >= 2 * timeout
    assert watchdog.abandoned_threads == 0


def test_a_step_that_really_hangs_is_still_ended_on_time() -> None:
    watchdog = BatchWatchdog(timeout_s=0.1)
    began = time.perf_counter()
    assert watchdog.run(lambda _: time.sleep(1.0), [0]) == [TIMED_OUT]
    assert time.perf_counter() - began < 0.5
