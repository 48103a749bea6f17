"""The Ray-backed pool: env workers are Ray actors, one batched call per worker per round.

Each actor is an :class:`~agentflow_core.pool.worker.EnvWorker` owning the variants that
``stable_worker(env_id, n_workers)`` assigns to it. Actors ask for ``num_cpus=0``: they are
scheduled by count, not by CPU slot, so two workers plus the driver never deadlock a 2-CPU
Ray (an actor asking a whole CPU beyond the available ones never starts). Placement is explicit:
worker ``i`` is pinned to the ``i``-th alive node that offers CPUs (round robin, the driver's node
first; a head started with ``--num-cpus=0`` gets none). Ray's own hints did not place them: on a
two-node cluster ``SPREAD`` and a *soft* node affinity both put every worker on one node now and
then (measured with Ray 2.60). A worker whose node dies cannot come back there; it is replaced
like any lost worker, and replacements (standbys, rebuilt actors) prefer the first alive CPU node.

Failures: every call is bounded by ``call_timeout_s`` (Ray never notices a hung actor); with a
``step_patience_s`` engaged from the first step (``step_patience_engages: always``) a step call by
``stuck_after_s`` (the step timeout plus a margin: the worker's
watchdog answers without its stuck envs, so an actor that does not is stuck in a C call holding its
GIL, which no thread can interrupt, and is killed and replaced by the standby). A dead
actor counts as a lost worker as soon as the driver sees it: Ray's own report
(``RayActorError``) takes ~1.2 s, so while waiting on a call the driver also polls the actor's
process (same host only: pid + start time since boot, which no clock step moves) and treats a vanished or zombie process
as dead at once, and one stopped (SIGSTOP) for ``stop_grace_s`` as hung: it is killed and replaced
instead of holding the pool for the call timeout. A lost (dead or hung) worker is replaced by a *standby* actor started ahead of
time, already warmed with idle envs of every base env (:meth:`~agentflow_core.pool.ray_actors.RayEnvWorker.prewarm_standby`, at
idle CPU priority so that it takes no CPU the running workers want): it adopts the
lost worker's catalogue slice in one call and serves the slots at once by re-targeting those envs,
instead of a cold process importing everything and building ~150 envs. A new standby is started
``standby_delay_s`` later (so its start-up does not compete with the recovery). Without a standby
Ray restarts the actor itself (``max_restarts``) and the driver waits for it. Either way the
episodes it held close with ``failure_reason="worker_lost"`` and its variants are scheduled
again. After ``PoolConfig.max_worker_restarts`` losses the pool raises :class:`PoolError`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

from agentflow_core.config import PoolConfig
from agentflow_core.pool.base import EnvFactory, InFlight, PoolError, VariantLike, factory_vocabulary
from agentflow_core.pool.driver import PoolDriver
from agentflow_core.pool.inprocess import catalogue_slices, default_scheduler
from agentflow_core.pool.ray_actors import BlankWorkers, cpu_nodes, host_id, worker_class
from agentflow_core.procs import start_time

if TYPE_CHECKING:  # the rollout module pulls in torch: actors import it on their first rollout (or standby warm-up)
    from agentflow_core.pool.episodes import EpisodeRecord, EvalRequest
    from agentflow_core.pool.slices import SliceRequest, SliceResult, Weights

logger = logging.getLogger("agentflow.pool")


def _lost_errors(timeout: bool = False) -> tuple[type[BaseException], ...]:
    """What a call on a gone actor raises: dead or restarting (RayActorError), pinned to a dead node,
    and with ``timeout`` no answer in time (GetTimeoutError)."""
    from ray.exceptions import ActorUnschedulableError, GetTimeoutError, RayActorError

    return (
        (RayActorError, ActorUnschedulableError, GetTimeoutError)
        if timeout
        else (RayActorError, ActorUnschedulableError)
    )


@dataclass(frozen=True)
class _Calls:
    """Calls sent to some workers, not yet answered: the workers in order, their refs, the deadline."""

    workers: list[int]
    pending: dict[int, Any]
    timeout_s: float
    deadline: float


class WorkerProcessGone(RuntimeError):
    """The driver saw a worker's process vanish before Ray reported the actor dead."""


