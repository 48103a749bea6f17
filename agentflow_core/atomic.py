"""Atomic file and folder output: a reader (or DVC, or a resumed run) never sees half of one.

The one implementation every writer of the project uses (checkpoints, trajectory shards, the
variant catalogue, metrics, plots, generated env configs). A file is written to a temporary name
in the same folder, flushed to disk and renamed over the target (``os.replace`` is atomic on
POSIX within one filesystem); a folder is built under a temporary name and swapped in whole, the
previous one restored if the swap fails. Temporary names start with ``.`` and end in ``.tmp``, so
globs over real outputs (``update_*``, ``part-*.parquet``) never see them.
"""

from __future__ import annotations

import errno
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


MIN_FREE_BYTES = 16 << 20  # the least a phase is assumed to write when it has no earlier output to go by


def folder_bytes(path: Path) -> int:
    """Bytes of the regular files under ``path`` (0 when it does not exist)."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def check_output(path: Path, need_bytes: int | None = None) -> None:
    """Before a phase writes ``path`` (a file or folder): its folder is writable and has room, else ``OSError``.

    The check writes and removes one temporary file in the nearest existing folder (so a read-only
    or full file system, or missing permission, fails here with its own errno, not minutes into the
    phase) and compares free space with ``need_bytes``: by default twice what an earlier output
    there holds (an atomic swap keeps the old copy until the new one is complete), at least
    :data:`MIN_FREE_BYTES`. The ``OSError`` names the path and the errno.
    """
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".write-check.", suffix=".tmp")
        try:
            os.write(fd, b"x")
            os.fsync(fd)
        finally:
            os.close(fd)
            os.unlink(name)
    except OSError as exc:  # name the output, not the probe file
        raise OSError(exc.errno, f"cannot write here: {exc.strerror}", str(path)) from None
    need = max(2 * folder_bytes(path), MIN_FREE_BYTES) if need_bytes is None else need_bytes
    free = shutil.disk_usage(folder).free
    if free < need:
        raise OSError(
            errno.ENOSPC,
            f"No space left for this phase: about {need >> 20} MiB needed, {free >> 20} MiB free",
            str(path),
        )


def save_tensors(tensors: dict[str, Any], path: Path) -> None:
    """Write a safetensors file atomically (``safetensors.torch.save_file`` onto a temporary name)."""
    from safetensors.torch import save_file  # here, not at import: most writers need no torch

    with atomic_file(path) as tmp:
        save_file(tensors, str(tmp))


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
