"""Fault isolation in the in-process pool: crash, hang and NaN close only their own episode."""

from __future__ import annotations

import logging
import time

import numpy as np
import pytest
from pool_fixtures import Fault, TinyFactory, tiny_variants

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import PoolError
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.pool.watchdog import TIMED_OUT, BatchWatchdog
from agentflow_core.semantics import SemanticAction

LOGIN, VIEW, PAY = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT), int(SemanticAction.SUBMIT_PAYMENT)
CASES = [("crash", "env_crash"), ("hang", "env_timeout"), ("nan", "env_invalid")]


def faulty_pool(kind: str, n: int = 4, faulty_slot: int = 1, **config: object) -> InProcessPool:
    variants = tiny_variants(n)
    factory = TinyFactory(faults={variants[faulty_slot].env_id: Fault(kind, at_step=2, hang_s=1.0)})
    cfg = PoolConfig(
        **{"num_workers": 2, "scheduler": "round_robin", "step_timeout_s": 0.25, "step_patience_s": None, **config}
    )
    return InProcessPool(variants, factory, n, cfg, seed=0)


@pytest.mark.parametrize(("kind", "reason"), CASES)
def test_fault_closes_only_its_own_episode(kind: str, reason: str) -> None:
    pool = faulty_pool(kind)
    pool.reset(seed=0)
    pool.step(np.full(4, LOGIN))
    batch = pool.step(np.full(4, VIEW))  # the faulty variant fails on its 2nd step
    assert batch.truncated.tolist() == [False, True, False, False] and not batch.terminated.any()
    info = batch.infos[1]
    assert info["failure_reason"] == reason and info["env_id"] == "tiny_shop_v1_0001"
    assert info["episode_length"] == 2 and info["success"] is False
    assert info["episode_return"] == pytest.approx(-0.01, abs=1e-6)  # the failed step earns nothing
    assert batch.reward[1] == 0.0 and np.isfinite(batch.final_obs).all()
    assert batch.final_obs[1, 1] == 1.0  # LOGGED_IN: the last good observation is the final one
    # The other episodes go on: step ids continue and returns keep accumulating.
    for _ in range(3):
        batch = pool.step(np.full(4, VIEW))
    assert [batch.infos[s]["step_id"] for s in (0, 2, 3)] == [5, 5, 5]
    batch = pool.step(np.full(4, PAY))
    for s in (0, 2, 3):
        assert batch.infos[s]["success"] and batch.infos[s]["episode_length"] == 6
        assert batch.infos[s]["episode_return"] == pytest.approx(-0.05 + 10.0, abs=1e-5)
    stats = pool.stats()
    assert stats[reason] == 1 and stats["failing_variants"] == {"tiny_shop_v1_0001": 1}
    assert sum(w[reason] for w in stats["workers"]) == 1
    assert stats["episodes"] == 4 and stats["successes"] == 3
    pool.close()


def test_failed_env_is_recreated_for_its_next_episode() -> None:
    pool = faulty_pool("crash", n=2, faulty_slot=0, num_workers=1)
    pool.reset(seed=0)
    pool.step(np.full(2, LOGIN))
    pool.step(np.full(2, VIEW))  # variant 0 crashes; round robin gives the slot variant 0 again
    worker = pool.workers[0]
    assert worker.counters["env_crash"] == 1 and worker.counters["created"] == 3
    batch = pool.step(np.full(2, LOGIN))
    assert batch.infos[0]["env_id"] == "tiny_shop_v1_0000" and batch.infos[0]["step_id"] == 1
    pool.close()


