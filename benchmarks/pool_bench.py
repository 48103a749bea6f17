"""Pool benchmark: semantic overhead, Ray speedup, memory, scheduler coverage, recovery after a kill.

Everything is measured side by side in one run and reported as ratios, so machine speed cancels:

- ``semantic_overhead``: (pool step cost with adapters + scheduler) / (raw step cost) - 1, where the
  raw side is ``gymnasium.vector.SyncVectorEnv`` over thin envs that drive the same physical envs
  with precomputed native actions and no semantic mapping. Both play the same episodes: the raw
  side replays the variants and episode seeds the pool's scheduler picked, with the same actions.
- ``ray_speedup_2_workers``: in-process pool time / Ray pool (2 actors) time, same variants, slots, actions.
- memory (``*_mb``): RSS growth measured in fresh spawned processes (psutil), so one probe's
  allocations cannot hide another's: the empty pool (1 variant, 1 slot), the whole catalogue
  (1 slot), 300 live envs, and every variant live at once (or extrapolated, flagged).
- scheduler coverage: :func:`benchmarks.scheduler_bench.run_scheduler_bench`.
- recovery: SIGKILL one Ray worker at a fixed step; time to detect, until its envs step again,
  env-steps lost, and throughput 5 s after the kill relative to before.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np
import psutil

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import EnvFactory, PoolBatch, VariantLike
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import N_ACTIONS, OBS_DIM

TARGETS = {
    "semantic_overhead": 0.25,
    "ray_speedup_2_workers": 1.3,
    "catalogue_7200_mb": 20.0,
    "live_300_mb": 300.0,
    "recovery_s": 2.0,
    "throughput_after_5s_ratio": 0.9,
}


class ReplaySchedule:
    """Every episode the pool started, per slot and in order: (variant index, episode seed).

    The comparison sides of :func:`semantic_overhead` replay it, so each slot of a
    ``SyncVectorEnv`` plays exactly the episodes the pool's scheduler picked (same variant, same
    seed, same actions): the step costs differ only by the layers under test, not by the mix of
    episodes the scheduler happened to favour.
    """

    def __init__(self, num_envs: int) -> None:
        self.episodes: list[list[tuple[int, int]]] = [[] for _ in range(num_envs)]

    def record_reset(self, batch: PoolBatch) -> None:
        """Record each slot's first episode after a pool reset."""
        for slot, info in enumerate(batch.infos):
            self.episodes[slot].append((int(info["variant_index"]), int(info["episode_seed"])))

    def record_step(self, batch: PoolBatch) -> None:
        """Record the next episode of every slot whose episode ended this step."""
        for slot in np.flatnonzero(batch.done).tolist():
            info = batch.infos[slot]
            self.episodes[slot].append((int(info["next_variant_index"]), int(info["next_episode_seed"])))


class _EnvCache:
    """Idle envs shared by the slots of one replaying vector env, reused the way a pool worker does.

    A slot's finished env is parked here; the next episode takes an idle env of its variant, else
    re-targets an idle env of the same base env (``factory.reuse``), else builds one. So the
    replay sides build and re-target envs about as often as the pool does.
    """

    def __init__(self, factory: EnvFactory, variants: Sequence[VariantLike]) -> None:
        self.factory, self.variants = factory, variants
        self.idle: dict[int, list[Any]] = {}
        self.created = 0

    def park(self, v: int, env: Any) -> None:
        self.idle.setdefault(v, []).append(env)

    def take(self, v: int) -> Any:
        envs = self.idle.get(v)
        if envs:
            env = envs.pop()
        else:
            base = self.variants[v].base_env_id
            donor_v = next((d for d, e in self.idle.items() if e and self.variants[d].base_env_id == base), None)
            env = None
            if donor_v is not None and callable(getattr(self.factory, "reuse", None)):
                donor = self.idle[donor_v].pop()
                env = self.factory.reuse(donor, self.variants[v])  # type: ignore[attr-defined]
                if env is None:  # declined: the donor stays idle
                    self.park(donor_v, donor)
            if env is None:
                env = self.factory(self.variants[v])
                self.created += 1
        return env

    def close(self) -> None:
        for envs in self.idle.values():
            for env in envs:
                env.close()
        self.idle.clear()


