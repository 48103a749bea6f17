"""Env reuse: a physical env re-targeted with ``reconfigure`` is indistinguishable from a fresh one.

For every registered family, an env is driven through a chain of variants (A -> B -> C ...,
abandoning an episode mid-way each time) and each leg is compared step for step with a fresh env
of the same variant: raw observations, rewards, termination flags and infos (physical level), and
the semantic vectors, masks and infos (through :class:`RegistryEnvFactory.reuse`). For order_db
the database itself is compared too: seed rows per env_id, and nothing left behind by rolled-back
episodes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pool_fixtures import registry_catalogue
from sqlalchemy import create_engine

from agentflow_core.envs.base import ReconfigurableEnv, Scenario
from agentflow_core.envs.order_db import OrderDBEnv, dump_tables
from agentflow_core.pool.base import ReusingEnvFactory
from agentflow_core.pool.worker import EnvWorker
from agentflow_core.registry import EnvEntry
from agentflow_core.semantics import N_ACTIONS
from agentflow_core.variants import VariantSpec

REPO = Path(__file__).resolve().parents[1]
ENTRIES, FACTORY, VARIANTS = registry_catalogue()
SEEDS = (3, 11)


def _chain(base_env_id: str, n: int = 5) -> list[VariantSpec]:
    """``n`` variants of one base env spread over the catalogue (different stages, networks, tiers)."""
    own = [v for v in VARIANTS if v.base_env_id == base_env_id]
    picks = np.linspace(0, len(own) - 1, n).astype(int)
    chain = [own[i] for i in picks]
    assert len({v.env_id for v in chain}) == n
    return chain


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _semantic_rollout(env: Any, seed: int, steps: int = 30) -> list[Any]:
    """Reset with ``seed`` and take random legal actions (drawn from a generator seeded alike)."""
    rng = np.random.default_rng(seed)
    obs, info = env.reset(seed=seed)
    trace: list[Any] = [obs, info]
    for _ in range(steps):
        action = int(rng.choice(np.flatnonzero(info["action_mask"])))
        obs, reward, terminated, truncated, info = env.step(action)
        trace.append((action, obs, reward, terminated, truncated, info))
        if terminated or truncated:
            obs, info = env.reset(seed=seed + 1)
            trace.append(("reset", obs, info))
    return trace


def _physical_rollout(physical: Any, adapter: Any, seed: int, steps: int = 30) -> list[Any]:
    """The same on the physical env alone: native actions, raw observations, StepResults."""
    rng = np.random.default_rng(seed)
    raw, info = physical.reset(seed=seed)
    trace: list[Any] = [raw, info]
    for _ in range(steps):
        action = int(rng.integers(0, N_ACTIONS))
        result = physical.step(adapter.adapt_action(action))
        trace.append((action, result.as_dict()))
        if result.done:
            trace.append(("reset", *physical.reset(seed=seed + 1)))
    return trace


@pytest.fixture(params=ENTRIES, ids=[e.env_id for e in ENTRIES])
def entry(request: pytest.FixtureRequest) -> EnvEntry:
    return request.param


def test_every_family_is_reconfigurable(entry: EnvEntry) -> None:
    variant = _chain(entry.env_id, 1)[0]
    env = FACTORY(variant)
    assert isinstance(env.physical, ReconfigurableEnv)  # type: ignore[attr-defined]
    assert isinstance(FACTORY, ReusingEnvFactory)
    env.close()


def test_reconfigured_physical_env_matches_a_fresh_one(entry: EnvEntry) -> None:
    chain = _chain(entry.env_id)
    adapter = FACTORY._adapter(entry)
    cls = type(FACTORY(chain[0]).physical)  # type: ignore[attr-defined]
    reused = cls(entry.scenario(chain[0].params), chain[0].env_id, **entry.kwargs)
    reused.reset(seed=99)
    reused.step(adapter.adapt_action(0))  # an episode left open: reconfigure must abandon it
    for variant in chain[1:]:
        scenario = entry.scenario(variant.params)
        reused.reconfigure(scenario, variant.env_id)
        assert reused.env_id == variant.env_id and reused.scenario == scenario
        fresh = cls(scenario, variant.env_id, **entry.kwargs)
        for seed in SEEDS:
            expected = _physical_rollout(fresh, adapter, seed)
            assert _same(_physical_rollout(reused, adapter, seed), expected), f"{variant.env_id} seed {seed}"
        fresh.close()
    reused.close()


def test_reused_semantic_env_matches_a_fresh_one(entry: EnvEntry) -> None:
    chain = _chain(entry.env_id)
    env = FACTORY(chain[0])
    _semantic_rollout(env, 5, steps=7)
    for variant in chain[1:]:
        reused = FACTORY.reuse(env, variant)
        assert reused is not None and reused.env_id == variant.env_id  # type: ignore[attr-defined]
        assert reused.physical is env.physical and reused.adapter is env.adapter  # type: ignore[attr-defined]
        fresh = FACTORY(variant)
        assert reused.max_episode_steps == fresh.max_episode_steps  # type: ignore[attr-defined]
        for seed in SEEDS:
            assert _same(_semantic_rollout(reused, seed), _semantic_rollout(fresh, seed)), (
                f"{variant.env_id} seed {seed}"
            )
        fresh.close()
        env = reused
    env.close()


# ------------------------------------------------------------------------------------- order_db
def _db_chain() -> list[tuple[Scenario, str]]:
    return [
        (Scenario(user_tier="vip", price_factor=1.5, inventory=0, start_stage="payment"), "order_db_v1_a"),
        (Scenario(user_tier="blocked", balance=40.0, network="packet_loss_5%"), "order_db_v1_b"),
        (Scenario(start_stage="checkout", card_decline_rate=1.0, inventory=3), "order_db_v1_c"),
    ]


def test_order_db_private_database_is_rekeyed_to_the_new_env_id() -> None:
    """Between episodes a private database holds the template's committed rows (re-targeting costs
    no SQL); inside an episode its rows carry the env's keys and scenario, exactly as a fresh env's."""
    (first, first_id), *rest = _db_chain()
    reused = OrderDBEnv(first, first_id)
    for scenario, env_id in rest:
        reused.reset(seed=1)
        reused.reconfigure(scenario, env_id)
        fresh = OrderDBEnv(scenario, env_id)
        with reused.engine.connect() as a, fresh.engine.connect() as b:
            assert dump_tables(a) == dump_tables(b)  # committed state: the template in both
        reused.reset(seed=2)
        fresh.reset(seed=2)
        episode = dump_tables(reused.conn)
        assert episode == dump_tables(fresh.conn)  # same ids, keys and values as a fresh env's episode
        assert [r[1] for r in episode["users"]] == [f"customer@{env_id}"]
        assert [r[1] for r in episode["products"]] == [f"{env_id}/sku-{i}" for i in range(3)]
        fresh.close()
    reused.close()


def test_order_db_rollback_at_reset_still_holds_after_reconfigure() -> None:
    env = OrderDBEnv(Scenario(), "order_db_v1_iso")
    rng = np.random.default_rng(0)
    ops = [
        "login",
        "view_product",
        "add_cart_item",
        "create_order",
        "open_payment",
        "charge",
        "top_up",
        "switch_card",
        "escalate",
        "cancel_order",
        "remove_cart_items",
    ]
    for scenario, env_id in _db_chain():
        env.reconfigure(scenario, env_id)
        env.reset(seed=0)
        before = dump_tables(env.conn)  # committed rows + this seed's start-stage setup, inside the episode
        for episode in range(20):
            env.reset(seed=episode + 1)
            for _ in range(25):
                if env.step({"type": "sql", "op": str(rng.choice(ops))}).done:
                    break
        env.reset(seed=0)
        assert dump_tables(env.conn) == before  # every other episode's writes were rolled back
    env.close()


def test_order_db_shared_database_keeps_per_env_rows(tmp_path: Path) -> None:
    """On a shared URL, reconfiguring to B == building B after A; each env removes its own rows at close."""
    (a, a_id), (b, b_id), _ = _db_chain()
    url_reused, url_fresh = f"sqlite:///{tmp_path / 'reused.db'}", f"sqlite:///{tmp_path / 'fresh.db'}"
    reused = OrderDBEnv(a, a_id, url=url_reused)
    first = OrderDBEnv(a, a_id, url=url_fresh)
    first.close()
    reused.reset(seed=4)
    reused.step({"type": "sql", "op": "login"})
    reused.reconfigure(b, b_id)
    fresh = OrderDBEnv(b, b_id, url=url_fresh)
    adapter = FACTORY._adapter(next(e for e in ENTRIES if e.family == "order_db"))
    for seed in SEEDS:
        assert _same(_physical_rollout(reused, adapter, seed), _physical_rollout(fresh, adapter, seed))
    reused.close()
    fresh.close()
    dumps = []
    for url in (url_reused, url_fresh):
        engine = create_engine(url)
        with engine.connect() as conn:
            dumps.append(dump_tables(conn))
        engine.dispose()
    assert dumps[0] == dumps[1]  # every env removed its own rows: nothing of A or B is left
    assert dumps[0]["users"] == [] and dumps[0]["products"] == [] and dumps[0]["inventory"] == []
    assert all(not dumps[0][t] for t in ("orders", "payments", "sessions", "tickets", "topups", "cart_items"))


# ------------------------------------------------------------------------------------- worker
def test_worker_prefers_reuse_and_reused_envs_match_fresh_ones() -> None:
    variants = dict(enumerate(VARIANTS))
    worker = EnvWorker(FACTORY, variants, max_live=12, step_timeout_s=30.0)
    order = np.random.default_rng(0).permutation(len(variants))  # 60 distinct variants: every reset is cold
    slots = np.arange(6)
    for round_ in range(10):
        picks, seeds = order[round_ * 6 : (round_ + 1) * 6], np.arange(6) + 100 * round_
        got = worker.reset(slots, picks, seeds)
        fresh = EnvWorker(FACTORY, variants, max_live=1000, step_timeout_s=30.0)
        want = fresh.reset(slots, picks, seeds)
        assert np.array_equal(got.obs, want.obs) and np.array_equal(got.action_mask, want.action_mask)
        actions = np.argmax(got.action_mask, axis=1)
        for _ in range(3):
            a, b = worker.step(slots, actions), fresh.step(slots, actions)
            assert np.array_equal(a.obs, b.obs) and np.array_equal(a.reward, b.reward)
            assert a.failure_reason == b.failure_reason and np.array_equal(a.truncated, b.truncated)
        fresh.close()
        assert worker.live_count <= 12
    stats = worker.stats()
    assert stats["created"] + stats["reused"] == 60
    assert stats["reused"] >= 35  # cold variants mostly ran on re-targeted envs of their base env
    worker.close()


def test_standby_worker_prewarms_then_adopts_a_slice() -> None:
    spare = EnvWorker(FACTORY, {}, max_live=64, step_timeout_s=30.0, worker_index=-1)
    sample = {i: VARIANTS[i] for i in range(0, len(VARIANTS), max(len(VARIANTS) // 9, 1))}
    assert spare.prewarm(sample) == len(sample)
    slice_ = {i: v for i, v in enumerate(VARIANTS) if i % 2 == 1}
    assert spare.adopt(slice_, 0) == 0
    per_base = {e.env_id: [i for i, v in slice_.items() if v.base_env_id == e.env_id][:2] for e in ENTRIES}
    picks = np.asarray([i for chosen in per_base.values() for i in chosen])  # two new variants per base env
    assert not set(picks.tolist()) & set(sample)
    batch = spare.reset(np.arange(len(picks)), picks, np.arange(len(picks)))
    assert all(r is None for r in batch.failure_reason)
    stats = spare.stats()
    assert stats["worker"] == 0 and stats["catalogue"] == len(slice_)
    assert stats["reused"] == len(picks) and stats["created"] == len(sample)  # nothing built after adoption
    spare.close()


def test_a_workers_warm_up_imports_the_env_classes_and_builds_the_adapters_a_first_build_would(
    tmp_path: Path,
) -> None:
    """A fresh worker process (a Ray actor unpickles its factory) pays them before its first timed reset.

    Importing the order-database env alone costs ~0.23 s of CPU: inside the first reset of a soak's
    0.25 s step timeout it ended a healthy variant's first episode as ``env_timeout`` on every side.
    """
    import pickle
    import subprocess
    import sys

    entries, factory, _ = registry_catalogue(1)
    blob = tmp_path / "factory.pkl"
    blob.write_bytes(pickle.dumps(factory))
    code = (
        "import pickle, sys\n"
        f"factory = pickle.loads(open({str(blob)!r}, 'rb').read())\n"
        "from agentflow_core.pool.worker import EnvWorker\n"
        "worker = EnvWorker(factory, {}, 4, 1.0)\n"
        "before = 'agentflow_core.envs.order_db.env' in sys.modules\n"
        "worker.prepare_factory()\n"
        "print(before, 'agentflow_core.envs.order_db.env' in sys.modules, *sorted(factory._adapters))\n"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    before, after, *adapters = out.stdout.split()
    assert (before, after) == ("False", "True")
    assert adapters == sorted(e.env_id for e in entries)
