"""Child servers die with the process that started them, even when it is killed.

Prefect's ephemeral API server is a subprocess (uvicorn) that the first API call starts; Prefect
stops it at interpreter exit, so after a SIGKILL (or the OOM killer) it keeps running, holding its
port and its sqlite database. :func:`bind_ephemeral_servers` starts a small watchdog process
(``python -m tasks.lifetime``, its own session so a signal to the run's process group spares it)
that polls the parent and terminates the bound children once the parent is gone, then exits;
it also exits when the children end first (the normal shutdown).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import psutil

from agentflow_core.procs import start_time

SERVER_MARKER = "prefect.server.api.server:create_app"
_bound: set[int] = set()


def _identity(process: psutil.Process) -> str:
    """``pid:start_time``: a pid alone may be reused by an unrelated process."""
    return f"{process.pid}:{start_time(process.pid):.2f}"


def bind_ephemeral_servers() -> list[int]:
    """Tie this process's ephemeral Prefect servers to its life; returns the pids newly bound."""
    servers = [
        child
        for child in psutil.Process().children()
        if child.pid not in _bound and SERVER_MARKER in " ".join(child.cmdline())
    ]
    if servers:
        subprocess.Popen(
            [sys.executable, "-m", "tasks.lifetime", _identity(psutil.Process()), *map(_identity, servers)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        _bound.update(s.pid for s in servers)
    return [s.pid for s in servers]


def _alive(identity: str) -> psutil.Process | None:
    pid, _, started = identity.partition(":")
    try:
        process = psutil.Process(int(pid))
        return process if f"{start_time(process.pid):.2f}" == started and process.is_running() else None
    except psutil.NoSuchProcess:
        return None


def watch(parent: str, children: list[str], interval_s: float = 0.5, grace_s: float = 5.0) -> None:
    """Wait until ``parent`` is gone, then terminate (and after ``grace_s`` kill) the living ``children``."""
    while _alive(parent) is not None:
        if all(_alive(c) is None for c in children):
            return
        time.sleep(interval_s)
    living = [p for p in map(_alive, children) if p is not None]
    for process in living:
        process.terminate()
    _, still = psutil.wait_procs(living, timeout=grace_s)
    for process in still:
        process.kill()


if __name__ == "__main__":
    os.nice(5)
    watch(sys.argv[1], sys.argv[2:])
