"""Hangs cannot freeze the in-process pool with ``pool.step_isolation: process``.

Each env worker runs in a child process (:mod:`agentflow_core.pool.process_host`). A sleeping or
busy-looping env step ends its own episode as ``env_timeout`` after one step timeout; the child
that held the abandoned thread is retired once its other episodes end (they are not lost) and no
thread or process is left behind. Each such step costs at most one step timeout: the bound is the
timeout plus 0.5 s of scheduling slack for a loaded 2-core CI (here the step beside the timeout
takes 0.01-0.06 s, measured while a DVC test ran), so a step that waited two timeouts fails.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import psutil
import pytest

from agentflow_core.config import PoolConfig
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.pool.process_host import ProcessWorker
from agentflow_core.semantics import SemanticAction
from tests.pool_fixtures import Fault, TinyFactory, tiny_variants

LOGIN, VIEW, PAY = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT), int(SemanticAction.SUBMIT_PAYMENT)
TIMEOUT_S = 0.5
ONE_TIMEOUT_S = TIMEOUT_S + 0.5  # one step timeout, plus a loaded machine's scheduling slack


def _pool(kind: str, n: int = 4, faulty_slot: int = 1, hang_s: float = 30.0) -> InProcessPool:
    variants = tiny_variants(n)
    factory = TinyFactory(faults={variants[faulty_slot].env_id: Fault(kind, at_step=2, hang_s=hang_s)})
    cfg = PoolConfig(
        num_workers=2,
        backend="inprocess",
        step_isolation="process",
        scheduler="round_robin",
        step_timeout_s=TIMEOUT_S,
        quarantine_after=1,
    )
    return InProcessPool(variants, factory, n, cfg, seed=0)


def _children() -> set[int]:
    """Child processes of this test process, less multiprocessing's one resource tracker (it lives as long as we do)."""
    return {
        c.pid
        for c in psutil.Process().children(recursive=True)
        if c.is_running() and c.status() != psutil.STATUS_ZOMBIE and "resource_tracker" not in " ".join(c.cmdline())
    }


def test_a_sleeping_hang_costs_one_timeout_and_its_thread_ends_with_the_sleep() -> None:
    threads_before, children_before = threading.active_count(), _children()
    pool = _pool("hang", hang_s=1.0)
    pool.reset(seed=0)
    pool.step(np.full(4, LOGIN))
    host = pool.workers[pool.worker_of[1]]
    started = time.perf_counter()
    batch = pool.step(np.full(4, VIEW))  # slot 1's env sleeps for 1 s on its 2nd step
    assert time.perf_counter() - started < ONE_TIMEOUT_S
    assert batch.infos[1]["failure_reason"] == "env_timeout" and batch.truncated.tolist() == [False, True, False, False]
    assert host.stats()["abandoned_alive"] == 1  # blocked in time.sleep: no CPU, ends when the sleep returns
    # The other episodes carry on and finish: none is lost.
    for _ in range(3):
        batch = pool.step(np.full(4, VIEW))
    assert [batch.infos[s]["step_id"] for s in (0, 2, 3)] == [5, 5, 5]
    batch = pool.step(np.full(4, PAY))
    assert all(batch.infos[s]["success"] for s in (0, 2, 3))
    deadline = time.monotonic() + 10
    while host.stats()["abandoned_alive"]:
        assert time.monotonic() < deadline, "the interrupted thread did not end after its sleep"
        time.sleep(0.1)
    stats = pool.stats()
    assert stats["env_timeout"] == 1 and stats["worker_lost"] == 0
    assert stats["quarantined"] == {"tiny_shop_v1_0001": "env_timeout"}
    pool.close()
    assert not (_children() - children_before), "a child process outlived the pool"
    assert threading.active_count() <= threads_before + 1  # no abandoned env-step thread in this process


