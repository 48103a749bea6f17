"""Where a phase's envs run: the pool backend, chosen once from ``pool.backend``.

- ``pool.backend: ray`` (the default whenever ``pool.num_workers > 0``): env workers are Ray
  actors (:class:`~agentflow_core.pool.ray_pool.RayPool`) on the Ray of :mod:`tasks.ray_runtime`,
  and per-item work runs as Ray tasks;
- ``pool.backend: inprocess``: the same driver with its workers in this process
  (:class:`~agentflow_core.pool.inprocess.InProcessPool`), per-item work one chunk after another.

Both backends run the same scheduler, slots and episode seeds, so a phase gives the same records
on either. :func:`backend_of` is the one place that reads ``pool.backend``; everything else asks the
:class:`Backend` it returns for pools, worker-side rollouts and chunked maps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from agentflow_core.config import AgentFlowConfig, PoolConfig
from agentflow_core.contracts import EnvPool
from agentflow_core.pool.base import RegistryEnvFactory
from agentflow_core.variants import VariantSpec
from tasks.ray_runtime import LOCAL_RAY, ray_cores, start_ray

if TYPE_CHECKING:  # these modules import torch: a command imports them when it trains, not at start-up
    from agentflow_core.pool.rollout import SliceBackend
    from agentflow_core.tuning import Cores

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Placement:
    """Where a run's envs are stepped: what ``agentflow run`` prints and logs to MLflow."""

    name: str  # "ray" | "inprocess"
    address: str  # "local", a cluster address, or "this process"
    num_workers: int
    nodes: int

    def describe(self, num_envs: int) -> str:
        """One line for the terminal, e.g. ``ray (local), 2 workers x 16 envs, 1 node``."""
        per_worker = num_envs / max(self.num_workers, 1)
        where = f"{self.name} ({self.address})"
        return f"{where}, {max(self.num_workers, 1)} workers x {per_worker:g} envs, {self.nodes} node(s)"

    def params(self, num_envs: int) -> dict[str, str]:
        """The same facts as MLflow params/tags."""
        return {
            "pool.backend": self.name,
            "pool.address": self.address,
            "pool.workers": str(max(self.num_workers, 1)),
            "pool.envs_per_worker": f"{num_envs / max(self.num_workers, 1):g}",
            "pool.nodes": str(self.nodes),
        }


class Backend(Protocol):
    """Builds a phase's pools, worker-side rollouts and chunked maps on one kind of worker."""

    @property
    def cfg(self) -> AgentFlowConfig:
        """The run configuration the backend was chosen from."""

    def place(self) -> Placement:
        """Get the workers' home ready (join a cluster now, or begin a local start) and say where it is."""

    def pool(
        self,
        variants: Sequence[VariantSpec],
        factory: RegistryEnvFactory,
        num_envs: int,
        pool_cfg: PoolConfig,
        *,
        seed: int,
        standby: bool,
    ) -> EnvPool:
        """A pool of ``num_envs`` slots over ``variants`` (``standby``: a warm spare worker, where there is one)."""

    def slices(
        self, variants: Sequence[VariantSpec], factory: RegistryEnvFactory, num_envs: int, *, seed: int
    ) -> SliceBackend:
        """The env workers that run worker-side rollouts, each its share of the ``num_envs`` slots."""

    def map_chunks(
        self, fn: Callable[[list[T]], list[R]], chunks: list[list[T]], on_done: Callable[[int], None]
    ) -> list[list[R]]:
        """``fn`` over every chunk, results in chunk order; ``on_done(chunk index)`` as each chunk finishes."""

    def cores(self) -> Cores:
        """The CPUs the env workers can use: the auto-tuner sizes the worker count from them."""


