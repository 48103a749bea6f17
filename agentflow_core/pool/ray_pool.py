"""The Ray-backed pool: env workers are Ray actors, one batched call per worker per round.

Each actor is an :class:`~agentflow_core.pool.worker.EnvWorker` owning the variants that
``stable_worker(env_id, n_workers)`` assigns to it. Actors ask for ``num_cpus=0``: they are
scheduled by count, not by CPU slot, so two workers plus the driver never deadlock a 2-CPU
Ray (an actor asking a whole CPU beyond the available ones never starts).

Failures: every ``ray.get`` is bounded by ``call_timeout_s`` (Ray never notices a hung actor).
A dead actor (``RayActorError``, e.g. SIGKILL) or one past the deadline counts as a lost worker:
Ray restarts it (``max_restarts``), the driver waits until it answers, closes the episodes it
held with ``failure_reason="worker_lost"`` and schedules its variants again. After
``PoolConfig.max_worker_restarts`` losses the pool raises :class:`PoolError`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from agentflow_core.config import PoolConfig, RayConfig
from agentflow_core.pool.base import EnvFactory, PoolError, VariantLike
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.inprocess import catalogue_slices, default_scheduler
from agentflow_core.pool.worker import EnvWorker, WorkerBatch

logger = logging.getLogger("agentflow.pool")


def ray_init_kwargs(ray_config: RayConfig) -> dict[str, Any]:
    """Join the cluster at ``address`` or start a small local Ray (the edge resolves RAY_ADDRESS)."""
    if ray_config.address:
        return {"address": ray_config.address, "ignore_reinit_error": True}
    return {"num_cpus": ray_config.num_cpus, "include_dashboard": ray_config.include_dashboard,
            "object_store_memory": ray_config.object_store_mb * 1024 * 1024, "ignore_reinit_error": True,
            "log_to_driver": False}


def ensure_ray(ray_config: RayConfig | None = None) -> None:
    """Start or join Ray once per process."""
    import ray

    if not ray.is_initialized():
        ray.init(**ray_init_kwargs(ray_config or RayConfig()))


class RayPool(PoolDriver):
    """``num_envs`` slots over ``config.num_workers`` Ray actors (same semantics as InProcessPool)."""

    def __init__(self, variants: Sequence[VariantLike], factory: EnvFactory, num_envs: int,
                 config: PoolConfig | None = None, scheduler: Any | None = None, seed: int = 0,
                 ray_config: RayConfig | None = None, call_timeout_s: float | None = None,
                 restart_timeout_s: float = 60.0) -> None:
        import ray

        config = config or PoolConfig()
        ensure_ray(ray_config)
        super().__init__(variants, num_envs, config,
                         scheduler if scheduler is not None else default_scheduler(config, len(variants), seed),
                         max(config.num_workers, 1), seed)
        # A batch can hold a few hung envs, each costing one step timeout inside the worker.
        self.call_timeout_s = call_timeout_s if call_timeout_s is not None else 4 * config.step_timeout_s + 10.0
        self.restart_timeout_s = restart_timeout_s
        self._actor_cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(EnvWorker)
        # Constructor arguments live in the object store under refs this pool holds: a restarted
        # actor re-reads them, and Ray frees an argument once no one references it.
        factory_ref = ray.put(factory)
        self._actor_args = [(factory_ref, ray.put(part), config.max_live_per_worker, config.step_timeout_s, w)
                            for w, part in enumerate(catalogue_slices(self.variants, self.worker_of, self.n_workers))]
        self.actors = [self._actor_cls.remote(*args) for args in self._actor_args]
        ray.get([a.ping.remote() for a in self.actors], timeout=restart_timeout_s)
        self.loss_events: list[dict[str, float]] = []

    # ------------------------------------------------------------------ transport
    def _invoke(self, calls: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, WorkerBatch | None]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        refs = {w: getattr(self.actors[w], method).remote(*args) for w, (method, args) in calls.items()}
        deadline = time.monotonic() + self.call_timeout_s
        out: dict[int, WorkerBatch | None] = {}
        for w, ref in refs.items():
            try:
                out[w] = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.001))
            except (RayActorError, GetTimeoutError) as exc:
                self._recover(w, exc)
                out[w] = None
        return out

    def _worker_call(self, worker: int, method: str, *args: Any) -> Any:
        import ray

        return ray.get(getattr(self.actors[worker], method).remote(*args), timeout=self.call_timeout_s)

    def _recover(self, worker: int, error: BaseException) -> None:
        """Count the loss, make sure the actor restarts, and wait until it answers again."""
        import ray
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        detected = time.monotonic()
        self._worker_lost(worker, error)  # raises PoolError past max_worker_restarts
        if isinstance(error, GetTimeoutError):  # hung: kill it so Ray restarts it
            ray.kill(self.actors[worker], no_restart=False)
        deadline = detected + self.restart_timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get(self.actors[worker].ping.remote(), timeout=max(deadline - time.monotonic(), 0.001))
                break
            except ActorDiedError:  # Ray gave up on it (e.g. its constructor failed): build a fresh one
                ray.kill(self.actors[worker], no_restart=True)
                self.actors[worker] = self._actor_cls.remote(*self._actor_args[worker])
            except RayActorError:  # still restarting
                time.sleep(0.02)
            except GetTimeoutError:
                break
        else:
            raise PoolError(f"worker {worker} did not come back within {self.restart_timeout_s} s")
        self.loss_events.append({"worker": worker, "detected_at": detected, "restored_at": time.monotonic()})
        logger.warning("pool: worker %d answering again after %.2f s", worker, time.monotonic() - detected)

    # ------------------------------------------------------------------ extras
    def worker_pids(self) -> list[int]:
        """OS pids of the worker actors (fault tests and the recovery benchmark kill one)."""
        import ray

        return ray.get([a.pid.remote() for a in self.actors], timeout=self.call_timeout_s)

    def close(self) -> None:
        """Close the envs and end the actors (no restart)."""
        import ray

        for actor in self.actors:
            try:
                ray.get(actor.close.remote(), timeout=self.call_timeout_s)
            except Exception:  # a dead or hung actor is killed below anyway
                logger.debug("pool: close() of a worker failed", exc_info=True)
            ray.kill(actor, no_restart=True)
        self.actors = []
