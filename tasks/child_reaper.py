"""A watchdog that stops every process a command started once the command is gone, however it ended.

A command's child services do not all die with it: a ``kill -9`` skips every exit handler, and the
embedded PostgreSQL (started through ``pg_ctl``, so it is reparented away from the command at once)
then ran ~7 minutes; Ray's GCS and raylet noticed their driver's death only after ~65 s; Chromium
and the payment server end with their pipes. :func:`start_reaper` starts, once per process, a
small watchdog (``python -m tasks.child_reaper <pid>``) in its own session, so a signal to the
command's process group does not reach it. The watchdog:

* every :data:`POLL_S` records each descendant of the command (pid and start time, so a reused pid
  is never mistaken for one), keeping those that were reparented away since;
* reads, on its pipe from the command, the folders of the services the command starts detached
  (``dir <path>`` lines, written by :func:`start_reaper`'s listener on
  :func:`agentflow_core.procs.on_detached` before such a service starts: the embedded PostgreSQL,
  whose postmaster ``pg_ctl`` reparents to init at once, faster than any poll is sure to see);
* when the command is gone (the pipe closes: exit, crash or SIGKILL alike), sends SIGTERM to every
  recorded process still alive and to every process whose command line names a folder it was told
  (the postmaster's ``-D <folder>/pgdata``) -- to its whole process group when it leads one
  (Chromium's and PostgreSQL's helpers follow their leader) -- then SIGKILL after
  :data:`GRACE_S` to any that remain, and exits.

It never touches a process that was not the command's descendant while the command lived: a
server the command only connected to (a user's PostgreSQL, a joined Ray cluster) is not its child.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from agentflow_core.procs import on_detached

POLL_S = 0.2
GRACE_S = 3.0

_lock = threading.Lock()
_reaper: dict[int, subprocess.Popen[bytes]] = {}  # this process's pid -> its watchdog (a fork starts its own)


def start_reaper() -> None:
    """Start this process's watchdog (idempotent); it outlives the process only long enough to stop its children."""
    with _lock:
        if os.getpid() in _reaper and _reaper[os.getpid()].poll() is None:
            return
        _reaper[os.getpid()] = subprocess.Popen(
            [sys.executable, "-m", "tasks.child_reaper", str(os.getpid())],
            stdin=subprocess.PIPE,  # the detached services' folders; its end-of-file is the command's end
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C or a kill of the command's group does not stop it first
            close_fds=True,
        )
    on_detached(_tell_folder)


def _tell_folder(folder: Path) -> None:
    """Tell this process's watchdog a detached service's folder (none in a fork that started no watchdog)."""
    names = {os.fsencode(str(folder.absolute())), os.fsencode(str(folder.resolve()))}  # as named, and real
    with _lock:
        reaper = _reaper.get(os.getpid())
        if reaper is None or reaper.stdin is None or reaper.poll() is not None:
            return
        try:
            reaper.stdin.write(b"".join(b"dir " + name + b"\n" for name in names if b"\n" not in name))
            reaper.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            return  # the watchdog is gone: nothing to tell


def _poll(parent_pid: int, seen: dict[int, float], me: int) -> None:
    """Add the descendants of the command and of every process recorded so far; drop the ended ones.

    One scan of the process table per poll (a parent -> children map), however many are recorded.
    """
    import psutil

    children: dict[int, list[int]] = {}
    created: dict[int, float] = {}
    for process in psutil.process_iter(["ppid", "create_time"]):
        children.setdefault(process.info["ppid"], []).append(process.pid)
        created[process.pid] = process.info["create_time"]
    for pid in [pid for pid, when in seen.items() if created.get(pid) != when]:
        del seen[pid]  # ended, or its pid now belongs to another process
    stack = [parent_pid, *seen]
    while stack:
        for child in children.get(stack.pop(), ()):
            if child != me and child not in seen and created.get(child) is not None:
                seen[child] = created[child]
                stack.append(child)


def _alive(seen: dict[int, float]) -> list[Any]:
    import psutil

    alive = []
    for pid, created in seen.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(process)
        except psutil.Error:
            continue
    return alive


def _signal(processes: list[Any], sig: int, own_group: int) -> None:
    for process in processes:
        try:
            group = os.getpgid(process.pid)
            if group == process.pid and group != own_group:
                os.killpg(group, sig)
            else:
                process.send_signal(sig)
        except (ProcessLookupError, PermissionError, OSError):
            continue


def _naming(folders: list[bytes], me: int) -> list[Any]:
    """The processes (other than the watchdog) with an argument inside one of ``folders``."""
    import psutil

    if not folders:
        return []
    found = []
    for process in psutil.process_iter(["cmdline"]):
        args = [os.fsencode(arg) for arg in process.info["cmdline"] or ()]
        if process.pid != me and any(arg == f or arg.startswith(f + b"/") for arg in args for f in folders):
            found.append(process)
    return found


def reap(seen: dict[int, float], folders: list[bytes] | None = None) -> list[int]:
    """SIGTERM every recorded process still alive and every process naming one of ``folders``.

    SIGKILL what remains after :data:`GRACE_S`; returns the pids signalled.
    """
    import psutil

    own_group = os.getpgid(0)
    _poll(-1, seen, os.getpid())  # children born since the last poll, while the command was ending
    targets = _alive(seen)
    targets += [p for p in _naming(folders or [], os.getpid()) if p.pid not in seen]
    _signal(targets, signal.SIGTERM, own_group)
    _, remaining = psutil.wait_procs(targets, timeout=GRACE_S)
    _signal(remaining, signal.SIGKILL, own_group)
    psutil.wait_procs(remaining, timeout=GRACE_S)
    return [p.pid for p in targets]


def watch(parent_pid: int) -> None:
    """Record the command's descendants and the folders it names until its pipe closes, then reap them."""

    gone = threading.Event()
    folders: list[bytes] = []

    def read_until_eof() -> None:
        for line in sys.stdin.buffer:
            kind, _, value = line.rstrip(b"\n").partition(b" ")
            if kind == b"dir" and value.startswith(b"/"):
                folders.append(value.rstrip(b"/"))
        gone.set()

    threading.Thread(target=read_until_eof, daemon=True).start()
    seen: dict[int, float] = {}
    me = os.getpid()
    while not gone.is_set():
        _poll(parent_pid, seen, me)
        gone.wait(POLL_S)
    reap(seen, folders)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the command's end stops it
    watch(int(sys.argv[1]))