class RayPool(PoolDriver):
    """``num_envs`` slots over ``config.num_workers`` Ray actors (same semantics as InProcessPool)."""

    def __init__(
        self,
        variants: Sequence[VariantLike],
        factory: EnvFactory,
        num_envs: int,
        config: PoolConfig | None = None,
        scheduler: Any | None = None,
        seed: int = 0,
        call_timeout_s: float | None = None,
        restart_timeout_s: float = 60.0,
        standby_workers: int = 1,
        standby_delay_s: float = 1.5,
        poll_s: float = 0.02,
        stop_grace_s: float = 0.5,
        blank: BlankWorkers | None = None,
    ) -> None:
        import ray

        config = config or PoolConfig()
        if not ray.is_initialized():
            raise PoolError("RayPool needs a running Ray: ray.init() first (tasks.compose.start_ray does)")
        super().__init__(
            variants,
            num_envs,
            config,
            scheduler if scheduler is not None else default_scheduler(config, len(variants), seed),
            max(config.num_workers, 1),
            seed,
            factory_vocabulary(factory),
        )
        # A batch can hold a few hung envs, each costing one step timeout inside the worker.
        self.call_timeout_s = call_timeout_s if call_timeout_s is not None else 4 * config.step_timeout_s + 10.0
        # With a patience engaged from the first step the worker's watchdog answers a step call without its
        # stuck envs (detached or ended at the patience); one that has not answered after a step timeout plus
        # a margin is stuck as a whole (a C call holding its GIL): it is killed and replaced, not waited for
        # to the call timeout.
        self.stuck_after_s = min(config.step_timeout_s + max(config.step_timeout_s, 2.0), self.call_timeout_s)
        self.restart_timeout_s = restart_timeout_s
        self.standby_workers, self.standby_delay_s, self.poll_s = (
            int(standby_workers),
            float(standby_delay_s),
            float(poll_s),
        )
        self._actor_cls = worker_class()
        # Constructor arguments live in the object store under refs this pool holds: a restarted
        # actor re-reads them, and Ray frees an argument once no one references it.
        self._factory_ref = ray.put(factory)
        self._actor_args = [
            (self._factory_ref, ray.put(part), config.max_live_per_worker, config.step_timeout_s, w)
            for w, part in enumerate(catalogue_slices(self.variants, self.worker_of, self.n_workers))
        ]
        nodes = cpu_nodes()
        # Blank workers started ahead, on one node, building these envs: the first adopt the workers'
        # slices (one lost later is rebuilt afresh: they have no restarts), the next become standbys.
        taken: list[Any] = []
        if blank is not None:
            if len(nodes) <= 1 and blank.fit(factory, config.max_live_per_worker, config.step_timeout_s):
                taken, blank.actors = blank.actors, blank.actors[len(self._actor_args) + self.standby_workers :]
            blank.kill()  # those not taken
        as_workers = taken[: len(self._actor_args)]
        as_standbys = taken[len(self._actor_args) : len(self._actor_args) + self.standby_workers]
        self.started_ahead = len(as_workers) + len(as_standbys)
        self.actors: list[Any] = []
        for w, args in enumerate(self._actor_args):
            if w < len(as_workers):
                self.actors.append(as_workers[w])
                as_workers[w].adopt.remote(args[1], w)
            else:
                self.actors.append(self._new_actor(*args, node=nodes[w % len(nodes)] if nodes else None))
        self._host = host_id()
        self.stop_grace_s = float(stop_grace_s)
        self._stopped_since: dict[int, float] = {}  # worker -> when its process was first seen stopped
        self.nodes_used: set[str] = set()  # Ray node ids that hosted a worker of this pool, ever
        # Where each actor runs, asked now and read on first use: the actors start up (and import
        # torch, warm_up) while the driver goes on (a training run's behaviour cloning, say).
        self._procs: list[tuple[int, float] | None] = [None] * len(self.actors)
        self._located: list[Any] | None = [a.locate.remote() for a in self.actors]
        for actor in self.actors:
            actor.warm_up.remote()
        self._prewarm_ref = ray.put(self._prewarm_sample(factory, num_envs))
        self._standby: list[Any] = []
        self._standby_warm: list[Any] = []  # refs of the standbys' prewarm calls
        for actor in as_standbys:
            self._standby_warm.append(actor.prewarm_standby.remote(self._prewarm_ref))
            self._standby.append(actor)
        self._standby_due: float | None = time.monotonic() if self.standby_workers > 0 else None
        self._maybe_start_standby()

    # ------------------------------------------------------------------ standby workers
    def _prewarm_sample(self, factory: EnvFactory, num_envs: int) -> dict[int, VariantLike]:
        """Variants a standby pre-builds: a lost worker's share of the slots (+25 %), spread over the
        catalogue; one per base env when the factory cannot re-target envs (imports warmed only)."""
        if callable(getattr(factory, "reuse", None)):
            n = min(math.ceil(1.25 * num_envs / self.n_workers), self.config.max_live_per_worker, len(self.variants))
            picks = np.unique(np.linspace(0, len(self.variants) - 1, n).astype(np.int64)).tolist()
        else:
            firsts: dict[str, int] = {}
            for i, v in enumerate(self.variants):
                firsts.setdefault(v.base_env_id, i)
            picks = sorted(firsts.values())
        return {i: self.variants[i] for i in picks}

    def _maybe_start_standby(self) -> None:
        """Start the missing standby actors once their start is due (never during a recovery)."""
        if self._standby_due is None or time.monotonic() < self._standby_due:
            return
        self._standby_due = None
        while len(self._standby) < self.standby_workers:
            actor = self._new_actor(
                self._factory_ref, {}, self.config.max_live_per_worker, self.config.step_timeout_s, -1, max_restarts=0
            )
            # runs in the background; adopt() queues behind it
            self._standby_warm.append(actor.prewarm_standby.remote(self._prewarm_ref))
            self._standby.append(actor)

    def wait_standby(self, timeout_s: float | None = None) -> int:
        """Block until every started standby has warmed up; returns the number ready.

        Benchmarks call it before timing, so a standby's one-off start-up is not measured as
        steady-state throughput. A standby that failed to start is dropped (a lost worker then
        falls back to Ray's own restart).
        """
        import ray

        ready = 0
        for actor, ref in list(zip(self._standby, self._standby_warm, strict=True)):
            try:
                ray.get(ref, timeout=timeout_s if timeout_s is not None else self.restart_timeout_s)
                ready += 1
            except Exception as exc:  # a standby is optional: log it and go on without it
                logger.warning("pool: standby worker failed to warm up (%s); dropped", type(exc).__name__)
                self._standby.remove(actor)
                self._standby_warm.remove(ref)
                ray.kill(actor, no_restart=True)
        return ready

    def _new_actor(self, *args: Any, node: str | None = None, max_restarts: int = -1) -> Any:
        """Start an env-worker actor: pinned to ``node`` (the pool's first placement), else a replacement
        that prefers the first alive CPU node (the driver's own, when it offers CPUs)."""
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        if node is not None:
            strategy: Any = NodeAffinitySchedulingStrategy(node, soft=False)
        else:
            nodes = cpu_nodes()
            strategy = NodeAffinitySchedulingStrategy(nodes[0], soft=True) if nodes else "DEFAULT"
        return self._actor_cls.options(scheduling_strategy=strategy, max_restarts=max_restarts).remote(*args)

    def _locate(self, actor: Any, ref: Any = None) -> tuple[int, float] | None:
        """(pid, start time) of an actor's process when it runs on this host, else None (no polling)."""
        import ray

        ref = actor.locate.remote() if ref is None else ref
        host, pid, started, node = ray.get(ref, timeout=self.restart_timeout_s)
        self.nodes_used.add(str(node))
        return (int(pid), float(started)) if host == self._host else None

    def _settle(self) -> None:
        """Read the first placement's answers (asked in the constructor) before the workers are first used."""
        located, self._located = self._located, None
        if located is not None:
            self._procs = [self._locate(a, ref) for a, ref in zip(self.actors, located, strict=True)]

    def _alive(self, worker: int) -> bool:
        """False when the worker's process is gone (vanished, zombie or pid reused) or stopped.

        A process stopped (SIGSTOP, ``T`` state) for ``stop_grace_s`` would hold its call until the
        call timeout: it is killed here (SIGKILL) and counted lost like a vanished one.
        """
        proc = self._procs[worker]
        if proc is None:
            return True
        try:
            p = psutil.Process(proc[0])
            status = p.status()
            if status == psutil.STATUS_ZOMBIE or abs(start_time(p.pid) - proc[1]) >= 1e-3:
                return False
            if status not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
                self._stopped_since.pop(worker, None)
                return True
            since = self._stopped_since.setdefault(worker, time.monotonic())
            if time.monotonic() - since < self.stop_grace_s:
                return True
            logger.error("pool: worker %d process %d stopped for %.2f s; killing it", worker, p.pid, self.stop_grace_s)
            p.kill()
            self._stopped_since.pop(worker, None)
            return False
        except psutil.NoSuchProcess:
            return False

    # ------------------------------------------------------------------ transport
    def _invoke(
        self, calls: dict[int, tuple[str, tuple[Any, ...]]], timeout_s: float | None = None
    ) -> dict[int, Any | None]:
        return self._gather(self._submit(calls, timeout_s))

    def _submit(self, calls: dict[int, tuple[str, tuple[Any, ...]]], timeout_s: float | None = None) -> _Calls:
        """Send one call per worker now; :meth:`_gather` waits for the answers (and recovers lost workers)."""
        self._settle()
        self._maybe_start_standby()
        pending = {w: getattr(self.actors[w], method).remote(*args) for w, (method, args) in calls.items()}
        if timeout_s is None:
            # A patience engaged only after a timeout (the default) leaves a worker waiting for every step
            # until then, so its call may take as long as without one: the call timeout applies.
            patient = (
                self.detach_after_s is not None
                and self.config.step_patience_engages == "always"
                and all(m == "step" for m, _ in calls.values())
            )
            timeout_s = self.stuck_after_s if patient else self.call_timeout_s
        return _Calls(list(calls), pending, timeout_s, time.monotonic() + timeout_s)

    def _gather(self, sent: _Calls) -> dict[int, Any | None]:
        import ray
        from ray.exceptions import GetTimeoutError

        pending, timeout_s, deadline = dict(sent.pending), sent.timeout_s, sent.deadline
        out: dict[int, Any | None] = {}
        while pending:
            ready, _ = ray.wait(
                list(pending.values()),
                num_returns=len(pending),
                timeout=min(self.poll_s, max(deadline - time.monotonic(), 0.0)),
            )
            done = set(ready)
            for w, ref in list(pending.items()):
                error: BaseException | None = None
                if ref in done:
                    try:
                        out[w] = ray.get(ref)
                    except _lost_errors() as exc:
                        error = exc
                elif not self._alive(w):
                    error = WorkerProcessGone(f"worker {w}: process {self._procs[w]} is gone")
                elif time.monotonic() >= deadline:
                    error = GetTimeoutError(f"worker {w}: no answer within {timeout_s} s")
                else:
                    continue
                del pending[w]
                if error is not None:
                    self._recover(w, error)
                    out[w] = None
        return {w: out[w] for w in sent.workers}

    def run_rollouts(self, requests: Mapping[int, SliceRequest], weights: Weights) -> dict[int, SliceResult | None]:
        """Every worker runs its rollout slice, in parallel, the weights put in the object store once.

        A lost worker is replaced as in a pool step (standby first) and answers ``None``; the caller
        runs its slice again. A hung one is given up on after ``call_timeout_s`` plus one step
        timeout per step of the rollout (each step may hold one hung env).
        """
        return self.submit_rollouts(requests, weights).result()

    def submit_rollouts(
        self, requests: Mapping[int, SliceRequest], weights: Weights
    ) -> InFlight[dict[int, SliceResult | None]]:
        """:meth:`run_rollouts` sent now and waited for at ``result()``: the driver works meanwhile."""
        import ray

        ref = ray.put(weights)
        steps = max((r.n_steps for r in requests.values()), default=0)
        calls = {w: ("rollout", (request, ref)) for w, request in requests.items()}
        sent = self._submit(calls, timeout_s=self.call_timeout_s + steps * self.config.step_timeout_s)
        return InFlight(lambda: self._gather(sent))

    def run_evaluations(
        self, requests: Mapping[int, EvalRequest], weights: Weights | None
    ) -> dict[int, list[EpisodeRecord] | None]:
        """Every worker plays its evaluation episodes, in parallel (weights put once); lost ones answer ``None``.

        A hung one is given up on after ``call_timeout_s`` plus one step timeout per episode (each
        episode may hold one hung env).
        """
        import ray

        ref = None if weights is None else ray.put(weights)
        episodes = max((len(r.episodes) for r in requests.values()), default=0)
        calls = {w: ("evaluate", (request, ref)) for w, request in requests.items()}
        return self._invoke(calls, timeout_s=self.call_timeout_s + episodes * self.config.step_timeout_s)

    def _worker_call(self, worker: int, method: str, *args: Any) -> Any:
        """One call; a worker lost meanwhile is recovered like in a batch and the call made once more.

        Safe for the calls made here (``release``, ``stats``): a fresh worker holds no episode, and a
        slot the driver still thinks live on it steps as ``worker_lost``.
        """
        import ray

        self._settle()
        try:
            return ray.get(getattr(self.actors[worker], method).remote(*args), timeout=self.call_timeout_s)
        except _lost_errors(timeout=True) as exc:
            self._recover(worker, exc)
        return ray.get(getattr(self.actors[worker], method).remote(*args), timeout=self.call_timeout_s)

    def _recover(self, worker: int, error: BaseException) -> None:
        """Count the loss, put a working actor in the worker's place, and wait until it answers."""
        import ray
        from ray.exceptions import GetTimeoutError

        detected = time.monotonic()
        self._worker_lost(worker, error)  # raises PoolError past max_worker_restarts
        if self._standby:
            ray.kill(self.actors[worker], no_restart=True)  # dead or hung: it must never answer again
            self._take_standby(worker)
            self._standby_due = time.monotonic() + self.standby_delay_s
        else:
            if isinstance(error, GetTimeoutError):  # hung: kill it so Ray restarts it
                ray.kill(self.actors[worker], no_restart=False)
            self._await_restart(worker, detected)
        self._procs[worker] = self._locate(self.actors[worker])
        self.loss_events.append({"worker": worker, "detected_at": detected, "restored_at": time.monotonic()})
        logger.warning("pool: worker %d answering again after %.2f s", worker, time.monotonic() - detected)

    def _take_standby(self, worker: int) -> None:
        """The first standby that adopts the worker's slice becomes the worker; else a fresh actor."""
        import ray

        while self._standby:
            actor = self._standby.pop(0)
            self._standby_warm.pop(0)
            try:
                ray.get(actor.adopt.remote(self._actor_args[worker][1], worker), timeout=self.restart_timeout_s)
            except _lost_errors(timeout=True) as exc:
                logger.warning("pool: standby worker unusable (%s); trying the next", type(exc).__name__)
                ray.kill(actor, no_restart=True)
                continue
            self.actors[worker] = actor
            return
        self.actors[worker] = self._new_actor(*self._actor_args[worker])
        self._await_restart(worker, time.monotonic())

    def _await_restart(self, worker: int, detected: float) -> None:
        """Wait until the worker's actor answers (Ray restarting it), rebuilding it if Ray gave up."""
        import ray
        from ray.exceptions import ActorDiedError, ActorUnschedulableError, GetTimeoutError, RayActorError

        deadline = detected + self.restart_timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get(self.actors[worker].ping.remote(), timeout=max(deadline - time.monotonic(), 0.001))
                return
            except (ActorDiedError, ActorUnschedulableError):  # Ray gave up on it (its constructor failed, its
                # pinned node is gone): build a fresh one
                ray.kill(self.actors[worker], no_restart=True)
                self.actors[worker] = self._new_actor(*self._actor_args[worker])
            except RayActorError:  # still restarting
                time.sleep(0.02)
            except GetTimeoutError:
                return
        raise PoolError(f"worker {worker} did not come back within {self.restart_timeout_s} s")

    # ------------------------------------------------------------------ extras
    def worker_pids(self) -> list[int]:
        """OS pids of the worker actors (fault tests and the recovery benchmark kill one)."""
        import ray

        self._settle()
        return ray.get([a.pid.remote() for a in self.actors], timeout=self.call_timeout_s)

    def stats(self) -> dict[str, Any]:
        """The driver's stats plus ``nodes_used`` (the Ray nodes that hosted a worker during the run) and
        ``started_ahead`` (workers and standbys it took from :func:`start_blank_workers`)."""
        self._settle()
        return {**super().stats(), "nodes_used": sorted(self.nodes_used), "started_ahead": self.started_ahead}

    def close(self) -> None:
        """Close the envs and end the actors, standbys included (no restart)."""
        import ray

        for actor in self.actors + self._standby:
            try:
                ray.get(actor.close.remote(), timeout=self.call_timeout_s)
            except Exception:  # a dead or hung actor is killed below anyway
                logger.debug("pool: close() of a worker failed", exc_info=True)
            ray.kill(actor, no_restart=True)
        self.actors = []
        self._standby, self._standby_warm = [], []