def test_repeated_failure_quarantines_the_variant(caplog: pytest.LogCaptureFixture) -> None:
    pool = faulty_pool("crash", n=3, faulty_slot=1, quarantine_after=2)
    with caplog.at_level(logging.WARNING, logger="agentflow.pool"):
        pool.reset(seed=0)
        crashes = 0
        for t in range(40):
            batch = pool.step(np.full(3, LOGIN if t % 2 == 0 else PAY))
            crashes += sum(i["failure_reason"] == "env_crash" for i in batch.infos)
            if "tiny_shop_v1_0001" in pool.stats()["quarantined"]:
                break
    stats = pool.stats()
    assert stats["quarantined"] == {"tiny_shop_v1_0001": "env_crash"}
    assert crashes == stats["env_crash"] == 2
    assert pool.scheduler.probabilities()[1] == 0.0
    assert any("quarantined" in r.getMessage() and "tiny_shop_v1_0001" in r.getMessage() for r in caplog.records)
    for _ in range(20):  # never scheduled again
        batch = pool.step(np.full(3, PAY))
        assert all(i.get("next_env_id") != "tiny_shop_v1_0001" for i in batch.infos)
    pool.close()


def test_every_variant_quarantined_is_a_pool_error() -> None:
    variants = tiny_variants(2)
    factory = TinyFactory(faults={v.env_id: Fault("crash", at_step=1) for v in variants})
    pool = InProcessPool(variants, factory, 2, PoolConfig(num_workers=1, quarantine_after=1), seed=0)
    pool.reset(seed=0)
    with pytest.raises(PoolError, match="quarantined"):
        pool.step(np.full(2, LOGIN))
    pool.close()


def test_reset_failure_is_retried_on_another_variant() -> None:
    variants = tiny_variants(3)
    pool = InProcessPool(variants, TinyFactory(), 3, PoolConfig(num_workers=1, scheduler="round_robin"), seed=0)

    class BrokenReset:  # the factory of variant 0 builds an env whose reset raises
        def __init__(self, inner: TinyFactory) -> None:
            self.inner = inner

        def __call__(self, variant: object) -> object:
            env = self.inner(variant)
            if variant.env_id == "tiny_shop_v1_0000":
                env.physical.reset = lambda seed=None: (_ for _ in ()).throw(OSError("no database"))
            return env

    pool.workers[0].factory = BrokenReset(TinyFactory())
    batch = pool.reset(seed=0)
    assert "tiny_shop_v1_0000" not in [i["env_id"] for i in batch.infos]
    # Round robin hands slot 0 variant 0, then (cursor wrapped) variant 0 again, then variant 1.
    assert pool.stats()["failing_variants"] == {"tiny_shop_v1_0000": 2}
    assert batch.infos[0]["env_id"] == "tiny_shop_v1_0001"
    pool.close()


def test_watchdog_abandons_only_the_hung_item() -> None:
    watchdog = BatchWatchdog(timeout_s=0.1)

    def work(x: float) -> float:
        if x < 0:
            time.sleep(0.5)
        if x == 0:
            raise ValueError("boom")
        return x * 2

    out = watchdog.run(work, [1.0, -1.0, 0.0, 3.0, -1.0, 4.0])
    assert out[0] == 2.0 and out[3] == 6.0 and out[5] == 8.0
    assert out[1] is TIMED_OUT and out[4] is TIMED_OUT and isinstance(out[2], ValueError)
    assert watchdog.abandoned_threads == 2
    assert watchdog.run(work, [5.0]) == [10.0]


@pytest.mark.timing
def test_a_hung_step_is_abandoned_at_the_step_timeout() -> None:
    pool = faulty_pool("hang")
    pool.reset(seed=0)
    pool.step(np.full(4, LOGIN))
    started = time.perf_counter()
    pool.step(np.full(4, VIEW))
    assert 0.2 < time.perf_counter() - started < 0.9  # the step timeout (0.25 s), not the 1 s hang


@pytest.mark.timing
def test_the_watchdog_waits_one_timeout_per_hung_item() -> None:
    watchdog = BatchWatchdog(timeout_s=0.1)
    started = time.perf_counter()
    watchdog.run(lambda x: time.sleep(0.5) if x < 0 else x, [1.0, -1.0, 3.0, -1.0])
    assert time.perf_counter() - started < 0.45
