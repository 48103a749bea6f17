"""``agentflow bench sql``: the SQL channel on SQLite vs a real PostgreSQL server, the same episodes.

Both sides run the shipped ``order_db_v1`` entry (its registry params and mapping) through
:class:`~agentflow_core.envs.semantic_env.SemanticEnv`: the private in-memory SQLite the pool uses
by default, and the embedded PostgreSQL server (``url: pgserver``, see
:mod:`agentflow_core.envs.order_db.postgres`). Each side plays the same scripted-expert episodes
(same seeds, so the same actions), alternating side by side in one run; a reset is the rollback of
the previous episode plus the seed alignment of the next. Server start-up is timed separately.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.order_db.postgres import EMBEDDED_POSTGRES, acquire_embedded, release_embedded
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.registry import EnvEntry

ENV_ID = "order_db_v1"


def _timed_episode(env: SemanticEnv, seed: int, resets: list[float], steps: list[float]) -> bool:
    """One expert episode; appends its reset time and each step's time; True on the process goal."""
    expert = expert_for("order_db")
    t0 = time.perf_counter()
    obs, info = env.reset(seed=seed)
    resets.append(time.perf_counter() - t0)
    while True:
        t0 = time.perf_counter()
        obs, _, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
        steps.append(time.perf_counter() - t0)
        if terminated or truncated:
            return "PAYMENT_SUCCESS" in info["tokens"] or info.get("failure_reason") == "user_blocked"


def _ms(values: list[float], q: float) -> float:
    return float(np.percentile(values, q) * 1000)


def run_sql_bench(entry: EnvEntry, episodes: int = 200) -> dict[str, Any]:
    """Reset and step latency p50/p95 per backend over the same expert episodes, and PG start-up."""
    t0 = time.perf_counter()
    acquire_embedded()  # held for the run, so the sides' envs share one server
    startup_s = time.perf_counter() - t0
    try:
        makers: dict[str, Callable[[], SemanticEnv]] = {
            "sqlite": entry.make,
            "postgresql": dataclasses.replace(entry, kwargs={**entry.kwargs, "url": EMBEDDED_POSTGRES}).make,
        }
        envs = {name: make() for name, make in makers.items()}
        timings: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in envs}
        goals = dict.fromkeys(envs, 0)
        for episode in range(episodes):
            for name, env in envs.items():
                goals[name] += _timed_episode(env, episode, *timings[name])
        for env in envs.values():
            env.close()
    finally:
        release_embedded()
    result: dict[str, Any] = {"env_id": entry.env_id, "episodes": episodes, "postgresql_startup_s": startup_s}
    for name, (resets, steps) in timings.items():
        result |= {
            f"{name}_reset_p50_ms": _ms(resets, 50),
            f"{name}_reset_p95_ms": _ms(resets, 95),
            f"{name}_step_p50_ms": _ms(steps, 50),
            f"{name}_step_p95_ms": _ms(steps, 95),
            f"{name}_process_success": goals[name] / episodes,
        }
    result["postgresql_vs_sqlite_reset_p50"] = result["postgresql_reset_p50_ms"] / result["sqlite_reset_p50_ms"]
    result["postgresql_vs_sqlite_step_p50"] = result["postgresql_step_p50_ms"] / result["sqlite_step_p50_ms"]
    result["load_avg_1m"] = os.getloadavg()[0]
    result["notes"] = [
        "Same expert episodes (seeds 0..N-1) on both sides, alternating; SQLite is the private in-memory database "
        "each pool env gets by default, PostgreSQL the embedded server (pgserver) over its Unix socket.",
        "A reset rolls back the previous episode's transaction, aligns the env's seed rows to the scenario and "
        "opens the next transaction; steps include the savepoint of each mutating op.",
    ]
    return result
