"""One place that wires a phase: its pools and rollouts, its reward function and its base-env infos.

Calibration, exploration, training (whose env workers also play its held-out evaluations), stress
validation, the report's champion/challenger rollouts and the benchmarks all build their pools
here, from ``params.yaml``, on the configured backend (:mod:`tasks.backend`: Ray actors on the Ray
of :mod:`tasks.ray_runtime`, or workers in this process). Training collects its rollouts
worker-side (:func:`build_rollouts`): each env worker runs its own slots for a whole rollout and
returns them in one call. Calibration runs its per-variant checks as chunks on the same backend
(:func:`map_chunks`).
"""

from __future__ import annotations

import hashlib
import importlib
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from agentflow_core.config import PoolConfig
from agentflow_core.contracts import EnvPool
from agentflow_core.envs.experts import ScriptedExpert
from agentflow_core.pool.base import RegistryEnvFactory
from agentflow_core.rl.reward import RewardFunction
from agentflow_core.rl.reward_model import RewardModelClient
from agentflow_core.variants import BaseEnvInfo, VariantSpec
from tasks.context import PhaseContext

if TYPE_CHECKING:  # the rollout module imports torch: a command imports it when it trains, not at start-up
    from agentflow_core.pool.rollout import SlicedRollouts

T = TypeVar("T")
R = TypeVar("R")


def env_factory(ctx: PhaseContext, variants: Sequence[VariantSpec]) -> RegistryEnvFactory:
    """The picklable factory building the variants' envs from their registry entries."""
    return RegistryEnvFactory({b: ctx.registry.get(b) for b in sorted({v.base_env_id for v in variants})})


class PoolFactory(Protocol):
    """The signature of :func:`build_pool` (steps take one, so a test can hand them a pool over its own envs)."""

    def __call__(
        self,
        ctx: PhaseContext,
        variants: Sequence[VariantSpec],
        num_envs: int,
        *,
        seed: int,
        scheduler: str | None = None,
        standby: bool = True,
    ) -> EnvPool:
        """A pool of ``num_envs`` slots over ``variants``, as :func:`build_pool` builds it."""


def build_pool(
    ctx: PhaseContext,
    variants: Sequence[VariantSpec],
    num_envs: int,
    *,
    seed: int,
    scheduler: str | None = None,
    standby: bool = True,
) -> EnvPool:
    """A pool of ``num_envs`` slots over ``variants`` on the configured backend.

    ``scheduler`` overrides ``pool.scheduler`` (evaluations use ``round_robin``: equal episodes per
    variant). ``standby=False`` skips the Ray pool's warm spare worker (short-lived pools).
    """
    pool = ctx.cfg.pool
    pool_cfg: PoolConfig = pool if scheduler is None else pool.model_copy(update={"scheduler": scheduler})
    factory = env_factory(ctx, variants)
    num_envs = min(num_envs, max(len(variants), 1)) if scheduler == "round_robin" else num_envs
    return ctx.backend.pool(variants, factory, num_envs, pool_cfg, seed=seed, standby=standby)


def build_rollouts(
    ctx: PhaseContext,
    variants: Sequence[VariantSpec],
    num_envs: int,
    *,
    seed: int,
    eval_variants: Sequence[VariantSpec] = (),
) -> SlicedRollouts:
    """Training's rollout source: worker-side rollouts over ``num_envs`` slots on the configured backend.

    Each env worker runs its share of the slots for a whole rollout with a copy of the policy (Ray
    actors in parallel, or one after the other in this process) and returns it in one call. The
    same workers play training's validation and test episodes (:meth:`SlicedRollouts.evaluate`),
    so their env factory also covers ``eval_variants``' base envs; no evaluation pool is started.
    """
    from agentflow_core.pool.rollout import SlicedRollouts

    factory = env_factory(ctx, [*variants, *eval_variants])
    slices = ctx.backend.slices(variants, factory, num_envs, seed=seed)
    return SlicedRollouts(slices, variants, num_envs, ctx.cfg.pool, seed=seed)


@contextmanager
def reward_function(ctx: PhaseContext, num_envs: int) -> Iterator[RewardFunction]:
    """The configured training reward over ``num_envs`` slots (its reward-model client closed on exit)."""
    rc = ctx.cfg.train.reward
    client = RewardModelClient(rc.model_url, rc.model_timeout_s) if rc.mode == "model" and rc.model_url else None
    try:
        yield RewardFunction(rc, num_envs, client, vocabulary=ctx.vocabulary)
    finally:
        if client is not None:
            client.close()


