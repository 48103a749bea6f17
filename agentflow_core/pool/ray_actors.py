"""The Ray actors of the Ray pool: the env worker as an actor, and workers started before their pool.

:class:`RayEnvWorker` is the :class:`~agentflow_core.pool.worker.EnvWorker` a Ray actor hosts: it
runs its worker-side rollout slices and evaluation episodes, says where it runs (the driver's
liveness poll), and manages its CPU priority: Ray starts workers at nice 15, which the hot path
leaves (:func:`_normal_priority`); a standby warms up at idle priority
(:meth:`RayEnvWorker.prewarm_standby`) so its start-up takes no CPU the running workers want.
:func:`start_blank_workers` starts actors before their pool (:class:`BlankWorkers`), so their
processes import torch and the rollout code while the driver still starts up. The driver that
steps them is :class:`~agentflow_core.pool.ray_pool.RayPool`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import psutil
from threadpoolctl import threadpool_limits

from agentflow_core.pool.base import EnvFactory, VariantLike
from agentflow_core.pool.worker import EnvWorker
from agentflow_core.procs import start_time

if TYPE_CHECKING:  # the rollout module pulls in torch: actors import it on their first rollout (or standby warm-up)
    from agentflow_core.pool.episodes import EpisodePlayer, EpisodeRecord, EvalRequest
    from agentflow_core.pool.slices import SliceRequest, SliceResult, SliceRunner, Weights


def _idle_priority() -> dict[int, int] | None:
    """Move every thread of this process to ``SCHED_IDLE``; returns each thread's nice value to restore.

    None (and nothing changed) where the process could not come back: going from ``SCHED_IDLE``
    to normal scheduling needs root or an RLIMIT_NICE that covers the threads' nice values.
    """
    if not hasattr(os, "sched_setscheduler"):
        return None
    threads = [t.id for t in psutil.Process().threads()]
    saved = {tid: os.getpriority(os.PRIO_PROCESS, tid) for tid in threads}
    if os.geteuid() != 0:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
        if soft != resource.RLIM_INFINITY and 20 - soft > min(saved.values()):
            return None
    for tid in threads:
        os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
    return saved


def _restore_priority(saved: dict[int, int]) -> None:
    """Undo :func:`_idle_priority`; threads started since then get the main thread's nice value."""
    default = saved.get(os.getpid(), 0)
    for thread in psutil.Process().threads():
        os.sched_setscheduler(thread.id, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, thread.id, saved.get(thread.id, default))


def _normal_priority() -> None:
    """Undo the nice 15 Ray starts its workers at, where this process may (root or a permissive RLIMIT_NICE).

    Env workers are the hot path of every phase: at nice 15 any other process on the node takes
    their CPU first (measured here: a training run at less than half its speed next to a test suite).
    """
    for thread in psutil.Process().threads():
        try:
            if os.getpriority(os.PRIO_PROCESS, thread.id) > 0:
                os.setpriority(os.PRIO_PROCESS, thread.id, 0)
        except (PermissionError, ProcessLookupError):
            return


