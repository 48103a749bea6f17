"""Atomic file and folder output: a reader (or DVC, or a resumed run) never sees half of one.

The one implementation every writer of the project uses (checkpoints, trajectory shards, the
variant catalogue, metrics, plots, generated env configs). A file is written to a temporary name
in the same folder, flushed to disk and renamed over the target (``os.replace`` is atomic on
POSIX within one filesystem); a folder is built under a temporary name and swapped in whole, the
previous one restored if the swap fails. Temporary names start with ``.`` and end in ``.tmp``, so
globs over real outputs (``update_*``, ``part-*.parquet``) never see them.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SHARED_FILE_MODE = 0o644  # mkstemp makes 0600: outputs are meant to be read by others
SHARED_DIR_MODE = 0o755  # mkdtemp makes 0700


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (the names just renamed into it) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; when the block succeeds it replaces ``path``.

    The caller writes the temporary path however it likes (``pq.write_table``, ``fig.savefig``,
    ``save_file``); on an exception it is removed and ``path`` is left as it was.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, SHARED_FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    """Write UTF-8 text atomically."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, data: Any, indent: int = 2) -> None:
    """Write JSON atomically (sorted keys, a trailing newline; non-JSON values as ``str``)."""
    write_text(path, json.dumps(data, indent=indent, sort_keys=True, default=str) + "\n")


@contextmanager
def atomic_dir(target: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``target``; when the block succeeds it replaces ``target`` whole.

    The old ``target`` is moved aside first and put back if the swap itself fails, so at every
    moment either the old or the new folder is at ``target``; on an exception inside the block
    the temporary folder is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    tmp.chmod(SHARED_DIR_MODE)
    try:
        yield tmp
        for file in (f for f in tmp.rglob("*") if f.is_file()):
            with open(file, "rb") as fh:
                os.fsync(fh.fileno())
        fsync_dir(tmp)
        aside = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-", suffix=".tmp"))
        try:
            if target.exists():
                os.replace(target, aside / target.name)
            try:
                os.replace(tmp, target)
            except BaseException:
                if (aside / target.name).exists():
                    os.replace(aside / target.name, target)
                raise
        finally:
            shutil.rmtree(aside, ignore_errors=True)
        fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def remove_stale(folder: Path) -> None:
    """Remove the temporary files and folders an interrupted writer left in ``folder``."""
    for stale in Path(folder).glob(".*.tmp"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