@dataclass(frozen=True)
class InProcessBackend:
    """Env workers in this process; per-item work one chunk after another."""

    cfg: AgentFlowConfig

    def place(self) -> Placement:
        """This process, with as many (sequential) env workers as configured."""
        return Placement("inprocess", "this process", max(self.cfg.pool.num_workers, 1), 1)

    def pool(
        self,
        variants: Sequence[VariantSpec],
        factory: RegistryEnvFactory,
        num_envs: int,
        pool_cfg: PoolConfig,
        *,
        seed: int,
        standby: bool,
    ) -> EnvPool:
        """An :class:`~agentflow_core.pool.inprocess.InProcessPool` (it has no standby worker)."""
        from agentflow_core.pool.inprocess import InProcessPool

        return InProcessPool(variants, factory, num_envs, pool_cfg, seed=seed)

    def slices(
        self, variants: Sequence[VariantSpec], factory: RegistryEnvFactory, num_envs: int, *, seed: int
    ) -> SliceBackend:
        """The in-process pool's workers, running their slices one after the other."""
        from agentflow_core.pool.inprocess import InProcessPool
        from agentflow_core.pool.rollout import InProcessSlices

        return InProcessSlices(InProcessPool(variants, factory, num_envs, self.cfg.pool, seed=seed))

    def map_chunks(
        self, fn: Callable[[list[T]], list[R]], chunks: list[list[T]], on_done: Callable[[int], None]
    ) -> list[list[R]]:
        """Each chunk here, in order."""
        results = []
        for i, chunk in enumerate(chunks):
            results.append(fn(chunk))
            on_done(i)
        return results

    def cores(self) -> Cores:
        """One: the env workers take turns in this process."""
        from agentflow_core.tuning import Cores

        return Cores(logical=1, usable=1, detail="inprocess backend")


@dataclass(frozen=True)
class RayBackend:
    """Env workers as Ray actors; per-item work as Ray tasks spread over the nodes."""

    cfg: AgentFlowConfig

    def place(self) -> Placement:
        """Join the cluster (a bad address fails here, early) or begin a private local Ray on a helper
        thread, with the env workers of the command's first pool (the first pool waits for it)."""
        cluster = start_ray(self.cfg, wait=False, blank_workers=self.cfg.pool.num_workers > 0)
        return Placement("ray", cluster.address, self.cfg.pool.num_workers, cluster.nodes)

    def pool(
        self,
        variants: Sequence[VariantSpec],
        factory: RegistryEnvFactory,
        num_envs: int,
        pool_cfg: PoolConfig,
        *,
        seed: int,
        standby: bool,
    ) -> EnvPool:
        """A :class:`~agentflow_core.pool.ray_pool.RayPool`, taking the env workers started with Ray if any."""
        from agentflow_core.pool.ray_pool import RayPool

        start_ray(self.cfg)
        standby_workers = 1 if standby else 0
        return RayPool(
            variants, factory, num_envs, pool_cfg, seed=seed, standby_workers=standby_workers, blank=LOCAL_RAY.claim()
        )

    def slices(
        self, variants: Sequence[VariantSpec], factory: RegistryEnvFactory, num_envs: int, *, seed: int
    ) -> SliceBackend:
        """A Ray pool (with a standby worker) whose actors run their slices in parallel."""
        from agentflow_core.pool.ray_pool import RayPool

        start_ray(self.cfg)
        return RayPool(
            variants, factory, num_envs, self.cfg.pool, seed=seed, standby_workers=1, blank=LOCAL_RAY.claim()
        )

    def map_chunks(
        self, fn: Callable[[list[T]], list[R]], chunks: list[list[T]], on_done: Callable[[int], None]
    ) -> list[list[R]]:
        """One Ray task per chunk (no CPU reserved, spread over the nodes)."""
        import ray

        start_ray(self.cfg)
        remote = ray.remote(num_cpus=0, scheduling_strategy="SPREAD")(fn)
        refs = [remote.remote(chunk) for chunk in chunks]
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            on_done(refs.index(ready[0]))
        return list(ray.get(refs))

    def cores(self) -> Cores:
        """Ray's logical CPUs and the cores that can run at once (:func:`tasks.ray_runtime.ray_cores`)."""
        return ray_cores(self.cfg)


def backend_of(cfg: AgentFlowConfig) -> Backend:
    """The configured backend (``pool.backend``)."""
    if cfg.pool.backend == "inprocess":
        return InProcessBackend(cfg)
    return RayBackend(cfg)
