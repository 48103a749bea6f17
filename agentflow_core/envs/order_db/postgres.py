"""A real PostgreSQL server for the SQL channel, embedded through the ``pgserver`` package.

``url: pgserver`` in an order_db registry entry (or ``OrderDBEnv(..., url=EMBEDDED_POSTGRES)``)
asks for it: the first env of a process starts a private server (PostgreSQL 16, ~1-3 s) in a
temporary folder, later envs of that process share it, and the last one to close stops it and
removes the folder. Processes never share one (a Ray worker starts its own). A server left behind
by a killed process (``kill -9`` skips the exit handler) is stopped by the next process that starts
one: every ``agentflow-pg-*`` folder whose owning processes are all gone is swept first, and a
command's watchdog is told each folder before its server starts (:func:`~agentflow_core.procs.announce_detached`:
``pg_ctl`` detaches the postmaster, whose command line names the folder). Any other URL is
passed to SQLAlchemy as it is, so a user's own server works the same way
(``postgresql+psycopg://user@host/db``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any

from agentflow_core.procs import announce_detached

EMBEDDED_POSTGRES = "pgserver"
PREFIX = "agentflow-pg-"
OWNER_FILE = "owner.pid"
DRIVER = "postgresql+psycopg"

_lock = threading.Lock()
_server: Any = None
_folder: Path | None = None
_users = 0


def acquire_embedded() -> str:
    """Start this process's embedded server if needed; one more user of it; its SQLAlchemy URL."""
    global _server, _folder, _users
    with _lock:
        if _server is None:
            with warnings.catch_warnings():  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
                warnings.simplefilter("ignore")
                import pgserver  # a channel driver: imported only when the embedded server is asked for

            sweep_orphans(Path(tempfile.gettempdir()))
            _folder = Path(tempfile.mkdtemp(prefix=PREFIX))
            (_folder / OWNER_FILE).write_text(str(os.getpid()))  # before the server exists: no sweep takes it
            announce_detached(_folder)  # before the server exists: a watchdog finds it however early we die
            _server = pgserver.get_server(_folder / "pgdata", cleanup_mode="delete")
        _users += 1
        uri = str(_server.get_uri())
    return DRIVER + uri[uri.index("://") :]


def release_embedded() -> None:
    """One user fewer; the last stops the server and removes its folder."""
    global _server, _folder, _users
    with _lock:
        _users -= 1
        if _users > 0 or _server is None:
            return
        server, folder, _server, _folder = _server, _folder, None, None
        server.cleanup()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def restart_embedded() -> str:
    """Replace this process's embedded server by a fresh one (its users carry over); its SQLAlchemy URL.

    For a server that died under its users: the dead one's folder is removed, a new one started.
    """
    global _server, _folder, _users
    with _lock:
        old, folder, users = _server, _folder, _users
        _server, _folder, _users = None, None, 0
    if old is not None:
        with contextlib.suppress(Exception):  # stopping a dead server may fail
            old.cleanup()
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
    uri = acquire_embedded()
    with _lock:
        _users = max(users, 1)
    return uri


def _folder_path() -> Path | None:
    """This process's embedded server folder (None when none runs); for tests and diagnostics."""
    return _folder


def embedded_users() -> int:
    """How many envs of this process use the embedded server now (0: it is stopped)."""
    return _users


def sweep_orphans(parent: Path) -> list[Path]:
    """Stop and remove the embedded servers under ``parent`` whose owning processes all died; returns them."""
    import psutil

    swept = []
    for folder in parent.glob(f"{PREFIX}*"):
        pgdata = folder / "pgdata"
        owners: list[object] = []
        for record in (folder / OWNER_FILE, pgdata / ".handle_pids.json"):
            try:
                found = json.loads(record.read_text())
            except (OSError, ValueError):
                continue  # not written yet, or damaged
            owners += found if isinstance(found, list) else [found]
        if any(isinstance(pid, int) and psutil.pid_exists(pid) for pid in owners):
            continue
        # no postmaster.pid, a damaged one, or its process already gone: no server left to stop
        with contextlib.suppress(OSError, ValueError, IndexError, psutil.Error):
            psutil.Process(int((pgdata / "postmaster.pid").read_text().split()[0])).kill()
        shutil.rmtree(folder, ignore_errors=True)
        swept.append(folder)
    return swept