def base_env_infos(ctx: PhaseContext) -> list[BaseEnvInfo]:
    """(env id, family, version) of every base env the catalogue is generated from."""
    return [BaseEnvInfo(e.env_id, e.family, e.version) for e in map(ctx.registry.get, ctx.cfg.variants.base_envs)]


def expert_policy_hash(expert: ScriptedExpert) -> str:
    """A stable id of the scripted expert's rules (the policy that generated the rows)."""
    text = repr([(token, int(action)) for token, action in expert.rules])
    return "expert-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def reachable_tokens(class_paths: Collection[str], tokens: Sequence[str]) -> list[str]:
    """Tokens some env family of the catalogue can reach: its ``RAW_STATES`` tokens less its ``UNREACHABLE_TOKENS``.

    ``RAW_STATES`` lists every token the family's mapping can emit; ``UNREACHABLE_TOKENS`` declares
    (with the reason) those that no semantic action leads to. All tokens if no family declares any.
    """
    found: set[str] = set()
    for class_path in class_paths:
        module = importlib.import_module(class_path.split(":")[0])
        unreachable = set(getattr(module, "UNREACHABLE_TOKENS", {}))
        for _raw, token in getattr(module, "RAW_STATES", ()):
            if token in tokens and token not in unreachable:
                found.add(token)
    return sorted(found) or list(tokens)


def unreachable_tokens(class_paths: Collection[str], tokens: Sequence[str]) -> dict[str, str]:
    """Declared unreachable tokens (with reasons) that no family of the catalogue reaches."""
    reachable = set(reachable_tokens(class_paths, tokens))
    out: dict[str, str] = {}
    for class_path in sorted(class_paths):
        module = importlib.import_module(class_path.split(":")[0])
        for token, reason in getattr(module, "UNREACHABLE_TOKENS", {}).items():
            if token not in reachable:
                out.setdefault(token, f"{class_path.split(':')[0]}: {reason}")
    return out


def map_chunks(
    ctx: PhaseContext,
    fn: Callable[[list[T]], list[R]],
    items: Sequence[T],
    progress: Callable[[int, int], None] | None = None,
) -> list[R]:
    """``fn`` over ``items`` in one chunk per env worker, on the configured backend; results in order.

    For work that is per-item rather than per-step (calibration's repeated episodes per variant).
    ``progress(done items, total)`` is called as chunks finish.
    """
    n = max(ctx.cfg.pool.num_workers, 1)
    chunks = [list(items[i::n]) for i in range(n)]
    done = 0

    def on_done(index: int) -> None:
        nonlocal done
        done += len(chunks[index])
        if progress is not None:
            progress(done, len(items))

    results = ctx.backend.map_chunks(fn, chunks, on_done)
    out: list[R | None] = [None] * len(items)
    for i, chunk_results in enumerate(results):
        for j, value in enumerate(chunk_results):
            out[i + j * n] = value
    return out  # type: ignore[return-value]


def recovery_summary(pool: EnvPool | SlicedRollouts) -> dict[str, Any]:
    """A pool's worker losses and their cost: restarts, per-loss recovery time, episodes and steps lost.

    Worker-side rollouts add how long each worker stepped its slice in every rollout (workers in
    ``rollout_workers`` order) and the rollouts in which a worker was lost: whether a replacement
    runs at the speed of the worker it replaced shows against the others in the same rollouts."""
    from agentflow_core.pool import rollout

    stats = pool.stats()
    summary = {
        "worker_restarts": int(stats["worker_restarts"]),
        "episodes_lost": int(stats["worker_lost"]),
        "steps_lost": int(stats["steps_lost"]),
        "recoveries": stats["recoveries"],
        "nodes_used": stats.get("nodes_used", []),  # Ray node ids (the in-process pool has none)
        "workers_started_ahead": int(stats.get("started_ahead", 0)),  # started with Ray (ray_runtime.LocalRayStart)
    }
    if isinstance(pool, rollout.SlicedRollouts):
        summary["rollout_workers"] = list(pool.slots)
        summary["worker_rollout_s"] = pool.worker_rollout_s
        summary["lost_in_rollouts"] = pool.lost_in_rollouts
    return summary
