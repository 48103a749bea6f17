"""RayPool: batched actor calls, 300 live envs on 2 CPUs, hang isolation, worker kill and recovery.

Uses the session-scoped ``ray_session`` fixture of tests/conftest.py (one local Ray, 2 CPUs).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pool_fixtures
import psutil
import pytest
import ray
import yaml
from pool_fixtures import Fault, TinyFactory, may_leave_ray_nice, tiny_variants
from ray import cloudpickle

from agentflow_core.config import PoolConfig, VariantsConfig
from agentflow_core.pool.base import PoolError, RegistryEnvFactory
from agentflow_core.pool.ray_actors import start_blank_workers
from agentflow_core.pool.ray_pool import RayPool
from agentflow_core.registry import EnvRegistry
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, OBS_DIM, SemanticAction
from agentflow_core.variants import BaseEnvInfo, generate_variants

# Ray workers cannot import the tests directory: ship the fixture module by value.
cloudpickle.register_pickle_by_value(pool_fixtures)

REPO = Path(__file__).resolve().parents[1]
LOGIN, VIEW, PAY = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT), int(SemanticAction.SUBMIT_PAYMENT)
pytestmark = pytest.mark.usefixtures("ray_session")


def test_300_real_envs_step_in_one_call_per_worker() -> None:
    registry = EnvRegistry(REPO / "configs" / "envs", load=yaml.safe_load)
    cfg = VariantsConfig(samples_per_combination=3)
    variants = generate_variants(
        [BaseEnvInfo(e.env_id, e.family, e.version) for e in registry.entries()],
        cfg.dimensions,
        cfg.perturbations,
        cfg.samples_per_combination,
        seed=0,
        scenario=CHECKOUT.scenario,
    )
    factory = RegistryEnvFactory({e.env_id: e for e in registry.entries()})
    pool = RayPool(
        variants, factory, 300, PoolConfig(num_workers=2, max_live_per_worker=256, scheduler="uniform"), seed=0
    )
    try:
        batch = pool.reset(seed=0)
        rng = np.random.default_rng(0)
        for _ in range(5):
            actions = np.array([rng.choice(np.flatnonzero(m)) for m in batch.action_mask])
            batch = pool.step(actions)
            assert batch.obs.shape == (300, OBS_DIM) and batch.action_mask.shape == (300, N_ACTIONS)
            assert np.isfinite(batch.obs).all() and len(batch.infos) == 300
        stats = pool.stats()
        assert stats["live_envs"] >= 300 and stats["steps"] == 1500
        assert sum(w["active"] for w in stats["workers"]) == 300
        assert [w["step_calls"] for w in stats["workers"]] == [5, 5]  # one call per worker per pool step
        assert sum(w["steps"] for w in stats["workers"]) == 1500
        assert [w["catalogue"] for w in stats["workers"]] == np.bincount(pool.worker_of, minlength=2).tolist()
    finally:
        pool.close()


def test_hung_env_in_actor_is_isolated() -> None:
    variants = tiny_variants(4)
    factory = TinyFactory(faults={variants[2].env_id: Fault("hang", at_step=2, hang_s=1.5)})
    pool = RayPool(
        variants,
        factory,
        4,
        PoolConfig(num_workers=2, scheduler="round_robin", step_timeout_s=0.3, step_patience_s=None),
        seed=0,
    )
    try:
        pool.reset(seed=0)
        pool.step(np.full(4, LOGIN))
        batch = pool.step(np.full(4, VIEW))
        assert batch.truncated.tolist() == [False, False, True, False]
        assert batch.infos[2]["failure_reason"] == "env_timeout"
        batch = pool.step(np.full(4, VIEW))
        assert [batch.infos[s]["step_id"] for s in (0, 1, 3)] == [3, 3, 3]
        assert pool.stats()["env_timeout"] == 1 and pool.worker_restarts == 0
    finally:
        pool.close()


def test_killed_worker_is_restarted_and_its_variants_served_again() -> None:
    # A catalogue big enough that the actors' slices travel through the object store (> 100 KB),
    # which a restart must still be able to read.
    variants = tiny_variants(2000)
    pool = RayPool(variants, TinyFactory(), 8, PoolConfig(num_workers=2, scheduler="round_robin"), seed=0)
    try:
        pool.reset(seed=0)
        pool.step(np.full(8, LOGIN))
        on_victim = pool.worker_of[pool.slot_variants()] == 0
        assert on_victim.any() and (~on_victim).any()
        # The standby warms up at idle CPU priority (as root here) and works at normal priority.
        assert pool.wait_standby() == 1
        _, standby_pid, _, _ = ray.get(pool._standby[0].locate.remote())
        assert os.sched_getscheduler(standby_pid) == (os.SCHED_IDLE if os.geteuid() == 0 else os.SCHED_OTHER)
        worker_nice = psutil.Process(pool.worker_pids()[1]).nice()  # Ray starts workers niced
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        batch = pool.step(np.full(8, VIEW))
        assert pool.worker_pids()[0] == standby_pid  # the standby took over ...
        assert os.sched_getscheduler(standby_pid) == os.SCHED_OTHER  # ... at normal priority
        assert psutil.Process(standby_pid).nice() == worker_nice
        lost = [i for i, info in enumerate(batch.infos) if info["failure_reason"] == "worker_lost"]
        assert lost == np.flatnonzero(on_victim).tolist()
        assert batch.truncated[lost].all() and not batch.done[~on_victim].any()
        assert [batch.infos[s]["step_id"] for s in np.flatnonzero(~on_victim)] == [2] * int((~on_victim).sum())
        assert pool.worker_restarts == 1 and pool.stats()["worker_lost"] == len(lost)
        assert pool.stats()["quarantined"] == {}  # a lost worker is not the variants' fault
        served_again: set[str] = set()
        for t in range(8):
            batch = pool.step(np.full(8, LOGIN if t % 2 == 0 else PAY))
            assert all(i["failure_reason"] is None for i in batch.infos)
            served_again.update(i["env_id"] for i in batch.infos if pool.worker_of[i["variant_index"]] == 0)
        assert len(served_again) >= 8  # round robin walks on through the victim's slice
    finally:
        pool.close()


def _episode_rows(pool: RayPool, steps: int) -> list[tuple[str, int, bool]]:
    batch, rows = pool.reset(seed=3), []
    for t in range(steps):
        batch = pool.step(np.full(6, (LOGIN, VIEW, PAY)[t % 3]))
        rows += [(i["env_id"], int(i["step_id"]), bool(d)) for i, d in zip(batch.infos, batch.done, strict=True)]
    return rows


def test_blank_workers_started_ahead_become_the_pools_workers_and_standby() -> None:
    """Env workers started with Ray (before the catalogue is read) are taken by the first pool that
    builds the same envs: they adopt the workers' slices and the standby's place, and the pool
    gives the records a pool of its own workers gives. A pool building other envs ends them."""
    variants, config = tiny_variants(12), PoolConfig(num_workers=2, scheduler="round_robin")
    blank = start_blank_workers(TinyFactory(), 4, config.max_live_per_worker, config.step_timeout_s)
    started = [a._actor_id for a in blank.actors]
    pool = RayPool(variants, TinyFactory(), 6, config, seed=0, blank=blank)
    own = RayPool(variants, TinyFactory(), 6, config, seed=0)
    try:
        assert [a._actor_id for a in pool.actors] == started[:2] and [a._actor_id for a in pool._standby] == started[
            2:3
        ]
        assert blank.actors == []  # the fourth was ended
        assert _episode_rows(pool, 7) == _episode_rows(own, 7)
        assert [w["worker"] for w in pool.stats()["workers"]] == [0, 1]
        assert pool.wait_standby() == 1 and pool.worker_restarts == 0
    finally:
        pool.close()
        own.close()
    other = start_blank_workers(TinyFactory(max_episode_steps=9), 2, config.max_live_per_worker, config.step_timeout_s)
    ended = {a._actor_id for a in other.actors}
    pool = RayPool(variants, TinyFactory(), 6, config, seed=0, blank=other, standby_workers=0)
    try:
        assert other.actors == [] and not {a._actor_id for a in pool.actors} & ended
        pool.reset(seed=0)
    finally:
        pool.close()


def test_blank_workers_meant_as_the_pools_workers_warm_up_at_normal_priority() -> None:
    """The first ``active`` blank workers leave Ray's nice 15 for their warm-up (the first rollout
    waits for it); the one meant as the standby stays at Ray's low priority. A user who may not
    lower a nice value (neither root nor a permissive RLIMIT_NICE) keeps all of them at Ray's."""
    config = PoolConfig(num_workers=2)
    blank = start_blank_workers(TinyFactory(), 3, config.max_live_per_worker, config.step_timeout_s, active=2)
    try:
        # an actor's calls run in order: locate answers once its warm-up has run
        pids = [ray.get(a.locate.remote(), timeout=60)[1] for a in blank.actors]
        nice = [psutil.Process(pid).nice() for pid in pids]
        assert nice[2] > 0
        assert nice[:2] == ([0, 0] if may_leave_ray_nice() else [nice[2]] * 2)
    finally:
        blank.kill()


def test_restarts_are_bounded() -> None:
    pool = RayPool(tiny_variants(8), TinyFactory(), 4, PoolConfig(num_workers=2, max_worker_restarts=0), seed=0)
    try:
        pool.reset(seed=0)
        os.kill(pool.worker_pids()[1], signal.SIGKILL)
        with pytest.raises(PoolError, match="max_worker_restarts=0"):
            pool.step(np.full(4, LOGIN))
    finally:
        pool.close()
