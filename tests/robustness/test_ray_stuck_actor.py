"""Hangs in a Ray actor cost the pool at most a patience, or one kill and replace, never the call timeout.

On a real local Ray (``ray_session``, ``address="local"``) with ``pool.step_patience_s``:

- a step busy-looping in Python is ended at the patience (its thread interrupted, the actor idle
  again), not waited for to the step timeout while the whole pool step waits for that actor;
- a step sleeping in Python is left pending: the other slots keep stepping until it is ended at
  the step timeout;
- a step stuck in a C call that keeps the actor's GIL (no thread there can run, so nothing can
  interrupt it) gets the actor killed and replaced by the warm standby after ``stuck_after_s``, not
  the call timeout; only that actor's episodes end (``worker_lost``) and its process is gone.
"""

from __future__ import annotations

import time

import numpy as np
import psutil
import pytest
from ray import cloudpickle

from agentflow_core.config import PoolConfig
from agentflow_core.pool.ray_pool import RayPool
from agentflow_core.semantics import SemanticAction
from tests import pool_fixtures
from tests.pool_fixtures import Fault, TinyFactory, tiny_variants

cloudpickle.register_pickle_by_value(pool_fixtures)
pytestmark = pytest.mark.usefixtures("ray_session")

LOGIN, VIEW = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT)
N = 6
FAULTY = 1


def _pool(kind: str, timeout_s: float, standby: int = 0) -> RayPool:
    variants = tiny_variants(N)
    factory = TinyFactory(faults={variants[FAULTY].env_id: Fault(kind, at_step=2, hang_s=30.0)})
    cfg = PoolConfig(
        num_workers=2,
        scheduler="round_robin",
        step_timeout_s=timeout_s,
        step_patience_s=0.05,
        step_patience_engages="always",
        quarantine_after=10,
    )
    pool = RayPool(variants, factory, N, cfg, seed=0, standby_workers=standby)
    pool.reset(seed=0)
    pool.step(np.full(N, LOGIN))
    assert pool.slot_variants().tolist() == list(range(N))  # round robin: slot s plays variant s
    assert set(pool.worker_of.tolist()) == {0, 1}  # both actors host episodes
    return pool


def _gone(pids: list[int], within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_a_python_busy_loop_in_an_actor_is_ended_at_the_patience() -> None:
    pool = _pool("spin", timeout_s=1.0)
    pids = pool.worker_pids()
    try:
        started = time.perf_counter()
        batch = pool.step(np.full(N, VIEW))
        assert time.perf_counter() - started < 0.6  # the patience (0.05 s), far below the 1 s step timeout
        assert batch.pending is None and batch.infos[FAULTY]["failure_reason"] == "env_timeout"
        assert [batch.infos[s]["step_id"] for s in range(N) if s != FAULTY] == [2] * (N - 1)
        actor = psutil.Process(pids[int(pool.worker_of[FAULTY])])
        before = sum(actor.cpu_times()[:2])
        time.sleep(0.5)
        assert sum(actor.cpu_times()[:2]) - before < 0.25  # the interrupted loop no longer burns a core
        assert pool.worker_restarts == 0
    finally:
        pool.close()
    assert _gone(pids)


def test_a_python_sleep_in_an_actor_leaves_the_other_slots_stepping() -> None:
    pool = _pool("hang", timeout_s=0.6)
    pids = pool.worker_pids()
    try:
        started = time.perf_counter()
        batch = pool.step(np.full(N, VIEW))
        assert time.perf_counter() - started < 0.5 and batch.pending is not None
        assert batch.pending.tolist() == [s == FAULTY for s in range(N)]
        healthy_steps = 1
        while batch.pending is not None and batch.pending[FAULTY]:
            assert time.perf_counter() - started < 3.0
            time.sleep(0.02)  # paced: the tiny episodes must not reach their step limit meanwhile
            batch = pool.step(np.full(N, VIEW))
            healthy_steps += 1
            assert [batch.infos[s]["step_id"] for s in range(N) if s != FAULTY] == [1 + healthy_steps] * (N - 1)
        assert batch.infos[FAULTY]["failure_reason"] == "env_timeout"
        assert healthy_steps >= 5 and pool.worker_restarts == 0
    finally:
        pool.close()
    assert _gone(pids)


def test_an_actor_stuck_in_a_c_call_holding_its_gil_is_killed_and_replaced_by_the_standby() -> None:
    pool = _pool("gil_sleep", timeout_s=0.3, standby=1)
    pids = pool.worker_pids()
    stuck = int(pool.worker_of[FAULTY])
    try:
        assert pool.wait_standby() == 1
        assert pool.stuck_after_s < pool.call_timeout_s
        started = time.perf_counter()
        batch = pool.step(np.full(N, VIEW))
        took = time.perf_counter() - started
        assert pool.stuck_after_s <= took < pool.stuck_after_s + 3.0  # not the call timeout (11.2 s here)
        assert pool.worker_restarts == 1 and pool.worker_pids()[stuck] != pids[stuck]
        on_stuck = pool.worker_of == stuck
        reasons = [info["failure_reason"] for info in batch.infos]
        assert [r == "worker_lost" for r in reasons] == on_stuck.tolist()  # only the stuck actor's episodes
        assert all(batch.infos[s]["step_id"] == 2 for s in np.flatnonzero(~on_stuck).tolist())
        assert _gone([pids[stuck]], within_s=5.0)
        batch = pool.step(np.full(N, LOGIN))
        assert all(info["failure_reason"] is None for info in batch.infos)
        pids = pool.worker_pids()
    finally:
        pool.close()
    assert _gone(pids)
