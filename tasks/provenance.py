"""What a tracked run records about where it came from: code commit, business process, host.

The business process's provenance (:func:`process_provenance`): its YAML, its channels' mappings and
env configs as files, and per channel the package version (or the module's hash) of the code that runs
it, so a run can be traced to the exact process definition and channel code it trained on.

The host process tags (host, pid, process start time) let the next run tell a run whose process
was killed (SIGKILL, OOM, power loss: nothing could close it) from one still running
elsewhere, and close it as KILLED (:meth:`tasks.tracking.MlflowTracker.close_orphans`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import socket
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import psutil

from agentflow_core.config import AgentFlowConfig
from agentflow_core.procs import start_time
from tasks.stages import REPO_ROOT

GIT_COMMIT_TAG = "mlflow.source.git.commit"  # MLflow's standard tag: the UI links it
GIT_DIRTY_TAG = "agentflow.git.dirty"
HOST_TAG, PID_TAG, PID_START_TAG = "agentflow.host", "agentflow.pid", "agentflow.pid_start"


PIPELINE_OUTPUTS = (":(exclude)data", ":(exclude)dvc.lock")  # written by runs (metrics files, DVC's record)
CONFIG_DIR = "configs"  # processes, mappings, env configs: a new, untracked file there changes what runs
PROCESS_TAG = "agentflow.process"


@dataclass(frozen=True)
class GitState:
    """The commit of the code that runs, and whether it differs: tracked files (pipeline outputs aside) or configs/.

    An untracked file under ``configs/`` (a new process, mapping or env config) counts as dirty too.
    """

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
        untracked = subprocess.run(
            ["git", "ls-files", "--others", "--exclude-standard", "--", CONFIG_DIR],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return GitState(commit, bool(status.strip() or untracked.strip()))


def git_tags(root: Path = REPO_ROOT) -> dict[str, str]:
    """MLflow tags naming the code: the standard commit tag plus the dirty flag."""
    state = git_state(root)
    if state is None:
        return {GIT_COMMIT_TAG: "unknown", GIT_DIRTY_TAG: "unknown"}
    return {GIT_COMMIT_TAG: state.commit, GIT_DIRTY_TAG: str(state.dirty).lower()}


@dataclass(frozen=True)
class ProcessProvenance:
    """The files that define a run's business process and the tags naming its channels' code."""

    files: dict[str, Path] = field(default_factory=dict)  # artifact folder -> file
    tags: dict[str, str] = field(default_factory=dict)

    def artifacts(self) -> list[tuple[Path, str]]:
        """(file, artifact folder) pairs, each file once."""
        return [(path, folder.rsplit("/", 1)[0]) for folder, path in sorted(self.files.items())]


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def code_version(class_path: str) -> str:
    """``<distribution>==<version>`` of the package a class path lives in, else ``sha256:<module file hash>``.

    The project's own packages are editable installs of this checkout: their code is pinned by the git
    commit and the module hash says which file ran.
    """
    module = class_path.split(":", 1)[0]
    top = module.split(".", 1)[0]
    for dist in metadata.packages_distributions().get(top, []):
        if top not in {"agentflow_core", "agentflow_refund", "tasks", "flows"}:
            return f"{dist}=={metadata.version(dist)}"
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    return f"sha256:{file_sha256(Path(origin))[:16]}" if origin and Path(origin).is_file() else "unknown"


def process_provenance(cfg: AgentFlowConfig) -> ProcessProvenance:
    """The selected process's YAML, its mappings and env configs, and each channel's code version."""
    from tasks.process_io import load_process
    from tasks.registry_io import load_registry

    process = load_process(cfg)
    files: dict[str, Path] = {f"process/{Path(process.source).name}": Path(process.source)}
    tags = {PROCESS_TAG: process.name, f"{PROCESS_TAG}.sha256": file_sha256(Path(process.source))[:16]}
    registry = load_registry(cfg)
    for env_id in cfg.variants.base_envs:
        entry = registry.get(env_id)
        files[f"env_configs/{Path(entry.source_file).name}"] = Path(entry.source_file)
        files[f"mappings/{Path(entry.mapping_path).name}"] = Path(entry.mapping_path)
        prefix = f"agentflow.channel.{env_id}"
        tags[f"{prefix}.class_path"] = entry.class_path
        tags[f"{prefix}.version"] = code_version(entry.class_path)
        tags[f"{prefix}.mapping_sha256"] = file_sha256(Path(entry.mapping_path))[:16]
    return ProcessProvenance(files, tags)


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
