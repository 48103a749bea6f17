"""Disk and permission failures are one line naming the path and errno; damaged caches and actors count as absent.

A read-only or full file system is made for real: a private mount namespace (``unshare -m``, root)
with a small tmpfs, so nothing outside the test sees it. The CLI must then fail before the phase
works (``check_output``), in one line with the errno's name, exit 2; an atomic write that runs out
of space mid-file leaves the earlier output as it was and no temporary file behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentflow_core.atomic import check_output
from tasks.prefect_tasks import _cache_record  # imported first: Prefect configures logging on import

REPO = Path(__file__).resolve().parents[2]
CAN_MOUNT = os.geteuid() == 0 and shutil.which("unshare") is not None
needs_mount = pytest.mark.skipif(not CAN_MOUNT, reason="needs root and unshare for a private tmpfs")


def _in_tmpfs(mount: Path, size: str, script: str, read_only: bool = False) -> subprocess.CompletedProcess[str]:
    """Run bash ``script`` in a private mount namespace where ``mount`` is a tmpfs of ``size``."""
    mount.mkdir(parents=True, exist_ok=True)
    remount = f" && mount -o remount,ro {mount}" if read_only else ""
    return subprocess.run(
        ["unshare", "-m", "bash", "-c", f"mount -t tmpfs -o size={size} tmpfs {mount}{remount} && {script}"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"},
    )


@needs_mount
@pytest.mark.parametrize(("read_only", "errno_name"), [(True, "EROFS"), (False, "ENOSPC")])
def test_a_phase_on_a_read_only_or_full_disk_fails_at_once_in_one_line(
    tmp_path: Path, read_only: bool, errno_name: str
) -> None:
    mount = tmp_path / "disk"
    params = tmp_path / "params.yaml"
    params.write_text(f"base: {{env_config_dir: {REPO / 'configs/envs'}, data_dir: {mount / 'data'}}}\n")
    out = mount / "variants"
    started = time.perf_counter()
    result = _in_tmpfs(
        mount, "1m", f"{REPO / 'bin/agentflow'} variants --params {params} --out {out}", read_only=read_only
    )
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert result.returncode == 2, result
    assert len(lines) == 1, lines
    assert str(out) in lines[0] and errno_name in lines[0]
    assert time.perf_counter() - started < 60  # the interpreter's start-up; the check itself is immediate


@needs_mount
def test_running_out_of_space_mid_write_keeps_the_earlier_output(tmp_path: Path) -> None:
    mount = tmp_path / "disk"
    script = (
        f'{sys.executable} -c "\n'
        "import errno\n"
        "from pathlib import Path\n"
        "from agentflow_core.atomic import write_text\n"
        f"target = Path('{mount}') / 'summary.json'\n"
        "write_text(target, 'earlier output')\n"
        "try:\n"
        "    write_text(target, 'x' * (2 << 20))\n"
        "except OSError as exc:\n"
        "    assert exc.errno == errno.ENOSPC, exc\n"
        "else:\n"
        "    raise SystemExit('the write did not fail')\n"
        "assert target.read_text() == 'earlier output'\n"
        f"assert sorted(p.name for p in Path('{mount}').iterdir()) == ['summary.json']\n"
        "print('intact')\""
    )
    result = _in_tmpfs(mount, "1m", script)
    assert result.returncode == 0 and "intact" in result.stdout, result


def test_check_output_passes_on_a_writable_folder_and_names_the_path(tmp_path: Path) -> None:
    check_output(tmp_path / "not" / "yet" / "there")  # the nearest existing folder is probed
    assert not list(tmp_path.iterdir())  # the probe leaves nothing behind
    with pytest.raises(OSError, match="No space left") as err:
        check_output(tmp_path / "out", need_bytes=1 << 62)
    assert err.value.filename == str(tmp_path / "out")


@pytest.mark.parametrize("content", ["[]", "{}", '{"key": "k", "summary": []}', "\xff not json", "[" * 5000])
def test_a_damaged_phase_cache_record_counts_as_absent_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: str
) -> None:
    record = tmp_path / "explore.json"
    record.write_text(content, encoding="utf-8", errors="surrogateescape")
    with caplog.at_level(logging.WARNING, logger="agentflow.phase_cache"):
        assert _cache_record(record) == {}
    assert f"phase cache {record} is damaged" in caplog.text
    record.write_text(json.dumps({"key": "k", "out_md5": "m", "summary": {"a": 1}}))
    assert _cache_record(record)["summary"] == {"a": 1}


@pytest.mark.parametrize("content", [b"[]", b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{}", os.urandom(64)])
def test_a_damaged_offline_actor_counts_as_absent_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes
) -> None:
    from tasks.config_io import load_config
    from tasks.context import PhaseContext
    from tasks.steps.offline import ACTOR_FILE, offline_start

    ctx = PhaseContext.of(load_config(REPO / "params.yaml"))
    (tmp_path / ACTOR_FILE).write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="agentflow.train"):
        assert offline_start(ctx, tmp_path, None) is None
    assert f"offline actor {tmp_path / ACTOR_FILE} is damaged" in caplog.text


def test_a_cached_phase_logged_again_on_resume_adds_no_second_point(tmp_path: Path) -> None:
    from tasks.prefect_tasks import track_phase
    from tasks.tracking import MlflowTracker

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = MlflowTracker(uri, "resume-cache")
    parent = tracker.start_cycle("cycle", {})
    summary = {"variants_total": 12.0, "seconds": 1.5}
    for _ in range(2):  # the first run, then a resume that finds the phase cached
        track_phase("params.yaml", parent, uri, "resume-cache", "variants", summary, None)
    runs = tracker.client.search_runs([tracker.experiment_id], filter_string="tags.`agentflow.phase` = 'variants'")
    assert len(runs) == 1
    history = tracker.client.get_metric_history(runs[0].info.run_id, "variants_total")
    assert [m.value for m in history] == [12.0]
