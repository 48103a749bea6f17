"""What a tracked run records about where it came from: code commit, process, host.

The process tags (host, pid, process start time) let the next run tell a run whose process
was killed (SIGKILL, OOM, power loss: nothing could close it) from one still running
elsewhere, and close it as KILLED (:meth:`tasks.tracking.MlflowTracker.close_orphans`).
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psutil

from agentflow_core.procs import start_time
from tasks.stages import REPO_ROOT

GIT_COMMIT_TAG = "mlflow.source.git.commit"  # MLflow's standard tag: the UI links it
GIT_DIRTY_TAG = "agentflow.git.dirty"
HOST_TAG, PID_TAG, PID_START_TAG = "agentflow.host", "agentflow.pid", "agentflow.pid_start"


PIPELINE_OUTPUTS = (":(exclude)data", ":(exclude)dvc.lock")  # written by runs (metrics files, DVC's record)


@dataclass(frozen=True)
class GitState:
    """The commit of the code that runs, and whether tracked files other than pipeline outputs differ from it."""

    commit: str
    dirty: bool


def git_state(root: Path = REPO_ROOT) -> GitState | None:
    """HEAD and the dirty flag of the repository holding this code; None outside a git checkout."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *PIPELINE_OUTPUTS],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return GitState(commit, bool(status.strip()))


def git_tags(root: Path = REPO_ROOT) -> dict[str, str]:
    """MLflow tags naming the code: the standard commit tag plus the dirty flag."""
    state = git_state(root)
    if state is None:
        return {GIT_COMMIT_TAG: "unknown", GIT_DIRTY_TAG: "unknown"}
    return {GIT_COMMIT_TAG: state.commit, GIT_DIRTY_TAG: str(state.dirty).lower()}


def process_tags() -> dict[str, str]:
    """Who holds a run open: this host, this pid and the pid's start time (pids are reused)."""
    return {
        HOST_TAG: socket.gethostname(),
        PID_TAG: str(os.getpid()),
        PID_START_TAG: f"{start_time(os.getpid()):.2f}",
    }


def holder_alive(tags: dict[str, str]) -> bool:
    """Whether the process named by a run's process tags still runs (True when it is on another host)."""
    if tags.get(HOST_TAG) != socket.gethostname() or PID_TAG not in tags:
        return True
    try:
        return f"{start_time(int(tags[PID_TAG])):.2f}" == tags.get(PID_START_TAG)
    except (psutil.NoSuchProcess, ValueError):
        return False
