"""The Ray runtime of a command: a private local Ray, or a joined cluster, started once and stopped at exit.

- a private local Ray (``address="local"``: a cluster someone else started on this machine is never
  joined by accident) comes up on a helper thread (:class:`LocalRayStart`) while the command does its
  own start-up, listens on loopback only and skips the head processes it never uses;
- a cluster named by ``RAY_ADDRESS`` / ``base.ray.address`` is probed and joined at once, with token
  authentication where a token is available, so a bad address fails before anything is written.

The pool builders (:mod:`tasks.backend`) call :func:`start_ray` first; the CLI calls :func:`stop_ray`
on exit.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import urlparse

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import AgentFlowError
from agentflow_core.pool.base import RegistryEnvFactory
from tasks.child_reaper import start_reaper
from tasks.registry_io import load_registry

if TYPE_CHECKING:
    from agentflow_core.pool.ray_pool import BlankWorkers
    from agentflow_core.tuning import Cores

logger = logging.getLogger("agentflow.ray")

# How long the reachability probe of a cluster address waits (the whole error stays well under 30 s).
PROBE_TIMEOUT_S = 5.0
# Ray 2.60's switch for multi-node clusters (named for the platforms where it is off by default).
RAY_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
AUTH_HINT = (
    "Clusters started with `ray start` use token authentication by default: on a machine of the cluster the "
    "token is in ~/.ray/auth_token; export RAY_AUTH_TOKEN=<that token> (or RAY_AUTH_TOKEN_PATH=<file>) here."
)


class RayUnavailable(AgentFlowError):
    """The configured Ray cluster cannot be reached or joined."""


class RayCluster(NamedTuple):
    """The Ray this process runs on: ``local`` (a private one) or the cluster address, and its alive nodes."""

    address: str
    nodes: int


def ray_address(cfg: AgentFlowConfig) -> str | None:
    """``RAY_ADDRESS`` beats ``base.ray.address``; None means a private local Ray."""
    return os.environ.get("RAY_ADDRESS") or cfg.base.ray.address


def _probe(address: str) -> None:
    """Fail fast, naming the address, when nothing listens there (``ray.init`` would retry for a minute)."""
    if address == "auto":
        return
    parsed = urlparse(address if "://" in address else f"gcs://{address}")
    if not parsed.hostname or not parsed.port:
        raise RayUnavailable(f"Ray address {address!r} is not host:port or ray://host:port")
    try:
        socket.create_connection((parsed.hostname, parsed.port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise RayUnavailable(f"no Ray cluster reachable at {address}: {exc.strerror or exc}") from None


def _token_available() -> bool:
    return bool(
        os.environ.get("RAY_AUTH_TOKEN")
        or os.environ.get("RAY_AUTH_TOKEN_PATH")
        or (Path.home() / ".ray" / "auth_token").is_file()
    )


def _enable_token_auth() -> None:
    """Token mode for this process (Ray reads the mode into its config at import: set it, then refresh)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    from ray._private.authentication.authentication_token_setup import _enable_token_auth as refresh  # Ray 2.60

    refresh()


def _loopback_only() -> None:
    """Make a private local Ray listen on loopback only (Ray 2.60).

    Ray resolves ``127.0.0.1`` to the machine's routable address for its node address
    (``services.resolve_ip_for_localhost``) and then binds its gRPC servers (GCS, raylet, workers,
    agents) on all interfaces, unless clusters are switched off, which makes the node address the
    loopback one and every server bind it. Ray reads the switch into ``ray_constants`` at import and
    its child processes read it from the environment, so both are set.
    """
    os.environ[RAY_CLUSTER_SWITCH] = "0"
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        setattr(constants, "ENABLE_RAY_CLUSTER", False)  # noqa: B010 (not in Ray's stubs)


# The head processes a private local Ray starts that such a Ray never uses (Ray 2.60's ``Node`` methods):
# the autoscaler monitor (a one-node Ray never scales), the log monitor (it streams worker output to the
# driver, which ``log_to_driver=False`` turns away) and, with the dashboard off, the API server (the
# dashboard head's job, state and metrics modules, which it starts even with ``include_dashboard=False``).
UNUSED_HEAD_PROCESSES = ("start_monitor", "start_log_monitor")
DASHBOARD_HEAD_PROCESS = "start_api_server"


@contextmanager
def _lean_head(include_dashboard: bool) -> Iterator[list[str]]:
    """While a private local Ray starts, skip the head processes it would not use; yields what was skipped.

    Measured on the 2-core machine: a bare ``ray.init`` took 4.7 s and 5.6 s of CPU across its
    processes with them, 2.5 s and 3.3 s without (the monitor 0.5-0.7, the API server 1.0, the log
    monitor 0.4-0.6 CPU-s), all of it beside a command's own start-up. Ray has no switch for them in
    ``ray.init``: the methods that start them are replaced for the duration of the start. Where a Ray
    release lacks one, it starts as usual.
    """
    from ray._private.node import Node

    names = [*UNUSED_HEAD_PROCESSES, *([] if include_dashboard else [DASHBOARD_HEAD_PROCESS])]
    originals = {name: Node.__dict__[name] for name in names if callable(Node.__dict__.get(name))}

    def skip(self: Any, *args: Any, **kwargs: Any) -> None:
        return None

    for name in originals:
        setattr(Node, name, skip)
    try:
        yield sorted(originals)
    finally:
        for name, method in originals.items():
            setattr(Node, name, method)


