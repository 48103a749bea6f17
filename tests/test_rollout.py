"""Worker-side rollouts (agentflow_core/pool/rollout.py): equivalence, determinism, resume and worker loss.

- The training reward applied after the rollout, step by step, equals the reward applied while the
  pool is stepped (the fast path's equivalence test).
- The in-process backend and Ray actors give the same slices, array for array, for the same seed;
  a worker SIGKILLed before its rollout is replaced and its slice run again gives the same slice.
- A learner over worker-side rollouts resumes bit-identically from a checkpoint.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentflow_core.config import PoolConfig, RewardConfig, TrainConfig
from agentflow_core.contracts import PoolBatch, RolloutSlice, RolloutSource
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.pool.rollout import InProcessSlices, SlicedRollouts
from agentflow_core.rl.checkpoint import CheckpointManager, load_checkpoint, restore_ppo
from agentflow_core.rl.normalize import PerEnvRewardNormalizer
from agentflow_core.rl.policy import ActorCritic, policy_hash
from agentflow_core.rl.ppo import PPO, MemorySink, TrainingReward
from agentflow_core.rl.reward import RewardFunction
from agentflow_core.rl.rollout import CentralRollouts, collect_slice, rollout_source, slice_seeds
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, OBS_DIM
from benchmarks.ppo_bench import _packaged_factory, demo_catalogue
from tasks.compose import recovery_summary

NUM_ENVS, N_STEPS = 8, 16
POOL = PoolConfig(num_workers=2)


@pytest.fixture(scope="module")
def variants() -> list[Any]:
    return demo_catalogue(1, seed=0)


def _reward(variants: list[Any], num_envs: int) -> TrainingReward:
    base_of = {i: v.base_env_id for i, v in enumerate(variants)}
    return TrainingReward(
        RewardFunction(RewardConfig(), num_envs, vocabulary=CHECKOUT),
        PerEnvRewardNormalizer(),
        key_of=lambda info: base_of[info["variant_index"]],
        min_count=10,
    )


def _policy() -> ActorCritic:
    torch.manual_seed(3)
    return ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=(32, 32))


def _inprocess(variants: list[Any]) -> SlicedRollouts:
    pool = InProcessPool(variants, _packaged_factory(variants), NUM_ENVS, POOL, seed=0)
    return SlicedRollouts(InProcessSlices(pool), variants, NUM_ENVS, POOL, seed=0)


def _assert_same(a: list[RolloutSlice], b: list[RolloutSlice]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for name in RolloutSlice.__dataclass_fields__:
            np.testing.assert_array_equal(getattr(x, name), getattr(y, name), err_msg=name)


class _RewardingPool:
    """Wraps a pool and applies a training reward to every batch as it is stepped (the reference)."""

    def __init__(self, pool: InProcessPool, reward: TrainingReward) -> None:
        self.pool, self.reward = pool, reward
        self.num_envs = pool.num_envs
        self.rewards: list[np.ndarray] = []

    def reset(self, seed: int) -> PoolBatch:
        batch = self.pool.reset(seed)
        self.reward.reset(batch)
        return batch

    def step(self, actions: np.ndarray) -> PoolBatch:
        batch = self.pool.step(actions)
        self.rewards.append(self.reward(batch))
        return batch


def test_reward_after_the_rollout_equals_the_reward_while_stepping(variants: list[Any]) -> None:
    pool = InProcessPool(variants, _packaged_factory(variants), NUM_ENVS, PoolConfig(num_workers=0), seed=0)
    try:
        reference = _RewardingPool(pool, _reward(variants, NUM_ENVS))
        post_hoc = _reward(variants, NUM_ENVS)
        policy = _policy()
        for update in range(3):  # the normaliser passes min_count within the run: scaled rewards are compared too
            reference.rewards.clear()
            reset_seed, sample_seed = slice_seeds(0, update, 0)
            gen = torch.Generator().manual_seed(sample_seed)
            rollout = collect_slice(reference, policy, 64, reset_seed, gen)  # type: ignore[arg-type]
            post_hoc.reset(rollout.reset_batch())
            rewards = [post_hoc(rollout.step_batch(t)) for t in range(64)]
            np.testing.assert_array_equal(np.stack(rewards), np.stack(reference.rewards))
        assert rollout.done.sum() > 10  # episodes ended and autoreset inside the rollout
        assert post_hoc.state_dict() == reference.reward.state_dict()
    finally:
        pool.close()


def test_both_rollout_sources_meet_the_protocol_and_a_plain_pool_is_stepped_centrally(variants: list[Any]) -> None:
    """The learner's seam is ``contracts.RolloutSource``: worker-side slices are taken as they are, a plain
    :class:`EnvPool` is wrapped in ``CentralRollouts`` (stepped from the learner's process)."""
    sliced = _inprocess(variants)
    pool = InProcessPool(variants, _packaged_factory(variants), NUM_ENVS, POOL, seed=0)
    try:
        central = rollout_source(pool)
        assert rollout_source(sliced) is sliced
        assert isinstance(central, CentralRollouts) and central.pool is pool
        assert isinstance(sliced, RolloutSource) and isinstance(central, RolloutSource)
        assert not isinstance(pool, RolloutSource)
    finally:
        sliced.close()
        pool.close()


def test_slices_are_a_pure_function_of_seed_update_and_state(variants: list[Any]) -> None:
    a, b = _inprocess(variants), _inprocess(variants)
    try:
        policy = _policy()
        for update in range(2):
            _assert_same(a.collect(policy, N_STEPS, 0, update), b.collect(policy, N_STEPS, 0, update))
        assert sorted(a.slots) == [0, 1] and sum(len(s) for s in a.slots.values()) == NUM_ENVS
        hosts = a.backend.worker_of
        for w, part in zip(a.slots, a.collect(policy, N_STEPS, 0, 2), strict=True):
            assert (hosts[part.variant_index] == w).all()  # each slice plays only its worker's variants
        assert a.stats()["steps"] == 3 * N_STEPS * NUM_ENVS
    finally:
        a.close()
        b.close()


@pytest.fixture()
def ray_rollouts(variants: list[Any], ray_session: None) -> Iterator[SlicedRollouts]:
    from agentflow_core.pool.ray_pool import RayPool

    pool = RayPool(variants, _packaged_factory(variants), NUM_ENVS, POOL, seed=0, standby_workers=1)
    rollouts = SlicedRollouts(pool, variants, NUM_ENVS, POOL, seed=0)
    yield rollouts
    rollouts.close()


def test_ray_slices_equal_in_process_slices_and_survive_a_killed_worker(
    variants: list[Any], ray_rollouts: SlicedRollouts
) -> None:
    local = _inprocess(variants)
    try:
        policy = _policy()
        _assert_same(ray_rollouts.collect(policy, N_STEPS, 0, 0), local.collect(policy, N_STEPS, 0, 0))
        ray_rollouts.backend.wait_standby()  # type: ignore[attr-defined]
        os.kill(ray_rollouts.backend.worker_pids()[0], signal.SIGKILL)  # type: ignore[attr-defined]
        _assert_same(ray_rollouts.collect(policy, N_STEPS, 0, 1), local.collect(policy, N_STEPS, 0, 1))
        stats = ray_rollouts.stats()
        assert stats["worker_restarts"] == 1 and stats["recoveries"]
        assert stats["worker_lost"] == len(ray_rollouts.slots[0])
        assert stats["steps_lost"] == N_STEPS * len(ray_rollouts.slots[0])
        _assert_same(ray_rollouts.collect(policy, N_STEPS, 0, 2), local.collect(policy, N_STEPS, 0, 2))
        # each rollout's seconds per worker (the replacement's in the redone one) and where the loss fell
        summary = recovery_summary(ray_rollouts)
        assert summary["rollout_workers"] == [0, 1] and summary["lost_in_rollouts"] == [1]
        assert len(summary["worker_rollout_s"]) == 3
        assert all(len(row) == 2 and min(row) > 0.0 for row in summary["worker_rollout_s"])
        assert recovery_summary(local)["worker_rollout_s"] and recovery_summary(local)["lost_in_rollouts"] == []
    finally:
        local.close()


def _learner(variants: list[Any]) -> PPO:
    cfg = TrainConfig(num_envs=NUM_ENVS, n_steps=32, minibatch_size=64, n_epochs=2, hidden_sizes=[32, 32])
    rollouts = _inprocess(variants)
    torch.manual_seed(0)
    return PPO(
        ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=cfg.hidden_sizes),
        rollouts,
        cfg,
        seed=0,
        reward_transform=_reward(variants, NUM_ENVS),
        sink=MemorySink(),
    )