class RayEnvWorker(EnvWorker):
    """The env worker as a Ray actor: it can also say where it runs (for the driver's liveness poll)."""

    _saved_priority: dict[int, int] | None = None
    _runner: SliceRunner | None = None
    _player: EpisodePlayer | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """:class:`EnvWorker`'s constructor, after leaving the low priority Ray started the process at.

        A standby (``worker_index`` -1) stays low until :meth:`adopt`: its start-up takes no CPU
        the running workers want.
        """
        threadpool_limits(limits=1)  # BLAS threads spinning beside the other workers only cost CPU
        super().__init__(*args, **kwargs)
        if self.worker_index >= 0:
            _normal_priority()

    def rollout(self, request: SliceRequest, weights: Weights) -> SliceResult:
        """Run this worker's slice of a rollout here (worker-side rollouts, :mod:`agentflow_core.pool.rollout`)."""
        return self._slice_runner().rollout(request, weights)

    def evaluate(self, request: EvalRequest, weights: Weights | None) -> list[EpisodeRecord]:
        """Play this worker's share of an evaluation here (:mod:`agentflow_core.pool.episodes`)."""
        if self._player is None:
            from agentflow_core.pool.episodes import EpisodePlayer

            self._slice_runner()  # torch limited to one thread, as for rollouts
            self._player = EpisodePlayer(self)
        return self._player.play(request, weights)

    def warm_up(self, normal_priority: bool = False) -> int:
        """Import torch, the rollout code and the envs' classes now (the pool asks at start-up, without
        waiting; the first reset queues behind it, outside the step watchdog); returns the index.

        ``normal_priority``: a blank worker that is to become one of its pool's workers leaves Ray's
        nice 15 first; its warm-up is then on the command's critical path (its first rollout waits for it).
        """
        if normal_priority:
            _normal_priority()
        self._slice_runner()
        self.prepare_factory()
        return self.worker_index

    def _slice_runner(self) -> SliceRunner:
        if self._runner is None:
            import torch

            from agentflow_core.pool.slices import SliceRunner

            torch.set_num_threads(1)  # a small MLP on a slice's rows: more threads only compete with the other worker
            self._runner = SliceRunner(self)
        return self._runner

    def prewarm_standby(self, variants: Mapping[int, VariantLike], seed: int = 0) -> int:
        """:meth:`prewarm` at idle CPU priority (``SCHED_IDLE``), so a standby warms up on spare CPU.

        The running workers keep their CPU share while it builds envs; :meth:`adopt` restores
        normal scheduling. Where the process could not return to it (unprivileged, with
        RLIMIT_NICE at its default), the standby warms up at normal priority instead.
        """
        self._saved_priority = _idle_priority()
        self._slice_runner()  # torch and the rollout code imported now, not during a recovery
        self.prepare_factory()
        return self.prewarm(variants, seed)

    def adopt(self, variants: Mapping[int, VariantLike], worker_index: int) -> int:
        """:meth:`EnvWorker.adopt`, back at normal CPU priority if the standby warmed up at idle priority."""
        if self._saved_priority is not None:
            _restore_priority(self._saved_priority)
            self._saved_priority = None
        _normal_priority()
        return super().adopt(variants, worker_index)

    def locate(self) -> tuple[str, int, float, str]:
        """(host, pid, process start time, Ray node id): identifies this process beyond pid reuse."""
        import ray

        me = psutil.Process()
        return host_id(), me.pid, start_time(me.pid), ray.get_runtime_context().get_node_id()


def host_id() -> str:
    """This machine, as the liveness poll compares it: several Ray nodes on one host share it."""
    import socket

    import ray

    return f"{socket.gethostname()}/{ray.util.get_node_ip_address()}"


def cpu_nodes() -> list[str]:
    """Ids of the alive nodes that offer CPUs, the driver's own node first, then by id."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    nodes = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
    return sorted(nodes, key=lambda n: (n != here, n))


def worker_class() -> Any:
    """The env worker as a remote class (Any: Ray's stubs type its methods as plain callables, no ``.remote``)."""
    import ray

    return ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(RayEnvWorker)


@dataclass
class BlankWorkers:
    """Env-worker actors started before their pool, each with no catalogue slice yet (``worker_index`` -1).

    A command starts them as soon as its Ray is up (:func:`start_blank_workers`): their processes
    start and import torch and the rollout code while the driver still opens its tracking run and
    warm-starts its policy. The pool built next takes them (:class:`RayPool`'s ``blank``) when
    they build the same envs: each adopts its worker's slice, or warms up as the pool's standby.
    """

    factory: Any  # what their envs are built with
    max_live: int
    step_timeout_s: float
    actors: list[Any]

    def fit(self, factory: Any, max_live: int, step_timeout_s: float) -> bool:
        """True when they build ``factory``'s envs (their factory covers every base env it has) the same way."""
        mine, theirs = getattr(self.factory, "entries", None), getattr(factory, "entries", None)
        same_envs = (
            mine is not None and theirs is not None and all(mine.get(k) == v for k, v in theirs.items())
        ) or self.factory == factory
        return same_envs and self.max_live == max_live and self.step_timeout_s == step_timeout_s

    def kill(self) -> None:
        """End them (none was taken)."""
        import ray

        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []


def start_blank_workers(
    factory: EnvFactory, n: int, max_live: int, step_timeout_s: float, active: int = 0
) -> BlankWorkers:
    """Start ``n`` blank env-worker actors on the driver's node and have them warm up (torch imported); returns at once.

    The first ``active`` are the ones the pool will take as its workers: they warm up at normal CPU
    priority, the others at Ray's nice 15. Measured on the 2-core machine: at nice 15, next to the
    driver's imports and behaviour cloning, a worker's warm-up took 7 s and the first rollout
    waited 2-4 s for it.
    """
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = cpu_nodes()
    strategy: Any = NodeAffinitySchedulingStrategy(nodes[0], soft=True) if nodes else "DEFAULT"
    cls = worker_class().options(scheduling_strategy=strategy, max_restarts=0)
    actors = [cls.remote(factory, {}, max_live, step_timeout_s, -1) for _ in range(n)]
    for i, actor in enumerate(actors):
        actor.warm_up.remote(i < active)
    return BlankWorkers(factory, max_live, step_timeout_s, actors)
