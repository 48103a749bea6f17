"""In-process pool: batched shapes, SAME_STEP autoreset, LRU eviction, worker routing, real families."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pool_fixtures import TinyFactory, registry_catalogue, tiny_variants

from agentflow_core.config import PoolConfig
from agentflow_core.envs.experts import expert_for
from agentflow_core.pool.base import PoolBatch, RegistryEnvFactory
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import N_ACTIONS, OBS_DIM, TOKEN_INDEX, SemanticAction
from agentflow_core.variants import stable_worker

REPO = Path(__file__).resolve().parents[1]
LOGIN, VIEW, PAY = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT), int(SemanticAction.SUBMIT_PAYMENT)
INFO_KEYS = {"env_id", "variant_index", "variant_hash", "step_id", "failure_reason", "tokens", "risk"}


def round_robin_pool(n_variants: int, num_envs: int, **config: object) -> InProcessPool:
    cfg = PoolConfig(**{"num_workers": 2, "scheduler": "round_robin", **config})
    return InProcessPool(tiny_variants(n_variants), TinyFactory(), num_envs, cfg, seed=0)


def check_shapes(batch: PoolBatch, n: int) -> None:
    assert batch.obs.shape == (n, OBS_DIM) and batch.obs.dtype == np.float32
    assert batch.final_obs.shape == (n, OBS_DIM) and batch.final_obs.dtype == np.float32
    assert batch.action_mask.shape == (n, N_ACTIONS) and batch.action_mask.dtype == bool
    for arr, dtype in ((batch.reward, np.float32), (batch.terminated, bool), (batch.truncated, bool)):
        assert arr.shape == (n,) and arr.dtype == dtype
    assert len(batch.infos) == n and all(set(info) >= INFO_KEYS for info in batch.infos)


def test_batched_step_shapes_and_reset_infos() -> None:
    pool = round_robin_pool(6, 6)
    batch = pool.reset(seed=0)
    check_shapes(batch, 6)
    assert [i["env_id"] for i in batch.infos] == [v.env_id for v in tiny_variants(6)]  # round robin order
    assert all(i["step_id"] == 0 and i["tokens"] == ["LOGGED_OUT"] for i in batch.infos)
    batch = pool.step(np.full(6, LOGIN))
    check_shapes(batch, 6)
    assert all(i["step_id"] == 1 and "LOGGED_IN" in i["tokens"] for i in batch.infos)
    np.testing.assert_allclose(batch.reward, -0.01, rtol=1e-6)
    assert not batch.done.any()
    pool.close()


def test_same_step_autoreset_semantics() -> None:
    pool = round_robin_pool(5, 3)
    pool.reset(seed=1)
    pool.step(np.full(3, LOGIN))
    pool.step(np.full(3, VIEW))
    batch = pool.step(np.array([PAY, VIEW, PAY]))
    assert batch.terminated.tolist() == [True, False, True] and not batch.truncated.any()
    for slot in (0, 2):
        info = batch.infos[slot]
        # final_obs: the terminal observation; obs: the first observation of the next episode.
        assert batch.final_obs[slot, TOKEN_INDEX["PAYMENT_SUCCESS"]] == 1.0
        assert (
            batch.obs[slot, TOKEN_INDEX["LOGGED_OUT"]] == 1.0 and batch.obs[slot, TOKEN_INDEX["PAYMENT_SUCCESS"]] == 0.0
        )
        assert info["success"] is True and info["episode_length"] == 3
        assert info["episode_return"] == pytest.approx(-0.01 - 0.01 + 10.0, abs=1e-5)
        assert info["tokens"] == ["PAYMENT_SUCCESS"] and info["step_id"] == 3
        assert info["next_env_id"] in {v.env_id for v in tiny_variants(5)}
    # Round robin: slots 0 and 2 get the next two variants after the three initial ones.
    assert [batch.infos[0]["next_env_id"], batch.infos[2]["next_env_id"]] == ["tiny_shop_v1_0003", "tiny_shop_v1_0004"]
    assert "episode_return" not in batch.infos[1] and batch.infos[1]["step_id"] == 3
    assert pool.stats()["episodes"] == 2 and pool.stats()["successes"] == 2
    after = pool.step(np.full(3, LOGIN))
    assert [i["step_id"] for i in after.infos] == [1, 4, 1]
    assert after.infos[0]["env_id"] == "tiny_shop_v1_0003"
    pool.close()


def test_paused_slots_keep_their_episode_and_cost_no_steps() -> None:
    pool = round_robin_pool(5, 3)
    start = pool.reset(seed=1)
    pool.step(np.full(3, LOGIN))
    before = pool.stats()["steps"]
    paused = pool.step(np.full(3, VIEW), active=np.array([True, False, True]))
    assert pool.stats()["steps"] == before + 2
    assert [i["step_id"] for i in paused.infos] == [2, 1, 2]
    assert paused.reward[1] == 0.0 and not paused.done[1] and paused.infos[1]["env_id"] == start.infos[1]["env_id"]
    assert paused.obs[1, TOKEN_INDEX["LOGGED_IN"]] == 1.0 and paused.action_mask[1].any()
    pool.step(np.array([PAY, VIEW, PAY]), active=np.array([False, True, False]))  # slot 1 catches up
    done = pool.step(np.full(3, PAY))
    assert done.terminated.all() and [i["episode_length"] for i in done.infos] == [3, 3, 3]
    pool.close()


def test_truncation_keeps_final_obs_and_reason() -> None:
    pool = InProcessPool(
        tiny_variants(2),
        TinyFactory(max_episode_steps=3),
        2,
        PoolConfig(num_workers=1, scheduler="round_robin"),
        seed=0,
    )
    pool.reset(seed=0)
    pool.step(np.full(2, LOGIN))
    pool.step(np.full(2, VIEW))
    batch = pool.step(np.full(2, VIEW))
    assert batch.truncated.all() and not batch.terminated.any()
    assert all(i["failure_reason"] == "max_steps" and i["success"] is False for i in batch.infos)
    np.testing.assert_allclose(batch.final_obs[:, OBS_DIM - 1], 1.0)  # step_fraction at the end
    np.testing.assert_allclose(batch.obs[:, OBS_DIM - 1], 0.0)  # fresh episodes
    pool.close()


def test_hash_to_worker_assignment() -> None:
    variants = tiny_variants(64)
    pool = InProcessPool(variants, TinyFactory(), 4, PoolConfig(num_workers=3), seed=0)
    expected = [stable_worker(v.env_id, 3) for v in variants]
    assert pool.worker_of.tolist() == expected
    for w, worker in enumerate(pool.workers):
        assert sorted(worker.variants) == [i for i, e in enumerate(expected) if e == w]
    assert len({*expected}) == 3  # 64 ids spread over all workers
    pool.close()


def test_lru_eviction_caps_live_envs_and_whole_catalogue_stays_schedulable() -> None:
    pool = round_robin_pool(40, 4, max_live_per_worker=5)
    pool.reset(seed=0)
    played: set[str] = set()
    for t in range(60):
        batch = pool.step(np.full(4, LOGIN if t % 2 == 0 else PAY))
        played.update(i["env_id"] for i in batch.infos)
        assert all(w.live_count <= 5 for w in pool.workers)
    stats = pool.stats()
    assert played == {v.env_id for v in tiny_variants(40)}
    assert sum(w["evicted"] for w in stats["workers"]) > 0
    assert sum(w["created"] for w in stats["workers"]) >= 40
    pool.close()


def test_reset_is_deterministic_for_a_seed() -> None:
    a, b = round_robin_pool(8, 4, scheduler="uniform"), round_robin_pool(8, 4, scheduler="uniform")
    ids = []
    for pool in (a, b):
        pool.reset(seed=3)
        out = [pool.step(np.array([LOGIN, PAY, LOGIN, PAY])) for _ in range(6)]
        ids.append([[i.get("next_env_id") for i in batch.infos] for batch in out])
        pool.close()
    assert ids[0] == ids[1]


@pytest.fixture(scope="module")
def real_catalogue() -> tuple[RegistryEnvFactory, list]:
    _, factory, variants = registry_catalogue()
    return factory, variants


def test_real_families_expert_reaches_payment_success(real_catalogue: tuple[RegistryEnvFactory, list]) -> None:
    factory, variants = real_catalogue
    assert {v.family for v in variants} == {"web_checkout", "order_db", "payment_api"}
    pool = InProcessPool(variants, factory, 12, PoolConfig(num_workers=2, scheduler="uniform"), seed=0)
    expert = expert_for("any")
    batch = pool.reset(seed=0)
    families_ok: set[str] = set()
    family_of = {v.env_id: v.family for v in variants}
    for _ in range(80):
        actions = np.array([expert.act(o, m) for o, m in zip(batch.obs, batch.action_mask, strict=True)])
        batch = pool.step(actions)
        check_shapes(batch, 12)
        assert np.isfinite(batch.obs).all() and np.isfinite(batch.reward).all()
        for i in np.flatnonzero(batch.done):
            info = batch.infos[i]
            assert info["failure_reason"] not in {"env_crash", "env_invalid", "env_timeout"}
            assert info["success"] == ("PAYMENT_SUCCESS" in info["tokens"])
            if info["success"]:
                families_ok.add(family_of[info["env_id"]])
    assert families_ok == {"web_checkout", "order_db", "payment_api"}
    assert pool.stats()["successes"] > 0
    pool.close()
