"""The soak benchmark's injected faults are the ones it claims, and each ends only its own episode."""

from __future__ import annotations

import numpy as np
import pytest

from agentflow_core.config import PoolConfig
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import SemanticAction
from benchmarks.soak_bench import FAULT_KINDS, FaultInjectingFactory, pick_faulty
from tests.pool_fixtures import TinyFactory, tiny_variants

LOGIN, VIEW = int(SemanticAction.LOGIN), int(SemanticAction.VIEW_PRODUCT)
REASON = {"raise": "env_crash", "sleep": "env_timeout", "spin": "env_timeout", "nan": "env_invalid"}


def test_one_percent_per_kind_disjoint() -> None:
    variants = tiny_variants(300)
    faults = pick_faulty(variants, 0.01, np.random.default_rng(0))
    assert sorted(faults.values()) == sorted(k for k in FAULT_KINDS for _ in range(3))
    assert len(faults) == 12 and set(faults) <= {v.env_id for v in variants}


@pytest.mark.parametrize("kind", FAULT_KINDS)
def test_each_fault_kind_ends_its_episode_with_its_reason(kind: str) -> None:
    variants = tiny_variants(4)
    factory = FaultInjectingFactory(TinyFactory(), {variants[1].env_id: kind}, at_step=2, hang_s=5.0)
    cfg = PoolConfig(
        num_workers=2, backend="inprocess", scheduler="round_robin", step_timeout_s=0.3, step_patience_s=None
    )
    pool = InProcessPool(variants, factory, 4, cfg, seed=0)
    pool.reset(seed=0)
    pool.step(np.full(4, LOGIN))
    batch = pool.step(np.full(4, VIEW))
    assert [i["failure_reason"] for i in batch.infos] == [None, REASON[kind], None, None]
    stats = pool.stats()
    assert stats["failing_variants"] == {variants[1].env_id: 1}
    pool.close()
