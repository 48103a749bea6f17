"""The in-process pool: the driver and its env workers in one process (tests, debugging, laptops).

Same slots, scheduling, autoreset and fault isolation as :class:`~agentflow_core.pool.ray_pool.RayPool`
(both are :class:`~agentflow_core.pool.driver.PoolDriver`); only the transport differs: workers
are plain objects called one after the other, so a worker can never be "lost". With
``pool.step_isolation: process`` each worker is a :class:`~agentflow_core.pool.process_host.ProcessWorker`
instead: the same EnvWorker in a child process, killed and replaced after a hung step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import EnvFactory, VariantLike, factory_vocabulary
from agentflow_core.pool.batch import WorkerBatch
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.process_host import ProcessWorker
from agentflow_core.pool.strategies import make_scheduler
from agentflow_core.pool.worker import EnvWorker


def default_scheduler(config: PoolConfig, n_variants: int, seed: int) -> Any:
    """The scheduler named in the pool config, seeded from the pool seed."""
    return make_scheduler(config.scheduler, n_variants, np.random.default_rng(seed), config)


def catalogue_slices(
    variants: Sequence[VariantLike], worker_of: np.ndarray, n_workers: int
) -> list[dict[int, VariantLike]]:
    """``{global variant index: spec}`` for each worker: the slice its envs come from."""
    slices: list[dict[int, VariantLike]] = [{} for _ in range(n_workers)]
    for i, (v, w) in enumerate(zip(variants, worker_of.tolist(), strict=True)):
        slices[w][i] = v
    return slices


class InProcessPool(PoolDriver):
    """``num_envs`` slots over ``config.num_workers`` (at least one) in-process env workers."""

    def __init__(
        self,
        variants: Sequence[VariantLike],
        factory: EnvFactory,
        num_envs: int,
        config: PoolConfig | None = None,
        scheduler: Any | None = None,
        seed: int = 0,
    ) -> None:
        config = config or PoolConfig()
        n_workers = max(config.num_workers, 1)
        super().__init__(
            variants,
            num_envs,
            config,
            scheduler if scheduler is not None else default_scheduler(config, len(variants), seed),
            n_workers,
            seed,
            factory_vocabulary(factory),
        )
        host = ProcessWorker if config.step_isolation == "process" else EnvWorker
        if config.step_isolation == "process":  # a child's hung step is handled by killing the child
            self.detach_after_s = None
        self.workers: list[Any] = [
            host(factory, part, config.max_live_per_worker, config.step_timeout_s, w)
            for w, part in enumerate(catalogue_slices(self.variants, self.worker_of, self.n_workers))
        ]

    def _invoke(self, calls: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, WorkerBatch | None]:
        if self.config.step_isolation == "process":  # every child starts before any answer is awaited
            pending = {w: self.workers[w].start(method, *args) for w, (method, args) in calls.items()}
            return {w: collect() for w, collect in pending.items()}
        return {w: getattr(self.workers[w], method)(*args) for w, (method, args) in calls.items()}

    def _worker_call(self, worker: int, method: str, *args: Any) -> Any:
        return getattr(self.workers[worker], method)(*args)

    def close(self) -> None:
        """Close every env of every worker."""
        for worker in self.workers:
            worker.close()
