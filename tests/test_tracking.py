"""The MLflow record at the edge: runs of dead processes are closed, every update is sent (by a writer thread),
a resumed run continues each metric's history, and the hashes a run names are DVC's."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tasks.provenance import HOST_TAG, PID_START_TAG, PID_TAG, git_tags, process_tags
from tasks.stages import dvc_md5
from tasks.tracking import MlflowTracker


@pytest.fixture(scope="module")
def tracker(tmp_path_factory: pytest.TempPathFactory) -> MlflowTracker:
    return MlflowTracker(f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}", "tracking-test")


def test_runs_whose_process_died_are_closed_as_killed(tracker: MlflowTracker) -> None:
    mine = tracker.start_cycle("alive", {})
    dead = tracker.start_cycle("dead", {}, {PID_TAG: "999999999"})  # no such pid on this host
    reused = tracker.start_cycle("pid reused", {}, {PID_START_TAG: "1.00"})  # this pid, another start time
    remote = tracker.start_cycle("other host", {}, {HOST_TAG: "elsewhere", PID_TAG: "999999999"})
    assert set(tracker.close_orphans()) == {dead, reused}
    status = {r: tracker.client.get_run(r).info.status for r in (mine, dead, reused, remote)}
    assert status == {mine: "RUNNING", dead: "KILLED", reused: "KILLED", remote: "RUNNING"}
    assert tracker.client.get_run(mine).data.tags[PID_TAG] == str(os.getpid()) == process_tags()[PID_TAG]


def test_each_record_is_sent_at_once_and_a_resumed_run_skips_what_it_holds(tracker: MlflowTracker) -> None:
    run_id = tracker.start_cycle("train", {})
    sink = tracker.sink(run_id, prefix="train/")
    sink.record(1, {"loss": 1.0})
    sink.record(1, {"eval": 0.5})  # a second record at the same step (the held-out evaluation)
    sink.record(2, {"loss": 0.9})
    sink.flush()
    assert [m.step for m in tracker.client.get_metric_history(run_id, "train/loss")] == [1, 2]  # nothing buffered
    resumed = tracker.sink(run_id, prefix="train/")  # a killed run replays updates after its checkpoint
    resumed.record(1, {"loss": 1.0, "eval": 0.5})
    resumed.record(2, {"loss": 0.9, "eval": 0.6})  # eval at step 2 never reached the store: logged now
    resumed.record(3, {"loss": 0.8, "eval": 0.7})
    resumed.close()
    assert [m.step for m in tracker.client.get_metric_history(run_id, "train/loss")] == [1, 2, 3]
    assert [m.step for m in tracker.client.get_metric_history(run_id, "train/eval")] == [1, 2, 3]


def test_the_sink_does_not_wait_for_the_store_and_reports_what_the_writer_hit(tracker: MlflowTracker) -> None:
    import threading
    import time

    from tasks.tracking import TrackingError

    run_id = tracker.start_cycle("slow store", {})
    sink = tracker.sink(run_id)
    store, released = tracker.client.log_batch, threading.Event()

    def slow_log_batch(*args: object, **kwargs: object) -> None:
        released.wait(10)
        store(*args, **kwargs)

    tracker.client.log_batch = slow_log_batch  # type: ignore[method-assign]
    try:
        started = time.perf_counter()
        for step in range(1, 4):
            sink.record(step, {"loss": 1.0 / step})
        assert time.perf_counter() - started < 0.5  # handed over, not written
        released.set()
        sink.flush()
        assert [m.step for m in tracker.client.get_metric_history(run_id, "loss")] == [1, 2, 3]
    finally:
        tracker.client.log_batch = store  # type: ignore[method-assign]
    tracker.client.delete_run(run_id)
    sink.record(4, {"loss": 0.1})  # the store refuses a deleted run's metrics
    with pytest.raises(TrackingError, match=run_id):
        sink.close()


def test_dvc_md5_of_a_folder_is_the_hash_of_its_sorted_listing(tmp_path: Path) -> None:
    import hashlib

    (tmp_path / "b").mkdir()
    (tmp_path / "a.txt").write_bytes(b"a")
    (tmp_path / "b" / "c.bin").write_bytes(b"c")
    (tmp_path / "b" / "__pycache__").mkdir()
    (tmp_path / "b" / "__pycache__" / "x.pyc").write_bytes(b"ignored, as .dvcignore says")
    listing = [
        {"md5": hashlib.md5(b"a").hexdigest(), "relpath": "a.txt"},
        {"md5": hashlib.md5(b"c").hexdigest(), "relpath": "b/c.bin"},
    ]
    expected = hashlib.md5(json.dumps(listing, sort_keys=True).encode()).hexdigest() + ".dir"
    assert dvc_md5(tmp_path) == expected
    assert dvc_md5(tmp_path / "a.txt") == hashlib.md5(b"a").hexdigest()


def test_git_tags_name_the_commit_of_this_checkout() -> None:
    tags = git_tags()
    assert len(tags["mlflow.source.git.commit"]) == 40 and tags["agentflow.git.dirty"] in {"true", "false"}


def test_an_untracked_file_under_configs_counts_as_dirty(tmp_path: Path) -> None:
    import subprocess

    from tasks.provenance import git_state

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "root")
    (tmp_path / "notes.txt").write_text("scratch")  # untracked outside configs/: clean
    state = git_state(tmp_path)
    assert state is not None and not state.dirty
    (tmp_path / "configs" / "processes").mkdir(parents=True)
    (tmp_path / "configs" / "processes" / "cancel.yaml").write_text("name: cancel\n")  # a new process
    state = git_state(tmp_path)
    assert state is not None and state.dirty


@pytest.mark.parametrize("params", ["params.yaml", "params-refund.yaml"])
def test_process_provenance_names_the_process_files_and_channel_code(params: str) -> None:
    from tasks.config_io import load_config
    from tasks.provenance import file_sha256, process_provenance

    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(repo / params)
    cfg = cfg.model_copy(
        update={"base": cfg.base.model_copy(update={"env_config_dir": str(repo / cfg.base.env_config_dir)})}
    )
    provenance = process_provenance(cfg)
    folders = sorted(folder for _, folder in provenance.artifacts())
    n = len(cfg.variants.base_envs)
    assert folders == sorted(["process"] + ["env_configs"] * n + ["mappings"] * n)
    process_file = next(path for path, folder in provenance.artifacts() if folder == "process")
    assert process_file.name == f"{cfg.process}.yaml"
    assert provenance.tags["agentflow.process"] == cfg.process
    assert provenance.tags["agentflow.process.sha256"] == file_sha256(process_file)[:16]
    for env_id in cfg.variants.base_envs:
        assert provenance.tags[f"agentflow.channel.{env_id}.version"].startswith("sha256:")  # the repo's own code
        assert ":" in provenance.tags[f"agentflow.channel.{env_id}.class_path"]


def test_code_version_names_an_installed_distribution() -> None:
    from tasks.provenance import code_version

    assert code_version("numpy.random:Generator").startswith("numpy==")
    assert code_version("agentflow_refund.service:RefundService").startswith("sha256:")