def test_learner_on_worker_side_rollouts_resumes_bit_identically(variants: list[Any], tmp_path: Path) -> None:
    full = _learner(variants)
    manager = CheckpointManager(tmp_path, every_updates=2, every_minutes=1e6, vocabulary=CHECKOUT)
    for _ in range(4):
        full.train_iteration()
        if manager.due(full.update):
            manager.save(full)
    state = load_checkpoint(tmp_path / "update_00000002", vocabulary=CHECKOUT).state["ppo"]
    assert len(state["scheduler"]["slices"]) == 2
    resumed = _learner(variants)
    restore_ppo(resumed, load_checkpoint(tmp_path / "update_00000002", vocabulary=CHECKOUT))
    for _ in range(2):
        resumed.train_iteration()
    assert policy_hash(resumed.policy) == policy_hash(full.policy)
    assert resumed.rollouts.feedback_state() == full.rollouts.feedback_state()
    for learner in (full, resumed):
        learner.rollouts.stats()
        learner.pool.close()


def test_a_rollout_sent_ahead_is_the_rollout_collect_sends(variants: list[Any], ray_rollouts: SlicedRollouts) -> None:
    """PPO sends the next rollout before it logs and checkpoints an update (``prefetch_next``): Ray's
    workers roll out meanwhile. The learner learns the same policy on both backends, with or without."""
    cfg = TrainConfig(num_envs=NUM_ENVS, n_steps=N_STEPS, minibatch_size=64, n_epochs=2, hidden_sizes=[32, 32])

    def learner(rollouts: SlicedRollouts) -> PPO:
        torch.manual_seed(0)
        return PPO(
            ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=cfg.hidden_sizes), rollouts, cfg, seed=0, sink=MemorySink()
        )

    plain, local = learner(_inprocess(variants)), learner(_inprocess(variants))
    ahead = learner(ray_rollouts)
    try:
        for i in range(3):
            plain.train_iteration()
            local.train_iteration(prefetch_next=lambda update: True)
            if i == 1:
                time.sleep(0.2)  # the caller's logging and checkpoints: the rollout sent ahead runs meanwhile
            metrics = ahead.train_iteration(prefetch_next=lambda update: update != 2)  # not after the 2nd
            if i == 1:  # its rollout_s counts from when the workers began, before the caller's 0.2 s
                assert metrics["time/rollout_s"] >= 0.2
        assert policy_hash(ahead.policy) == policy_hash(local.policy) == policy_hash(plain.policy)
        assert ahead.rollouts.feedback_state() == plain.rollouts.feedback_state()
        # one sent for other arguments is dropped: collect sends the rollout it is asked for
        policy = _policy()
        local.rollouts.prefetch(policy, N_STEPS, 0, 7)
        _assert_same(local.rollouts.collect(policy, N_STEPS, 0, 3), plain.rollouts.collect(policy, N_STEPS, 0, 3))
    finally:
        plain.pool.close()
        local.pool.close()


