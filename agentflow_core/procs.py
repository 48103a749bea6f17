"""Process identity that survives a stepped wall clock.

psutil's ``create_time()`` is the boot time (``btime`` in /proc/stat, read again at each call)
plus the process's start in clock ticks since boot. When the wall clock is stepped (NTP, a VM
resumed or migrated), ``btime`` moves with it: the same live process then reports another start
time, and a (pid, start time) check calls it gone -- every env worker of a pool at once (seen in
CI). On Linux the start is read in ticks since boot, which no clock step moves; elsewhere
psutil's value is used.

A service that daemonises (the embedded PostgreSQL: ``pg_ctl`` reparents the postmaster to init at
once) leaves its starter's process tree, so a watchdog that follows the tree cannot see it. The code
that starts one calls :func:`announce_detached` with the fresh folder that the service's command line
will name, before starting it; whoever stops a command's services (``tasks/child_reaper.py``) listens
through :func:`on_detached`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import psutil

_PROC = Path("/proc")
_listeners: list[Callable[[Path], None]] = []


def start_time(pid: int) -> float:
    """When ``pid`` started: seconds since boot on Linux, psutil's ``create_time()`` elsewhere.

    Raises ``psutil.NoSuchProcess`` when there is no such process.
    """
    if not (_PROC / "self" / "stat").exists():
        return psutil.Process(pid).create_time()
    try:
        stat = (_PROC / str(int(pid)) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    # the fields after the command name (which may hold spaces and parentheses): state is field 3,
    # starttime field 22
    return int(stat.rsplit(b")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")


def on_detached(listener: Callable[[Path], None]) -> None:
    """Have ``listener`` told every folder passed to :func:`announce_detached` from now on (once per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)


def announce_detached(folder: Path) -> None:
    """Tell the listeners that a service naming ``folder`` on its command line is about to start detached."""
    for listener in list(_listeners):
        listener(folder)
