"""Other slots keep stepping while one env step hangs (``pool.step_patience_s``), in-process and in Ray.

A step slower than the patience is left pending: the pool step returns without it, the slot repeats
its observation with no reward and no end until the step returns (delivered with the action it was
given) or has run for the step timeout (``env_timeout``). A SIGSTOPped Ray worker is killed and
replaced within about a second instead of holding the pool for the call timeout.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import numpy as np
import pytest
from ray import cloudpickle

from agentflow_core.config import PoolConfig
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.pool.ray_pool import RayPool
from agentflow_core.semantics import CHECKOUT, SemanticAction
from tests import pool_fixtures
from tests.pool_fixtures import Fault, TinyFactory, tiny_variants

cloudpickle.register_pickle_by_value(pool_fixtures)

LOGIN, VIEW = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT)


def _pool(hang_s: float, timeout_s: float = 0.5) -> tuple[InProcessPool, str]:
    variants = tiny_variants(4)
    factory = TinyFactory(faults={variants[1].env_id: Fault("hang", at_step=2, hang_s=hang_s)})
    cfg = PoolConfig(
        num_workers=2,
        backend="inprocess",
        scheduler="round_robin",
        step_timeout_s=timeout_s,
        step_patience_s=0.02,
        step_patience_engages="always",
        quarantine_after=10,
    )
    pool = InProcessPool(variants, factory, 4, cfg, seed=0)
    pool.reset(seed=0)
    pool.step(np.full(4, LOGIN))
    return pool, variants[1].env_id


def test_a_hung_step_does_not_hold_the_other_slots() -> None:
    pool, faulty = _pool(hang_s=30.0)
    try:
        started = time.perf_counter()
        batch = pool.step(np.full(4, VIEW))
        assert time.perf_counter() - started < 0.3  # the patience (0.02 s), not the step timeout (0.5 s)
        assert batch.pending is not None and batch.pending.tolist() == [False, True, False, False]
        assert batch.infos[1]["step_pending"] and not batch.done.any() and batch.reward[1] == 0.0
        healthy_steps = 1
        while batch.pending is not None and batch.pending[1]:
            assert time.perf_counter() - started < 2.0
            time.sleep(0.02)  # paced: the tiny episodes must not reach their 50-step limit meanwhile
            batch = pool.step(np.full(4, VIEW))
            healthy_steps += 1
            assert [batch.infos[s]["step_id"] for s in (0, 2, 3)] == [1 + healthy_steps] * 3
        assert batch.infos[1]["failure_reason"] == "env_timeout" and batch.truncated[1]
        assert batch.infos[1]["env_id"] == faulty and batch.infos[1]["action"] == VIEW
        assert 0.45 < time.perf_counter() - started < 1.5  # ended at the step timeout
        assert healthy_steps >= 10  # the others went on meanwhile
        stats = pool.stats()
        assert stats["env_timeout"] == 1 and stats["steps"] == 4 + 3 * healthy_steps + 1
        assert all(w["pending"] == 0 for w in stats["workers"])
    finally:
        pool.close()


def test_a_slow_step_is_delivered_late_with_its_own_action() -> None:
    pool, _ = _pool(hang_s=0.15)
    try:
        batch = pool.step(np.full(4, VIEW))
        assert batch.pending is not None and batch.pending[1]
        late = 0
        while batch.pending is not None and batch.pending[1]:
            time.sleep(0.01)
            batch = pool.step(np.full(4, LOGIN))  # ignored for slot 1 until its VIEW returns
            late += 1
        assert late >= 1 and batch.infos[1]["failure_reason"] is None and not batch.done[1]
        assert batch.infos[1]["action"] == VIEW and batch.infos[1]["step_id"] == 2
        batch = pool.step(np.full(4, VIEW))
        assert batch.pending is None and batch.infos[1]["step_id"] == 3
        assert pool.stats()["env_timeout"] == 0
    finally:
        pool.close()


@pytest.mark.usefixtures("ray_session")
def test_a_stopped_ray_worker_is_killed_and_replaced_quickly() -> None:
    pool = RayPool(tiny_variants(16), TinyFactory(), 8, PoolConfig(num_workers=2, scheduler="round_robin"), seed=0)
    victim = -1
    try:
        pool.reset(seed=0)
        pool.step(np.full(8, LOGIN))
        assert pool.wait_standby() == 1
        on_victim = pool.worker_of[pool.slot_variants()] == 0
        victim = pool.worker_pids()[0]
        os.kill(victim, signal.SIGSTOP)
        started = time.perf_counter()
        batch = pool.step(np.full(8, VIEW))
        assert time.perf_counter() - started < 3.0  # not the call timeout (30 s)
        assert pool.worker_restarts == 1 and pool.worker_pids()[0] != victim
        lost = [i for i, info in enumerate(batch.infos) if info["failure_reason"] == "worker_lost"]
        assert lost == np.flatnonzero(on_victim).tolist()
        batch = pool.step(np.full(8, LOGIN))
        assert all(info["failure_reason"] is None for info in batch.infos)
    finally:
        pool.close()
        if victim > 0:
            with contextlib.suppress(ProcessLookupError):  # already killed by the pool; never leave it stopped
                os.kill(victim, signal.SIGKILL)


def test_a_pool_step_with_only_pending_slots_waits_instead_of_spinning() -> None:
    pool, _ = _pool(hang_s=30.0, timeout_s=0.4)
    try:
        batch = pool.step(np.full(4, VIEW))
        assert batch.pending is not None and batch.pending[1]
        only_slot_1 = np.array([False, True, False, False])
        started, calls = time.perf_counter(), 0
        while batch.pending is not None and batch.pending[1]:
            batch = pool.step(np.full(4, VIEW), active=only_slot_1)
            calls += 1
        assert calls == 1 and batch.infos[1]["failure_reason"] == "env_timeout"  # one call, blocked to the timeout
        assert 0.25 < time.perf_counter() - started < 3.0  # the 0.4 s timeout (generous: a loaded CI machine)
    finally:
        pool.close()


def test_a_computing_hang_is_not_detached_but_ended_at_its_patience() -> None:
    variants = tiny_variants(4)
    factory = TinyFactory(faults={variants[1].env_id: Fault("spin", at_step=2, hang_s=30.0)})
    cfg = PoolConfig(
        num_workers=1,
        backend="inprocess",
        scheduler="round_robin",
        step_timeout_s=0.4,
        step_patience_s=0.1,
        step_patience_engages="always",
    )
    pool = InProcessPool(variants, factory, 4, cfg, seed=0)
    try:
        pool.reset(seed=0)
        pool.step(np.full(4, LOGIN))
        started = time.perf_counter()
        batch = pool.step(np.full(4, VIEW))  # a busy loop holds the GIL: going on beside it gains nothing
        assert 0.09 < time.perf_counter() - started < 0.35  # the patience (0.1 s), not the timeout (0.4 s)
        assert batch.pending is None and batch.infos[1]["failure_reason"] == "env_timeout"
        assert [batch.infos[s]["step_id"] for s in (0, 2, 3)] == [2, 2, 2]
    finally:
        pool.close()


def test_a_soak_side_loses_only_the_faulty_episodes_and_counts_no_pending_step() -> None:
    from agentflow_core.config import AgentFlowConfig
    from benchmarks.soak_bench import FaultInjectingFactory, _soak_side

    variants = tiny_variants(8)
    faults = {variants[1].env_id: "sleep", variants[5].env_id: "spin"}
    factory = FaultInjectingFactory(TinyFactory(), faults, at_step=2, hang_s=30.0)
    pool_cfg = PoolConfig(
        num_workers=2,
        backend="inprocess",
        step_timeout_s=0.3,
        step_patience_s=0.05,
        step_patience_engages="always",
        quarantine_after=2,
    )
    app = AgentFlowConfig().model_copy(update={"pool": pool_cfg})
    side = _soak_side(list(variants), factory, 8, app, 1.5, 0)
    assert side["faulty_episodes_lost"] >= 2 and side["healthy_episodes_lost"] == 0
    assert set(side["failures"]) == {"env_timeout"} and side["pending_slot_steps"] >= 1


def test_the_training_reward_pays_and_charges_nothing_for_a_pending_row() -> None:
    from agentflow_core.config import RewardConfig
    from agentflow_core.pool.base import PoolBatch
    from agentflow_core.rl.reward import RewardFunction
    from agentflow_core.semantics import N_ACTIONS, encode

    rf = RewardFunction(
        RewardConfig(mode="token_table", token_rewards={"INVALID_CARD": -1.0}), num_envs=2, vocabulary=CHECKOUT
    )
    rf.reset(np.stack([encode(["LOGGED_IN"], {}), encode(["LOGGED_IN"], {})]))
    obs = np.stack([encode(["INVALID_CARD"], {}), encode(["INVALID_CARD"], {})])
    # the mask decides, whatever the row holds: slot 1's step has not returned
    step = PoolBatch(
        obs,
        np.ones((2, N_ACTIONS), bool),
        np.full(2, -0.01, np.float32),
        np.zeros(2, bool),
        np.zeros(2, bool),
        obs,
        [{}, {}],
        np.array([False, True]),
    )
    comps = rf.step(step)
    assert comps.total[0] == pytest.approx(-1.0) and comps.total[1] == 0.0 and comps.base[1] == 0.0
