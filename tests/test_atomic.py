"""The one atomic-write helper: a failed write leaves the old output and no temporary files."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from agentflow_core.atomic import atomic_dir, atomic_file, remove_stale, write_json


def test_write_json_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "m.json"
    write_json(target, {"b": 1, "a": 2})
    write_json(target, {"a": 3})
    assert json.loads(target.read_text()) == {"a": 3}
    assert target.read_text().endswith("\n")
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)
    assert [p.name for p in target.parent.iterdir()] == ["m.json"]


def test_atomic_file_failure_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_atomic_dir_swaps_whole_and_keeps_old_on_failure(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError("killed mid-write")
    assert (target / "a").read_text() == "1"
    with atomic_dir(target) as tmp:
        (tmp / "b").write_text("3")
    assert sorted(p.name for p in target.iterdir()) == ["b"]  # replaced whole, not merged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_atomic_dir_puts_the_old_folder_back_when_the_swap_fails(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "out"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    real_replace = os.replace

    def failing_replace(src, dst):  # the swap of the new folder into place fails (disk full, say)
        if Path(dst) == target and Path(src).name.endswith(".tmp"):
            raise OSError("no space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(OSError), atomic_dir(target) as tmp:
        (tmp / "a").write_text("2")
    monkeypatch.setattr(os, "replace", real_replace)
    assert (target / "a").read_text() == "1"


def test_remove_stale_clears_only_temporaries(tmp_path: Path) -> None:
    (tmp_path / ".x.abc.tmp").write_text("")
    (tmp_path / ".update_1.def.tmp").mkdir()
    (tmp_path / "update_1").mkdir()
    remove_stale(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["update_1"]
