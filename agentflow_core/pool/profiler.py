"""Env profiler: what one env of each family costs (creation, reset, step p50/p95, memory).

These numbers size the pool: step time decides how many envs a worker steps per call, memory
per live env decides ``max_live_per_worker``. Memory is the process RSS delta over creating
``mem_envs`` envs of a family, divided by their count (psutil; allocator noise averages out).
Returns plain records; the CLI (``agentflow profile-envs``) renders and writes them.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import psutil

from agentflow_core.pool.base import EnvFactory, VariantLike


@dataclass(frozen=True)
class EnvProfile:
    """Timings of one variant (or of a whole family when ``env_id`` is ``"*"``)."""

    family: str
    env_id: str
    create_ms: float
    reset_ms: float
    step_p50_ms: float
    step_p95_ms: float
    steps: int
    mem_per_env_kb: float | None = None
    py_heap_per_env_kb: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able form for the profile table and the benchmark records."""
        return asdict(self)


def _family(variant: VariantLike) -> str:
    return str(getattr(variant, "family", variant.base_env_id))


def _time_variant(
    variant: VariantLike, factory: EnvFactory, steps: int, rng: np.random.Generator
) -> tuple[float, list[float], list[float]]:
    started = time.perf_counter()
    env = factory(variant)
    create = time.perf_counter() - started
    resets: list[float] = []
    step_times: list[float] = []
    started = time.perf_counter()
    env.reset(seed=int(rng.integers(2**31 - 1)))
    resets.append(time.perf_counter() - started)
    for _ in range(steps):
        action = int(rng.choice(np.flatnonzero(env.action_masks())))
        started = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        step_times.append(time.perf_counter() - started)
        if terminated or truncated:
            started = time.perf_counter()
            env.reset(seed=int(rng.integers(2**31 - 1)))
            resets.append(time.perf_counter() - started)
    env.close()
    return create, resets, step_times


def memory_per_env_kb(variants: Sequence[VariantLike], factory: EnvFactory, seed: int = 0) -> tuple[float, float]:
    """(RSS growth, Python heap growth) per live env over creating and resetting one env per variant.

    RSS sees C-level memory (SQLite pages, sockets) but the allocator reuses freed pages, so small
    envs can show ~0; tracemalloc sees every Python allocation exactly. Both are reported.
    """
    gc.collect()
    process = psutil.Process()
    before = process.memory_info().rss
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    py_before = tracemalloc.get_traced_memory()[0]
    envs = []
    for i, variant in enumerate(variants):
        env = factory(variant)
        env.reset(seed=seed + i)
        envs.append(env)
    gc.collect()
    py_delta = tracemalloc.get_traced_memory()[0] - py_before
    delta = process.memory_info().rss - before
    if not tracing:
        tracemalloc.stop()
    for env in envs:
        env.close()
    n = max(len(envs), 1)
    return delta / n / 1024.0, py_delta / n / 1024.0


def profile_envs(
    variants: Sequence[VariantLike],
    factory: EnvFactory,
    per_family: int = 4,
    steps: int = 200,
    mem_envs: int = 50,
    seed: int = 0,
) -> list[EnvProfile]:
    """Per sampled variant and per family: create/reset means and step p50/p95 (ms), memory per env."""
    rng = np.random.default_rng(seed)
    by_family: dict[str, list[VariantLike]] = {}
    for v in variants:
        by_family.setdefault(_family(v), []).append(v)
    records: list[EnvProfile] = []
    for family in sorted(by_family):
        pool = by_family[family]
        sampled = [pool[i] for i in rng.choice(len(pool), size=min(per_family, len(pool)), replace=False)]
        family_create: list[float] = []
        family_resets: list[float] = []
        family_steps: list[float] = []
        for variant in sampled:
            create, resets, step_times = _time_variant(variant, factory, steps, rng)
            family_create.append(create)
            family_resets += resets
            family_steps += step_times
            records.append(_record(family, variant.env_id, [create], resets, step_times))
        mem_sample = [pool[i] for i in rng.choice(len(pool), size=min(mem_envs, len(pool)), replace=False)]
        rss_kb, heap_kb = memory_per_env_kb(mem_sample, factory, seed)
        records.append(_record(family, "*", family_create, family_resets, family_steps, rss_kb, heap_kb))
    return records


def _record(
    family: str,
    env_id: str,
    create: list[float],
    resets: list[float],
    step_times: list[float],
    mem_kb: float | None = None,
    heap_kb: float | None = None,
) -> EnvProfile:
    ms = np.asarray(step_times) * 1e3
    return EnvProfile(
        family=family,
        env_id=env_id,
        create_ms=float(np.mean(create) * 1e3),
        reset_ms=float(np.mean(resets) * 1e3),
        step_p50_ms=float(np.percentile(ms, 50)) if ms.size else 0.0,
        step_p95_ms=float(np.percentile(ms, 95)) if ms.size else 0.0,
        steps=int(ms.size),
        mem_per_env_kb=None if mem_kb is None else round(mem_kb, 2),
        py_heap_per_env_kb=None if heap_kb is None else round(heap_kb, 2),
    )