def _start_local(cfg: AgentFlowConfig) -> None:
    import ray

    _loopback_only()
    rc = cfg.base.ray
    with _lean_head(rc.include_dashboard):
        ray.init(
            address="local",
            num_cpus=rc.num_cpus,
            include_dashboard=rc.include_dashboard,
            object_store_memory=rc.object_store_mb * 1024 * 1024,
            log_to_driver=False,
        )


def _session_dir() -> Path | None:
    """The session folder of the Ray node this process started or joined (``<temp dir>/session_<time>_<pid>``)."""
    from ray._private import worker

    node = getattr(worker, "_global_node", None)
    path = None if node is None else node.get_session_dir_path()
    return Path(path) if path else None


def remove_session_dir(session: Path) -> None:
    """Remove a stopped private Ray's session folder (logs, sockets, runtime envs), and its ``session_latest`` link.

    Ray leaves it behind on every start (tens of MB of logs per command); the processes that
    wrote there are gone once ``ray.shutdown`` returns. The link is removed only while it still
    names this session (another Ray on the machine may have started since). A file that cannot be
    removed is left, with a debug line: a leftover folder is not worth failing a command's exit.
    """
    shutil.rmtree(session, ignore_errors=True)
    if session.exists():  # a late write into a folder being removed: once more
        shutil.rmtree(session, onerror=lambda _fn, path, _exc: logger.debug("could not remove %s", path))
    latest = session.parent / "session_latest"
    with suppress(OSError):
        if latest.is_symlink() and Path(os.readlink(latest)) == session:
            latest.unlink()


class _NotMainThread(logging.Filter):
    """Drops ``ray.init``'s warning that a helper thread cannot set its SIGTERM handler (:class:`LocalRayStart` does)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "SIGTERM handler is not set" not in record.getMessage()


class LocalRayStart:
    """A private local Ray started on a helper thread and waited for by the first phase that uses it.

    A local Ray takes about 5 s to come up, most of it waiting for its raylet to register; a command
    meanwhile opens its MLflow run, reads its catalogue and runs its warm start. The helper thread
    lives as long as the process: Ray's node processes are started with ``PR_SET_PDEATHSIG``, which
    kills them when the *thread* that started them ends. The SIGTERM handler ``ray.init`` sets only
    on the main thread (exit, so Ray's exit hook stops its processes) is set here instead. A cluster
    address is joined at once, not here: a bad one fails before anything is written.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: queue.SimpleQueue[tuple[AgentFlowConfig, bool, threading.Event]] | None = None
        self._blank: BlankWorkers | None = None  # env workers started with Ray, for the first pool to take
        self._pending: threading.Event | None = None  # set once the start asked for has finished
        self._error: BaseException | None = None
        self._session: Path | None = None  # the private Ray's session folder, removed when it stops
        logging.getLogger("ray._private.worker").addFilter(_NotMainThread())

    def begin(self, cfg: AgentFlowConfig, blank_workers: bool = False) -> None:
        """Start it (a no-op when Ray runs here already or is being started).

        With ``blank_workers`` it then starts ``pool.num_workers`` env-worker actors and a standby
        (:func:`~agentflow_core.pool.ray_pool.start_blank_workers`): the command's first pool takes them
        (:meth:`claim`) instead of starting its own after the command's warm-up.
        """
        import ray

        with self._lock:
            if (self._pending is not None and not self._pending.is_set()) or ray.is_initialized():
                return
            main = threading.current_thread() is threading.main_thread()
            if main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(signum))
            if self._requests is None:
                self._requests = queue.SimpleQueue()
                threading.Thread(target=self._serve, args=(self._requests,), name="agentflow-ray", daemon=True).start()
            self._pending, self._error = threading.Event(), None
            self._requests.put((cfg, blank_workers, self._pending))

    def _serve(self, requests: queue.SimpleQueue[tuple[AgentFlowConfig, bool, threading.Event]]) -> None:
        while True:
            cfg, blank_workers, done = requests.get()
            try:
                _start_local(cfg)
                with self._lock:
                    self._session = _session_dir()
                if blank_workers:
                    self._start_blank(cfg)
            except BaseException as exc:  # handed to the thread that waits
                self._error = exc
            finally:
                done.set()

    def _start_blank(self, cfg: AgentFlowConfig) -> None:
        from agentflow_core.pool.ray_actors import start_blank_workers

        pc = cfg.pool
        try:
            registry = load_registry(cfg)
            factory = RegistryEnvFactory({b: registry.get(b) for b in sorted(set(cfg.variants.base_envs))})
            blank = start_blank_workers(
                factory, pc.num_workers + 1, pc.max_live_per_worker, pc.step_timeout_s, active=pc.num_workers
            )
        except Exception:  # an optimisation only: the pool starts its own workers (and reports a real error)
            logger.debug("blank env workers not started", exc_info=True)
            return
        with self._lock:
            self._blank = blank

    def claim(self) -> BlankWorkers | None:
        """The blank env workers started with Ray, once (None when there are none, or no longer)."""
        with self._lock:
            blank, self._blank = self._blank, None
        return blank

    def take_session(self) -> Path | None:
        """The session folder of the private Ray this process started, once (None when it started none)."""
        with self._lock:
            session, self._session = self._session, None
        return session

    def wait(self) -> None:
        """Block until the start begun has finished; raise :class:`RayUnavailable` if it failed."""
        with self._lock:
            pending = self._pending
        if pending is None:
            return
        pending.wait()
        with self._lock:
            if self._pending is pending:
                self._pending = None
            error, self._error = self._error, None
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            raise RayUnavailable(f"the private local Ray did not start: {first}") from error