class _ReplayEnv(gym.Env[np.ndarray, np.int64]):
    """One slot of a replaying SyncVectorEnv: each reset starts the slot's next recorded episode.

    The vector env's own reset seeds are ignored: the recorded episode seed is used, through the
    same Gymnasium seeding as :class:`~agentflow_core.envs.semantic_env.SemanticEnv`, so the
    trajectories match the pool's.
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(OBS_DIM,), dtype=np.float32)
    action_space = gym.spaces.Discrete(N_ACTIONS)

    def __init__(self, cache: _EnvCache, episodes: list[tuple[int, int]]) -> None:
        self.cache, self.episodes = cache, episodes
        self._next = 0
        self._variant = -1
        self.env: Any = None
        self.base_env_id = ""

    def _start(self) -> int:
        if self._next >= len(self.episodes):
            raise RuntimeError(
                f"replay ran past the {len(self.episodes)} episodes the pool recorded for this slot: "
                "the replayed trajectories diverged from the pool's"
            )
        v, seed = self.episodes[self._next]
        self._next += 1
        if self.env is not None:
            self.cache.park(self._variant, self.env)
        self.env, self._variant = self.cache.take(v), v
        self.base_env_id = self.cache.variants[v].base_env_id
        return seed

    def close(self) -> None:
        if self.env is not None:
            self.env.close()
            self.env = None


class ReplayRawEnv(_ReplayEnv):
    """The physical env with no semantic layer: native actions from a table, a constant observation."""

    def __init__(self, cache: _EnvCache, episodes: list[tuple[int, int]]) -> None:
        super().__init__(cache, episodes)
        self._obs = np.zeros(OBS_DIM, dtype=np.float32)
        self._native: dict[str, list[dict[str, Any]]] = {}
        self.physical: Any = None
        self._actions: list[dict[str, Any]] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start the slot's next recorded episode on the bare physical env; the observation is constant."""
        episode_seed = self._start()
        super().reset(seed=episode_seed)
        self.physical, adapter = self.env.physical, self.env.adapter
        table = self._native.get(self.base_env_id)
        if table is None:
            table = self._native[self.base_env_id] = [adapter.adapt_action(a) for a in range(N_ACTIONS)]
        self._actions = table
        self.physical.reset(seed=int(self.np_random.integers(0, 2**31 - 1)))
        return self._obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Step the physical env with the native action the adapter maps ``action`` to, looked up in a table."""
        result = self.physical.step(self._actions[int(action)])
        return self._obs, float(result.reward), bool(result.terminated), bool(result.truncated), {}


class ReplaySemanticEnv(_ReplayEnv):
    """The pool's SemanticEnv (adapters) without the pool; the per-step info is not batched."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start the slot's next recorded episode through the SemanticEnv."""
        episode_seed = self._start()
        obs, _ = self.env.reset(seed=episode_seed)
        return obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Step the SemanticEnv; its info is dropped, as a vector env over it would not batch it."""
        obs, reward, terminated, truncated, _ = self.env.step(action)
        return obs, float(reward), terminated, truncated, {}


def _mixed_sample(variants: Sequence[VariantLike], n: int, rng: np.random.Generator) -> list[VariantLike]:
    """``n`` variants spread evenly over families (the catalogue order groups them)."""
    picks = rng.choice(len(variants), size=min(n, len(variants)), replace=False)
    return [variants[i] for i in sorted(picks.tolist())]


def _drive(pool: PoolDriver, steps: int, rng: np.random.Generator, first_mask: np.ndarray) -> tuple[float, np.ndarray]:
    """Step with random legal actions; returns (seconds, last action mask)."""
    mask = first_mask
    started = time.perf_counter()
    for _ in range(steps):
        mask = pool.step(np.argmax(rng.random(mask.shape) * mask, axis=1)).action_mask
    return time.perf_counter() - started, mask


