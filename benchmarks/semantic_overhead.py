"""The pool's semantic overhead: its step cost with adapters and scheduler over the raw envs' step cost.

(pool step cost with adapters + scheduler) / (raw step cost) - 1, where the raw side is
``gymnasium.vector.SyncVectorEnv`` over thin envs that drive the same physical envs with
precomputed native actions and no semantic mapping. Both play the same episodes: the raw side
replays the variants and episode seeds the pool's scheduler picked, with the same actions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import gymnasium as gym
import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import EnvFactory, PoolBatch, VariantLike
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import CHECKOUT


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

    observation_space = gym.spaces.Box(-1.0, 1.0, shape=(CHECKOUT.obs_dim,), dtype=np.float32)
    action_space = gym.spaces.Discrete(CHECKOUT.n_actions)

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
        self._obs = np.zeros(CHECKOUT.obs_dim, dtype=np.float32)
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
            table = self._native[self.base_env_id] = [adapter.adapt_action(a) for a in range(CHECKOUT.n_actions)]
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


def drive(pool: PoolDriver, steps: int, rng: np.random.Generator, first_mask: np.ndarray) -> tuple[float, np.ndarray]:
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
    actions = rng.integers(0, CHECKOUT.n_actions, size=(warmup + block * blocks, n))
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