LOCAL_RAY = LocalRayStart()


def start_ray(cfg: AgentFlowConfig, wait: bool = True, blank_workers: bool = False) -> RayCluster:
    """Start a private local Ray, or join the configured cluster; a no-op when Ray already runs here.

    With ``wait=False`` a local Ray comes up on a helper thread (:class:`LocalRayStart`); the next
    ``start_ray`` (every pool builder calls it) waits for it. ``blank_workers``: a local Ray then
    starts the env workers of the command's first pool too. A cluster is always joined before this returns.
    """
    import ray

    address = ray_address(cfg)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not address:
        start_reaper()  # a killed command's private Ray (GCS, raylet, workers) ends within seconds
        LOCAL_RAY.begin(cfg, blank_workers)
        if wait:
            LOCAL_RAY.wait()
        return RayCluster("local", 1)  # a private local Ray is this one node
    if not ray.is_initialized():
        _probe(address)
        # A client joining a cluster sends its token only in token mode; ``ray start`` clusters require it.
        if "RAY_AUTH_MODE" not in os.environ and _token_available():
            _enable_token_auth()
        try:
            ray.init(address=address, log_to_driver=False)
        except Exception as exc:  # Ray raises ConnectionError/RuntimeError with multi-line text
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RayUnavailable(f"could not join the Ray cluster at {address}: {first}. {AUTH_HINT}") from None
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    return RayCluster(address, nodes)


def stop_ray() -> None:
    """Leave Ray before the interpreter exits: a private local Ray is shut down, a joined cluster keeps running.

    Ray's own exit hook does the same after a half-second pause it takes to print late worker
    errors; a command's pools are closed by then, so the CLI calls this instead. A local start
    still under way is waited for first, so none of its processes is left behind. A private local
    Ray has no autoscaler monitor to stop (:func:`_lean_head`): shut down with the rest, it spent
    Ray's one-second grace reporting its end to the GCS that had just stopped (1.0 s of 1.4 s here).
    A private local Ray's session folder is removed once it has stopped (:func:`remove_session_dir`).
    """
    ray = sys.modules.get("ray")
    if ray is None:
        return
    with suppress(RayUnavailable):  # one that did not start leaves nothing to stop
        LOCAL_RAY.wait()
    LOCAL_RAY.claim()  # blank workers no pool took end with the Ray
    session = LOCAL_RAY.take_session()
    if ray.is_initialized():
        ray.shutdown()
    if session is not None:  # a joined cluster's folder is the cluster's: only a private Ray's goes
        remove_session_dir(session)


def _local_addresses() -> set[str]:
    names = {"127.0.0.1", "localhost", socket.gethostname()}
    with suppress(OSError):
        names |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    return {str(n) for n in names}


def ray_cores(cfg: AgentFlowConfig) -> Cores:
    """Ray's logical CPUs, and the cores that can run at once: per host, at most what that host schedules.

    A private local Ray has ``base.ray.num_cpus`` logical CPUs on this host (read from the config, no
    Ray start); a cluster (``RAY_ADDRESS`` / ``base.ray.address``) is asked for its alive nodes. Nodes
    on this host share its schedulable cores (``os.sched_getaffinity``); other hosts count their CPUs.
    """
    from agentflow_core.tuning import Cores

    here = len(os.sched_getaffinity(0))
    if ray_address(cfg) is None:
        logical = cfg.base.ray.num_cpus
        usable = min(logical, here)
        return Cores(logical, usable, f"local Ray: {logical} logical CPUs, {here} schedulable cores here")
    import ray

    start_ray(cfg)
    local = _local_addresses()
    local_cpus = remote_cpus = 0
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    for node in nodes:
        cpus = int(node.get("Resources", {}).get("CPU", 0))
        if node.get("NodeManagerAddress") in local:
            local_cpus += cpus
        else:
            remote_cpus += cpus
    usable = min(local_cpus, here) + remote_cpus
    detail = (
        f"Ray cluster of {len(nodes)} node(s): {local_cpus} logical CPUs on this host ({here} schedulable cores), "
        f"{remote_cpus} on other hosts"
    )
    return Cores(local_cpus + remote_cpus, max(usable, 1), detail)
