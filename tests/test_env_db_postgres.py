"""The SQL channel on a real PostgreSQL server (embedded through pgserver): isolation, locks, lifetime."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, text

from agentflow_core.adapters.db import DBAdapter
from agentflow_core.envs.base import Scenario
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.order_db import OrderDBEnv, dump_tables
from agentflow_core.envs.order_db.postgres import EMBEDDED_POSTGRES, acquire_embedded, embedded_users, release_embedded
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, SemanticAction

MAPPING_PATH = Path(__file__).resolve().parents[1] / "agentflow_core" / "mappings" / "order_db_v1.json"


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """The module's embedded server (held open so each test does not start a new one)."""
    yield acquire_embedded()
    release_embedded()


@pytest.fixture(scope="module")
def adapter() -> DBAdapter:
    return DBAdapter(json.loads(MAPPING_PATH.read_text()), str(MAPPING_PATH), vocabulary=CHECKOUT)


def pg_env(adapter: DBAdapter, env_id: str = "order_db_v1_pg", **params: Any) -> SemanticEnv:
    return SemanticEnv(OrderDBEnv(Scenario(**params), env_id, url=EMBEDDED_POSTGRES), adapter)


def expert_episode(env: SemanticEnv, seed: int) -> dict[str, Any]:
    expert = expert_for("order_db")
    obs, info = env.reset(seed=seed)
    while True:
        obs, _, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
        if terminated or truncated:
            return info


def test_rolled_back_episodes_leave_the_postgresql_database_unchanged(url: str, adapter: DBAdapter) -> None:
    env = pg_env(
        adapter,
        start_stage="payment",
        card_decline_rate=0.3,
        balance=150.0,
        network="packet_loss_5%",
        max_episode_steps=12,
    )
    reader = create_engine(url)
    with reader.connect() as conn:
        before = dump_tables(conn)
    rng = np.random.default_rng(0)
    applied = 0
    for episode in range(200):  # enough applied writes (> 300) under the random policy and the process masks
        _, info = env.reset(seed=episode)
        while True:
            legal = np.flatnonzero(info["action_mask"])
            action = int(rng.choice(legal)) if rng.random() < 0.5 else int(rng.integers(N_ACTIONS))
            _, _, terminated, truncated, info = env.step(action)
            applied += bool(info["applied"])
            if terminated or truncated:
                break
    with reader.connect() as conn:
        after = dump_tables(conn)
    env.close()
    with reader.connect() as conn:
        closed = dump_tables(conn)
    reader.dispose()
    assert applied > 300 and after == before and before["users"] and before["orders"] == []
    assert closed["users"] == [] and closed["products"] == []  # close() removed the env's rows


def test_two_live_envs_of_one_variant_never_share_rows(adapter: DBAdapter) -> None:
    a, b = pg_env(adapter, "order_db_v1_same"), pg_env(adapter, "order_db_v1_same")
    expert = expert_for("order_db")
    (obs_a, info_a), (obs_b, info_b) = a.reset(seed=1), b.reset(seed=1)
    done_a = done_b = False
    while not (done_a and done_b):  # interleaved: each holds its episode transaction open
        if not done_a:
            obs_a, _, te, tr, info_a = a.step(expert.act(obs_a, info_a["action_mask"]))
            done_a = te or tr
        if not done_b:
            obs_b, _, te, tr, info_b = b.step(expert.act(obs_b, info_b["action_mask"]))
            done_b = te or tr
    assert "PAYMENT_SUCCESS" in info_a["tokens"] and "PAYMENT_SUCCESS" in info_b["tokens"]
    a.close()
    b.close()


def test_a_held_row_lock_is_an_error_row_then_retry_succeeds(url: str, adapter: DBAdapter) -> None:
    env = pg_env(adapter, "order_db_v1_lock")
    env.reset(seed=0)
    user_id = env.physical._seeded[0]  # type: ignore[attr-defined]
    other = create_engine(url).connect()
    txn = other.begin()
    other.execute(text("SELECT id FROM users WHERE id = :u FOR UPDATE"), {"u": user_id})
    _, reward, terminated, _, info = env.step(int(SemanticAction.LOGIN))
    assert info["failure_reason"] == "lock_timeout" and "SERVER_ERROR" in info["tokens"]
    assert "lock timeout" in info["error"]["message"] and not terminated and info["action_mask"][SemanticAction.RETRY]
    txn.rollback()
    other.close()
    _, _, _, _, info = env.step(int(SemanticAction.RETRY))
    assert info["failure_reason"] is None and "LOGGED_IN" in info["tokens"]
    env.close()


@pytest.mark.parametrize("tier", ["standard", "vip", "blocked"])
def test_the_expert_finishes_the_process_on_postgresql(adapter: DBAdapter, tier: str) -> None:
    env = pg_env(adapter, f"order_db_v1_{tier}", user_tier=tier, card_decline_rate=0.3)
    outcomes = [expert_episode(env, seed) for seed in range(10)]
    env.close()
    if tier == "blocked":
        assert all(i["failure_reason"] == "user_blocked" for i in outcomes)
    else:
        assert all("PAYMENT_SUCCESS" in i["tokens"] for i in outcomes)


def test_the_last_env_stops_the_embedded_server(adapter: DBAdapter) -> None:
    held = embedded_users()  # the module fixture's reference
    env = pg_env(adapter)
    assert embedded_users() == held + 1
    env.close()
    assert embedded_users() == held


def test_a_server_left_by_a_killed_process_is_swept_by_the_next(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import tempfile

    import psutil

    from agentflow_core.envs.order_db.postgres import PREFIX, sweep_orphans

    code = (
        "from agentflow_core.envs.order_db.postgres import acquire_embedded, _folder_path\n"
        "import sys, time\nacquire_embedded()\nprint(_folder_path(), flush=True)\ntime.sleep(120)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=Path.cwd())
    assert child.stdout is not None
    folder = Path(child.stdout.readline().strip())
    postmaster = int((folder / "pgdata" / "postmaster.pid").read_text().split()[0])
    assert folder.name.startswith(PREFIX) and psutil.pid_exists(postmaster)
    assert folder not in sweep_orphans(Path(tempfile.gettempdir()))  # its owner is alive: kept
    os.kill(child.pid, signal.SIGKILL)  # the exit handler never runs: the server stays behind
    child.wait()
    assert psutil.pid_exists(postmaster)
    assert folder in sweep_orphans(Path(tempfile.gettempdir()))
    psutil.wait_procs([psutil.Process(postmaster)] if psutil.pid_exists(postmaster) else [], timeout=10)
    assert not psutil.pid_exists(postmaster) and not folder.exists()


def test_sql_bench_plays_the_same_expert_episodes_on_both_databases() -> None:
    import yaml

    from agentflow_core.registry import EnvRegistry
    from benchmarks.sql_bench import ENV_ID, run_sql_bench

    entry = EnvRegistry(Path(__file__).resolve().parents[1] / "configs/envs", yaml.safe_load).get(ENV_ID)
    result = run_sql_bench(entry, episodes=10)
    assert result["sqlite_process_success"] == result["postgresql_process_success"] == 1.0
    assert result["postgresql_reset_p50_ms"] > 0 and result["sqlite_step_p50_ms"] > 0
    assert embedded_users() == 1  # the module fixture's reference only: the bench released its own
