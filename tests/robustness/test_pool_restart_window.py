"""The pool's restart budget counts per time window, and errors after exhaustion are PoolErrors."""

from __future__ import annotations

from typing import Any

import pytest
from pool_fixtures import TinyFactory, tiny_variants

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import PoolError
from agentflow_core.pool.inprocess import InProcessPool


class Clock:
    """A hand-advanced clock, so the window is tested without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _pool(**config: Any) -> tuple[InProcessPool, Clock]:
    pool = InProcessPool(tiny_variants(4), TinyFactory(), 2, PoolConfig(num_workers=0, **config), seed=0)
    clock = Clock()
    pool.clock = clock
    return pool, clock


def test_losses_days_apart_never_exhaust_the_budget() -> None:
    pool, clock = _pool(max_worker_restarts=3, restart_window_s=3600.0)
    for _ in range(10):  # ten losses, a day apart: each window holds one
        pool._worker_lost(0, RuntimeError("worker died"))
        clock.now += 86_400.0
    assert pool.worker_restarts == 10
    pool.close()


def test_a_crash_loop_within_the_window_stops_the_pool() -> None:
    pool, clock = _pool(max_worker_restarts=3, restart_window_s=3600.0)
    for _ in range(3):
        pool._worker_lost(0, RuntimeError("worker died"))
        clock.now += 600.0
    with pytest.raises(PoolError, match=r"restarted workers 3 times in the last 3600s \(max_worker_restarts=3\)"):
        pool._worker_lost(0, RuntimeError("worker died"))
    pool.close()


def test_the_window_slides() -> None:
    pool, clock = _pool(max_worker_restarts=2, restart_window_s=100.0)
    pool._worker_lost(0, RuntimeError("a"))  # t=0
    clock.now += 60.0
    pool._worker_lost(0, RuntimeError("b"))  # t=60
    clock.now += 50.0  # t=110: the first loss left the window
    pool._worker_lost(0, RuntimeError("c"))
    clock.now += 10.0  # t=120: losses at 60, 110, 120 are three within 100 s
    with pytest.raises(PoolError):
        pool._worker_lost(0, RuntimeError("d"))
    pool.close()


def test_stats_after_a_transport_error_is_a_pool_error() -> None:
    pool, _ = _pool()

    def gone(worker: int, method: str, *args: Any) -> Any:
        raise ConnectionError("actor died and will not restart")

    pool._worker_call = gone  # type: ignore[method-assign]
    with pytest.raises(PoolError, match="pool stats: a worker did not answer \\(ConnectionError"):
        pool.stats()
    pool.close()


def test_window_length_is_validated() -> None:
    with pytest.raises(ValueError, match="restart_window_s"):
        PoolConfig(restart_window_s=float("inf"))