def test_a_child_with_too_many_stuck_threads_is_retired_after_its_episodes_end() -> None:
    children_before = _children()
    variants = tiny_variants(4)
    factory = TinyFactory(faults={variants[1].env_id: Fault("hang", at_step=2, hang_s=60.0)})
    host = ProcessWorker(factory, dict(enumerate(variants)), 16, TIMEOUT_S, 0, max_abandoned_alive=0)
    slots = np.arange(4)
    host.reset(slots, np.arange(4), np.zeros(4, np.int64))
    host.step(slots, np.full(4, LOGIN))
    assert host.wait_spare()  # on a loaded machine the spare may still be importing
    tainted = host.current.pid
    started = time.perf_counter()
    out = host.step(slots, np.full(4, VIEW))
    assert time.perf_counter() - started < ONE_TIMEOUT_S
    assert out.failure_reason == [None, "env_timeout", None, None]
    # New episodes start on the spare; the tainted child keeps its three episodes until they end.
    host.reset(np.array([1]), np.array([0]), np.array([7]))
    assert host.current.pid != tainted and tainted in host.stats()["child_pids"]
    live = np.array([0, 2, 3])
    for _ in range(3):
        out = host.step(live, np.full(3, VIEW))
        assert out.failure_reason == [None, None, None]
    out = host.step(live, np.full(3, PAY))
    assert out.terminated.all() and out.failure_reason == [None, None, None]
    stats = host.stats()
    assert tainted not in stats["child_pids"] and stats["children_retired"] == 1
    assert stats["episodes_lost_with_child"] == 0
    assert not psutil.pid_exists(tainted) or psutil.Process(tainted).status() == psutil.STATUS_ZOMBIE
    host.close()
    assert not (_children() - children_before), "a child process outlived the host"


def test_a_spinning_hang_costs_one_timeout_and_its_thread_ends_in_the_child() -> None:
    pool = _pool("spin")
    pool.reset(seed=0)
    pool.step(np.full(4, LOGIN))
    host = pool.workers[pool.worker_of[1]]
    child_pid = host.current.pid
    started = time.perf_counter()
    batch = pool.step(np.full(4, VIEW))  # slot 1's env busy-loops for 30 s on its 2nd step
    assert time.perf_counter() - started < ONE_TIMEOUT_S
    assert batch.infos[1]["failure_reason"] == "env_timeout"
    stats = host.stats()
    # The watchdog interrupted the looping step: its thread is gone, so the child stays and nothing is lost.
    assert stats["abandoned_threads"] == 1 and stats["abandoned_alive"] == 0
    assert host.current.pid == child_pid and stats["children_retired"] == 0
    assert psutil.Process(child_pid).num_threads() <= _threads_of_an_idle_child(pool)
    for t in range(10):
        batch = pool.step(np.full(4, PAY if t % 2 else LOGIN))
    stats = pool.stats()
    assert stats["worker_lost"] == 0 and stats["failing_variants"] == {"tiny_shop_v1_0001": 1}
    pool.close()


def test_the_in_process_watchdog_ends_a_busy_looping_step_too() -> None:
    """Default isolation (threads, also inside each Ray actor): a step looping in Python leaves no thread."""
    variants = tiny_variants(4)
    factory = TinyFactory(faults={variants[1].env_id: Fault("spin", at_step=2, hang_s=30.0)})
    cfg = PoolConfig(
        num_workers=2, backend="inprocess", scheduler="round_robin", step_timeout_s=TIMEOUT_S, step_patience_s=None
    )
    pool = InProcessPool(variants, factory, 4, cfg, seed=0)
    pool.reset(seed=0)
    pool.step(np.full(4, LOGIN))
    before = threading.active_count()
    started = time.perf_counter()
    batch = pool.step(np.full(4, VIEW))
    assert time.perf_counter() - started < ONE_TIMEOUT_S
    assert batch.infos[1]["failure_reason"] == "env_timeout"
    deadline = time.monotonic() + 3 * TIMEOUT_S
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before  # the abandoned thread ended; only its replacement runs
    assert pool.stats()["env_timeout"] == 1
    pool.close()


