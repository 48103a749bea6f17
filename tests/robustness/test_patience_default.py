"""The shipped step patience (``pool.step_patience_engages: after_timeout``): reproducible without faults, hang-tolerant with.

An env worker waits for every step, as with a null patience, until one of its steps has run into
the step timeout; from then on a step slower than ``pool.step_patience_s`` is left pending instead
of holding the pool step. A run with slow but healthy steps (slower than the patience, faster than
the timeout) is therefore bit-identical to one that always waits, and a run with a hang pays the
step timeout once per worker, not once per hang.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import SemanticAction
from tasks.config_io import load_config
from tests.pool_fixtures import Fault, TinyFactory, tiny_variants

LOGIN, VIEW, PAY = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT), int(SemanticAction.SUBMIT_PAYMENT)
ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_default_is_a_patience_that_engages_after_a_timeout() -> None:
    for pool in (PoolConfig(), load_config(ROOT / "params.yaml").pool):
        assert pool.step_patience_s == 0.02 and pool.step_patience_engages == "after_timeout"


def _run(config: PoolConfig, slow: dict[str, Fault], steps: int = 60, n: int = 6) -> dict[str, np.ndarray]:
    """Every array a pool step returns, stacked over ``steps`` pool steps of seeded random actions."""
    variants = tiny_variants(n)
    pool = InProcessPool(variants, TinyFactory(faults=slow), n, config, seed=7)
    try:
        pool.reset(seed=7)
        rng = np.random.default_rng(7)
        rows: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "reward", "terminated", "truncated", "step_id")}
        for _ in range(steps):
            batch = pool.step(np.array([(LOGIN, VIEW, PAY)[a] for a in rng.integers(0, 3, size=n)]))
            assert batch.pending is None  # nothing was left behind
            rows["obs"].append(batch.obs.copy())
            rows["reward"].append(batch.reward.copy())
            rows["terminated"].append(batch.terminated.copy())
            rows["truncated"].append(batch.truncated.copy())
            rows["step_id"].append(np.array([info["step_id"] for info in batch.infos]))
        assert pool.stats()["env_timeout"] == 0
        return {k: np.stack(v) for k, v in rows.items()}
    finally:
        pool.close()


def test_fault_free_runs_with_the_default_are_bit_identical_to_always_waiting() -> None:
    # two variants whose every third step takes 0.05 s: slower than the 0.02 s patience, far under the timeout
    variants = tiny_variants(6)
    slow = {variants[i].env_id: Fault("hang", at_step=3, hang_s=0.05) for i in (1, 4)}
    base = {"num_workers": 2, "backend": "inprocess", "scheduler": "round_robin", "step_timeout_s": 2.0}
    first = _run(PoolConfig(**base), slow)
    second = _run(PoolConfig(**base), slow)
    waiting = _run(PoolConfig(**base, step_patience_s=None), slow)
    for key in first:
        assert np.array_equal(first[key], second[key], equal_nan=True), key
        assert np.array_equal(first[key], waiting[key], equal_nan=True), key
    assert first["reward"].sum() > 0.0 and first["terminated"].any()  # episodes ran to their ends


def test_after_its_first_timeout_a_worker_leaves_hangs_pending() -> None:
    variants = tiny_variants(4)
    # variant 1 hangs at step 2 of every episode, variant 2 at step 3: one worker hosts both
    faults = {variants[1].env_id: Fault("hang", at_step=2, hang_s=30.0)}
    faults[variants[2].env_id] = Fault("hang", at_step=3, hang_s=30.0)
    cfg = PoolConfig(
        num_workers=1, backend="inprocess", scheduler="round_robin", step_timeout_s=0.5, quarantine_after=10
    )
    pool = InProcessPool(variants, TinyFactory(faults=faults), 4, cfg, seed=0)
    try:
        pool.reset(seed=0)
        pool.step(np.full(4, LOGIN))
        started = time.perf_counter()
        batch = pool.step(np.full(4, VIEW))  # the first hang of this worker: waited for up to the timeout
        assert time.perf_counter() - started >= 0.45
        assert batch.pending is None and batch.infos[1]["failure_reason"] == "env_timeout"
        started = time.perf_counter()
        batch = pool.step(np.full(4, VIEW))  # the second: left pending after the patience
        assert time.perf_counter() - started < 0.3
        assert batch.pending is not None and batch.pending.tolist() == [False, False, True, False]
        assert [batch.infos[s]["step_id"] for s in (0, 3)] == [3, 3]
    finally:
        pool.close()