def _records(rollouts: SlicedRollouts, eval_variants: list[Any], policy: ActorCritic) -> list[tuple[Any, ...]]:
    from agentflow_core.pool.episodes import EPSILON_GREEDY, EXPERT, GREEDY, ActorSpec

    out = []
    for actor, net in (
        (ActorSpec(GREEDY, (32, 32)), policy),
        (ActorSpec(EPSILON_GREEDY, (32, 32), 0.5), policy),
        (ActorSpec(EXPERT), None),
    ):
        for r in rollouts.evaluate(eval_variants, actor, net, 2 * len(eval_variants), seed=7, num_envs=4):
            out.append((actor.kind, r.variant, r.episode, r.episode_return, r.length, r.paid, r.terminated))
            out.append(tuple(r.final_obs.tolist()))
    return out


def test_evaluation_episodes_are_a_function_of_variant_and_seed_on_every_backend(
    variants: list[Any], ray_rollouts: SlicedRollouts
) -> None:
    """Worker-side evaluation: the same (variant, episode) records on Ray, in process, on one worker and
    after a killed worker; every variant plays its share and the expert pays more often than chance."""
    eval_variants = variants[::3]
    policy = _policy()
    local = _inprocess(variants)
    one_pool = InProcessPool(variants, _packaged_factory(variants), NUM_ENVS, PoolConfig(num_workers=1), seed=0)
    one = SlicedRollouts(InProcessSlices(one_pool), variants, NUM_ENVS, PoolConfig(num_workers=1), seed=0)
    try:
        reference = _records(local, eval_variants, policy)
        assert _records(ray_rollouts, eval_variants, policy) == reference
        assert _records(one, eval_variants, policy) == reference
        assert _records(local, eval_variants, policy) == reference  # a second evaluation: nothing carried over
        ray_rollouts.backend.wait_standby()  # type: ignore[attr-defined]
        os.kill(ray_rollouts.backend.worker_pids()[1], signal.SIGKILL)  # type: ignore[attr-defined]
        assert _records(ray_rollouts, eval_variants, policy) == reference
        rows = reference[::2]
        for kind in ("greedy", "epsilon_greedy", "expert"):
            played = sorted((r[1], r[2]) for r in rows if r[0] == kind)
            assert played == [(i, j) for i in range(len(eval_variants)) for j in range(2)]
        assert any(r[5] for r in rows if r[0] == "expert")
        # the training slices are untouched: a rollout after the evaluations equals one without them
        fresh = _inprocess(variants)
        _assert_same(local.collect(policy, N_STEPS, 0, 3), fresh.collect(policy, N_STEPS, 0, 3))
        fresh.close()
    finally:
        local.close()
        one.close()