def _threads_of_an_idle_child(pool: InProcessPool) -> int:
    other = pool.workers[1 - pool.worker_of[1]]
    return psutil.Process(other.current.pid).num_threads() + 1  # the hung child started one more helper


def test_a_child_that_stops_answering_is_killed_and_replaced() -> None:
    pool = _pool("crash")
    pool.reset(seed=0)
    worker = pool.workers[0]
    victim = worker.pid()
    psutil.Process(victim).suspend()  # like a C call holding the GIL: no heartbeat, no answer
    started = time.perf_counter()
    batch = pool.step(np.full(4, LOGIN))
    assert time.perf_counter() - started < 3 * (TIMEOUT_S + 2.0)  # stale heartbeat: step timeout + 2 s
    lost = [i for i, info in enumerate(batch.infos) if info["failure_reason"] == "worker_lost"]
    assert lost, "the suspended child's slots should end as worker_lost"
    assert worker.pid() != victim and worker.stats()["children_killed_hung"] == 1
    assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
    batch = pool.step(np.full(4, LOGIN))
    assert not [i for i in batch.infos if i["failure_reason"] == "worker_lost"]
    pool.close()


def test_process_isolation_steps_like_threads_on_healthy_envs() -> None:
    variants = tiny_variants(6)
    pools = [
        InProcessPool(
            variants,
            TinyFactory(),
            6,
            PoolConfig(num_workers=2, backend="inprocess", step_isolation=mode, scheduler="round_robin"),
            seed=3,
        )
        for mode in ("thread", "process")
    ]
    batches = [p.reset(seed=3) for p in pools]
    assert np.array_equal(batches[0].obs, batches[1].obs)
    rng = np.random.default_rng(0)
    for _ in range(40):
        actions = rng.integers(0, 3, size=6)
        actions = np.array([(LOGIN, VIEW, PAY)[a] for a in actions])
        a, b = (p.step(actions) for p in pools)
        assert np.array_equal(a.obs, b.obs) and np.array_equal(a.reward, b.reward)
        assert np.array_equal(a.terminated, b.terminated) and np.array_equal(a.truncated, b.truncated)
        assert [i["env_id"] for i in a.infos] == [i["env_id"] for i in b.infos]
    for p in pools:
        p.close()


@pytest.mark.usefixtures("ray_session")
def test_a_busy_looping_step_in_a_ray_actor_ends_and_the_actor_goes_on() -> None:
    from agentflow_core.pool.ray_pool import RayPool

    variants = tiny_variants(4)
    factory = TinyFactory(faults={variants[2].env_id: Fault("spin", at_step=2, hang_s=60.0)})
    cfg = PoolConfig(num_workers=2, scheduler="round_robin", step_timeout_s=TIMEOUT_S, step_patience_s=None)
    pool = RayPool(variants, factory, 4, cfg, seed=0)
    try:
        pool.reset(seed=0)
        pool.step(np.full(4, LOGIN))
        started = time.perf_counter()
        batch = pool.step(np.full(4, VIEW))
        assert time.perf_counter() - started < ONE_TIMEOUT_S
        assert batch.infos[2]["failure_reason"] == "env_timeout"
        actor = psutil.Process(pool.worker_pids()[int(pool.worker_of[2])])
        before = sum(actor.cpu_times()[:2])
        time.sleep(1.0)
        assert sum(actor.cpu_times()[:2]) - before < 0.5  # a step still spinning would burn ~1 CPU-s here
        batch = pool.step(np.full(4, VIEW))
        assert [batch.infos[s]["step_id"] for s in (0, 1, 3)] == [3, 3, 3]
        assert pool.stats()["env_timeout"] == 1 and pool.worker_restarts == 0
    finally:
        pool.close()
