"""A pool step's per-slot infos, built on first read: the same dicts whenever they are read, pickled built."""

from __future__ import annotations

import pickle

import numpy as np
from pool_fixtures import Fault, TinyFactory, tiny_variants

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import PoolBatch
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.pool.step_infos import INFO_KEYS, SlotInfos

NEXT_KEYS = ["next_env_id", "next_variant_index", "next_variant_hash", "next_episode_seed"]


def pool() -> InProcessPool:
    variants = tiny_variants(6)
    factory = TinyFactory(faults={variants[1].env_id: Fault("crash", at_step=3)})
    cfg = PoolConfig(num_workers=2, scheduler="round_robin", quarantine_after=1000)
    return InProcessPool(variants, factory, 6, cfg, seed=0)


def run(read_now: bool, steps: int = 40) -> list[PoolBatch]:
    p, rng = pool(), np.random.default_rng(1)
    batch, batches = p.reset(seed=0), []
    for _ in range(steps):
        batch = p.step(np.argmax(rng.random(batch.action_mask.shape) * batch.action_mask, axis=1))
        if read_now:
            assert batch.infos is batch.infos  # built once, then kept
        batches.append(batch)
    return batches


def test_infos_read_late_are_those_read_at_once() -> None:
    now, late = run(read_now=True), run(read_now=False)
    assert [b.infos for b in now] == [b.infos for b in late]


def test_infos_describe_the_step_then_its_episode_end() -> None:
    p = pool()
    batch = p.reset(seed=0)
    token_names = np.array(p.vocabulary.tokens, dtype=object)
    rng, ended, failed = np.random.default_rng(2), 0, 0
    for _ in range(40):
        before = p.slot_variants()
        batch = p.step(np.argmax(rng.random(batch.action_mask.shape) * batch.action_mask, axis=1))
        for slot, info in enumerate(batch.infos):
            v = int(before[slot])
            assert list(info)[: len(INFO_KEYS)] == list(INFO_KEYS)
            assert (info["env_id"], info["variant_index"], info["variant_hash"]) == (
                p.env_ids[v],
                v,
                p.variant_hashes[v],
            )
            assert info["tokens"] == token_names[batch.final_obs[slot, : p.vocabulary.n_tokens] > 0.5].tolist()
            if batch.terminated[slot] or batch.truncated[slot]:
                assert list(info)[len(INFO_KEYS) :] == ["episode_return", "episode_length", "success", *NEXT_KEYS]
                ended += 1
                failed += info["failure_reason"] == "env_crash"
            else:
                assert list(info) == list(INFO_KEYS)
    assert ended and failed


def test_a_pickled_batch_carries_its_infos() -> None:
    batch = run(read_now=False, steps=5)[-1]
    copy = pickle.loads(pickle.dumps(batch))
    assert type(copy) is PoolBatch and copy.infos == batch.infos
    assert np.array_equal(copy.obs, batch.obs) and np.array_equal(copy.final_obs, batch.final_obs)


def test_token_lists_are_fresh_per_row() -> None:
    infos = SlotInfos(["a", "b"], ["ha", "hb"], np.array(["x", "y", "z"], dtype=object))
    hot = np.array([[True, False, True], [True, False, True], [False, False, False]])
    tokens = infos.tokens(hot)
    assert tokens == [["x", "z"], ["x", "z"], []]
    tokens[0].append("w")
    assert infos.tokens(hot) == [["x", "z"], ["x", "z"], []]
    assert SlotInfos([], [], np.array([], dtype=object)).tokens(np.zeros((2, 0), bool)) == [[], []]