def semantic_overhead(
    variants: Sequence[VariantLike],
    factory: EnvFactory,
    num_envs: int = 64,
    steps: int = 200,
    scheduler: str = "plr_coverage",
    seed: int = 0,
    warmup: int = 50,
    blocks: int = 8,
) -> dict[str, Any]:
    """Pool (adapters + scheduler + bookkeeping) vs raw SyncVectorEnv, playing the very same episodes.

    A first pool run records which episode (variant, episode seed) every slot starts; a fresh
    pool with the same seed then runs again (it must start the same episodes: checked), side by
    side with two SyncVectorEnvs that replay the record: raw physical envs driven with native
    actions (no semantic mapping), and the SemanticEnvs alone (adapters without the pool). Same
    variants, seeds and actions, so every side plays the same trajectories (the done flags are
    compared step by step) and the step costs differ only by the layers on top. After a warm-up
    the three sides run in alternating blocks, rotating which goes first, so background load
    hits them alike; the ratio is of the median block times.
    """
    rng = np.random.default_rng(seed)
    sample = _mixed_sample(variants, num_envs, rng)
    n = len(sample)
    block = max(steps // blocks, 1)
    actions = rng.integers(0, N_ACTIONS, size=(warmup + block * blocks, n))
    config = PoolConfig(num_workers=1, scheduler=scheduler)

    schedule = ReplaySchedule(n)
    recorder = InProcessPool(sample, factory, n, config, seed=seed)
    schedule.record_reset(recorder.reset(seed=seed))
    recorded_done = []
    for a in actions:
        batch = recorder.step(a)
        schedule.record_step(batch)
        recorded_done.append(batch.done.copy())
    recorder.close()

    caches = {"raw": _EnvCache(factory, sample), "semantic": _EnvCache(factory, sample)}

    def replaying(kind: type[_ReplayEnv], cache: _EnvCache) -> gym.vector.SyncVectorEnv:
        return gym.vector.SyncVectorEnv(
            [partial(kind, cache, schedule.episodes[i]) for i in range(n)],
            autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
        )

    raw, semantic = replaying(ReplayRawEnv, caches["raw"]), replaying(ReplaySemanticEnv, caches["semantic"])
    pool = InProcessPool(sample, factory, n, config, seed=seed)
    agree = {"raw": 0, "semantic": 0, "pool": 0}
    sides: dict[str, Callable[[np.ndarray], np.ndarray]] = {
        "raw": lambda a: np.logical_or(*raw.step(a)[2:4]),
        "semantic": lambda a: np.logical_or(*semantic.step(a)[2:4]),
        "pool": lambda a: pool.step(a).done,
    }
    raw.reset(seed=seed)
    semantic.reset(seed=seed)
    pool.reset(seed=seed)
    for t in range(warmup):
        for name, step_fn in sides.items():
            agree[name] += int(np.array_equal(step_fn(actions[t]), recorded_done[t]))
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for b in range(blocks):
        first = warmup + b * block
        for name in order[b % 3 :] + order[: b % 3]:
            step_fn, done = sides[name], []
            started = time.perf_counter()
            for a in actions[first : first + block]:
                done.append(step_fn(a))
            times[name].append(time.perf_counter() - started)
            agree[name] += sum(int(np.array_equal(d, r)) for d, r in zip(done, recorded_done[first:], strict=False))
    created = pool.stats()["workers"][0]["created"]
    raw.close()
    semantic.close()
    pool.close()
    for cache in caches.values():
        cache.close()
    per_block = block * n
    total = warmup + block * blocks
    raw_med, semantic_med, pool_med = (float(np.median(times[k])) for k in ("raw", "semantic", "pool"))
    # Split: adapters alone (SyncVectorEnv over SemanticEnv) vs the pool's own share on top of them.
    return {
        "semantic_overhead": pool_med / raw_med - 1.0,
        "raw_step_us": raw_med / per_block * 1e6,
        "adapter_only_overhead": semantic_med / raw_med - 1.0,
        "pool_vs_semantic_vector": pool_med / semantic_med - 1.0,
        "semantic_vector_step_us": semantic_med / per_block * 1e6,
        "pool_step_us": pool_med / per_block * 1e6,
        "overhead_envs": n,
        "overhead_steps": block * blocks,
        "overhead_episodes": sum(len(e) for e in schedule.episodes),
        "overhead_pool_envs_created": int(created),
        "overhead_raw_envs_created": caches["raw"].created,
        # Share of steps whose done flags matched the recording on every slot (1.0: same trajectories).
        "overhead_trajectory_match": min(agree.values()) / total,
    }


# --------------------------------------------------------------------------------------- memory
def _memory_probe(variant_json: list[str], factory: EnvFactory, num_envs: int, max_live: int) -> dict[str, float]:
    """Runs in a fresh process: RSS growth of parsing the catalogue, building the pool and resetting it."""
    from agentflow_core.variants import VariantSpec

    gc.collect()
    process = psutil.Process()
    base = process.memory_info().rss
    variants = [VariantSpec.from_json(text) for text in variant_json]
    config = PoolConfig(num_workers=1, scheduler="round_robin", max_live_per_worker=max_live)
    started = time.perf_counter()
    pool = InProcessPool(variants, factory, num_envs, config, seed=0)
    pool.reset(seed=0)
    elapsed = time.perf_counter() - started
    gc.collect()
    live = pool.stats()["live_envs"]
    return {"mb": (process.memory_info().rss - base) / 2**20, "live_envs": float(live), "build_s": elapsed}


def _probe(variant_json: list[str], factory: EnvFactory, num_envs: int, max_live: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as workers:
        return workers.apply(_memory_probe, (variant_json, factory, num_envs, max_live))


def memory_footprint(
    variants: Sequence[VariantLike], factory: EnvFactory, live: int = 300, measure_all_live: bool = True
) -> dict[str, Any]:
    """Catalogue, 300-live and all-live memory beyond an empty pool, each probe in its own process."""
    texts = [v.to_json() for v in variants]  # type: ignore[attr-defined]
    empty = _probe(texts[:1], factory, 1, 1)
    catalogue = _probe(texts, factory, 1, 1)
    live_probe = _probe(texts, factory, live, live)
    per_env_mb = (live_probe["mb"] - catalogue["mb"]) / max(live_probe["live_envs"], 1.0)
    out: dict[str, Any] = {
        "n_variants": len(texts),
        "catalogue_7200_mb": catalogue["mb"] - empty["mb"],
        "live_300_mb": live_probe["mb"] - catalogue["mb"],
        "live_300_envs": int(live_probe["live_envs"]),
        "per_env_kb": per_env_mb * 1024,
    }
    if measure_all_live:
        all_live = _probe(texts, factory, len(texts), len(texts))
        out.update(
            all_live_7200_mb=all_live["mb"] - catalogue["mb"],
            all_live_7200_extrapolated=False,
            all_live_7200_envs=int(all_live["live_envs"]),
            all_live_7200_build_s=all_live["build_s"],
        )
    else:
        out.update(all_live_7200_mb=per_env_mb * len(texts), all_live_7200_extrapolated=True)
    return out


# --------------------------------------------------------------------------------------- ray
def ray_speedup_and_recovery(
    variants: Sequence[VariantLike],
    factory: EnvFactory,
    num_envs: int = 300,
    steps: int = 30,
    seed: int = 0,
    config: PoolConfig | None = None,
    window_s: float = 3.0,
    recovery: bool = True,
) -> dict[str, Any]:
    """In-process vs Ray (2 workers) on the same variants, then a SIGKILL of one Ray worker."""
    from agentflow_core.pool.ray_pool import RayPool

    base = config or PoolConfig()
    config = base.model_copy(update={"num_workers": 2, "max_live_per_worker": max(base.max_live_per_worker, num_envs)})
    timings: dict[str, float] = {}
    pools: dict[str, InProcessPool | RayPool] = {}
    for name in ("inprocess", "ray"):
        pool: InProcessPool | RayPool = (
            InProcessPool(variants, factory, num_envs, config, seed=seed)
            if name == "inprocess"
            else RayPool(variants, factory, num_envs, config, seed=seed)
        )
        if isinstance(pool, RayPool):
            pool.wait_standby()  # its one-off start-up is not steady-state throughput
        rng = np.random.default_rng(seed)
        _, mask = _drive(pool, 10, rng, pool.reset(seed=seed).action_mask)  # warm-up: envs created lazily
        timings[name], _ = _drive(pool, steps, rng, mask)
        pools[name] = pool
    pools["inprocess"].close()
    out: dict[str, Any] = {
        "ray_speedup_2_workers": timings["inprocess"] / timings["ray"],
        "inprocess_env_steps_per_s": steps * num_envs / timings["inprocess"],
        "ray_env_steps_per_s": steps * num_envs / timings["ray"],
        "ray_num_envs": num_envs,
        "ray_steps": steps,
    }
    if recovery:
        out.update(_recovery(pools["ray"], seed, window_s))  # type: ignore[arg-type]
    pools["ray"].close()
    return out


def _throughput(
    pool: PoolDriver, rng: np.random.Generator, mask: np.ndarray, seconds: float
) -> tuple[float, np.ndarray]:
    steps, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        mask = pool.step(np.argmax(rng.random(mask.shape) * mask, axis=1)).action_mask
        steps += 1
    return steps * pool.num_envs / (time.perf_counter() - started), mask


def _recovery(pool: Any, seed: int, window_s: float) -> dict[str, Any]:
    rng = np.random.default_rng(seed + 1)
    mask = pool.step(np.zeros(pool.num_envs, np.int64)).action_mask
    before, mask = _throughput(pool, rng, mask, window_s)
    killed_at = time.monotonic()
    os.kill(pool.worker_pids()[0], signal.SIGKILL)
    batch = pool.step(np.argmax(rng.random(mask.shape) * mask, axis=1))
    lost = sum(info["failure_reason"] == "worker_lost" for info in batch.infos)
    batch = pool.step(np.argmax(rng.random(batch.action_mask.shape) * batch.action_mask, axis=1))
    stepping_again = time.monotonic() - killed_at  # every slot, the victim's included, has stepped again
    mask = batch.action_mask
    while time.monotonic() - killed_at < 5.0:
        mask = pool.step(np.argmax(rng.random(mask.shape) * mask, axis=1)).action_mask
    after, _ = _throughput(pool, rng, mask, window_s)
    event = pool.loss_events[-1] if pool.loss_events else {"detected_at": float("nan"), "restored_at": float("nan")}
    return {
        "recovery_detect_s": event["detected_at"] - killed_at,
        "recovery_restart_s": event["restored_at"] - killed_at,
        "recovery_s": stepping_again,
        "recovery_steps_lost": int(lost),
        "throughput_before_env_steps_per_s": before,
        "throughput_after_5s_env_steps_per_s": after,
        "throughput_after_5s_ratio": after / before,
    }


# --------------------------------------------------------------------------------------- all
def scheduler_coverage(
    config: PoolConfig, n_variants: int = 1000, draws: int = 50_000, seed: int = 0
) -> dict[str, Any]:
    """The configured strategy's coverage ratios from the scheduler benchmark."""
    from benchmarks.scheduler_bench import run_scheduler_bench

    result = run_scheduler_bench(
        n_variants=n_variants, draws=draws, seed=seed, cfg=config, strategies=(config.scheduler,)
    )
    metrics = result["strategies"][config.scheduler]
    return {
        "scheduler": config.scheduler,
        "scheduler_n_variants": n_variants,
        "scheduler_draws": draws,
        **{
            k: metrics[k]
            for k in ("cold_share_vs_round_robin", "max_visit_gap_over_n", "draws_to_90pct_vs_round_robin")
        },
    }


def run_pool_bench(
    variants: Sequence[VariantLike],
    factory: EnvFactory,
    *,
    config: PoolConfig | None = None,
    num_envs: int = 300,
    steps: int = 30,
    overhead_envs: int = 64,
    overhead_steps: int = 200,
    measure_all_live: bool = True,
    scheduler_draws: int = 50_000,
    seed: int = 0,
) -> dict[str, Any]:
    """Run every pool measurement; returns one flat dict of numbers plus targets and their verdicts."""
    config = config or PoolConfig()
    started = time.perf_counter()
    out: dict[str, Any] = {"machine_cpus": os.cpu_count(), "n_variants": len(variants)}
    out.update(semantic_overhead(variants, factory, overhead_envs, overhead_steps, config.scheduler, seed))
    out.update(memory_footprint(variants, factory, live=num_envs, measure_all_live=measure_all_live))
    out.update(scheduler_coverage(config, draws=scheduler_draws, seed=seed))
    out.update(ray_speedup_and_recovery(variants, factory, num_envs, steps, seed, config))
    out["targets"] = dict(TARGETS)
    out["targets_met"] = {
        "semantic_overhead": out["semantic_overhead"] <= TARGETS["semantic_overhead"],
        "ray_speedup_2_workers": out["ray_speedup_2_workers"] >= TARGETS["ray_speedup_2_workers"],
        "catalogue_7200_mb": out["catalogue_7200_mb"] <= TARGETS["catalogue_7200_mb"],
        "live_300_mb": out["live_300_mb"] <= TARGETS["live_300_mb"],
        "recovery_s": out.get("recovery_s", float("inf")) <= TARGETS["recovery_s"],
        "throughput_after_5s_ratio": out.get("throughput_after_5s_ratio", 0.0) >= TARGETS["throughput_after_5s_ratio"],
    }
    out["notes"] = [
        "semantic_overhead: the raw side (physical envs, native actions, no mapping) and the adapter-only "
        "side (SemanticEnv in a SyncVectorEnv) replay the episodes the pool's scheduler started: same "
        "variants, episode seeds and actions (overhead_trajectory_match 1.0: every step's done flags "
        "matched). It splits into adapter_only_overhead and the pool's own share on top, "
        "pool_vs_semantic_vector (scheduler, slots, hang watchdog, infos).",
        "throughput_after_5s_ratio: env-steps/s in the 3 s from 5 s after the SIGKILL over the 3 s before it; "
        "the replacement standby starts 1.5 s after the loss and warms up at SCHED_IDLE priority.",
    ]
    out["wall_s"] = time.perf_counter() - started
    return out
