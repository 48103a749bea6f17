"""The DVC pipeline (``dvc.yaml``) as data, and DVC's content hashes, for the flow and the tracker.

``dvc.yaml`` is the one statement of what each phase depends on: its deps (code and data) and the
params keys it reads. The Prefect flow keys its phase cache on the same deps and params
(:func:`stage_fingerprint`), so the two orchestrators agree about when a phase must rerun, and
``tests/test_stage_deps.py`` checks the deps against the import graph of each stage's code.
:func:`dvc_md5` computes the hash DVC records for a file or folder (``dvc.lock``), so an MLflow
run names the exact datasets it read and wrote.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agentflow_core.config import AgentFlowConfig

REPO_ROOT = Path(__file__).resolve().parents[1]
DVC_YAML = REPO_ROOT / "dvc.yaml"
SKIPPED_PARTS = frozenset({"__pycache__"})


@dataclass(frozen=True)
class Stage:
    """One ``dvc.yaml`` stage: its command, dependency paths, params keys and output paths."""

    name: str
    cmd: str
    deps: tuple[str, ...]
    params: tuple[str, ...]
    outs: tuple[str, ...]


def load_stages(path: Path = DVC_YAML) -> dict[str, Stage]:
    """The stages of ``dvc.yaml`` in pipeline order."""
    stages = yaml.safe_load(path.read_text(encoding="utf-8"))["stages"]
    return {
        name: Stage(
            name,
            body["cmd"],
            tuple(body.get("deps", ())),
            tuple(body.get("params", ())),
            tuple(next(iter(out)) if isinstance(out, dict) else out for out in body.get("outs", ())),
        )
        for name, body in stages.items()
    }


def _file_md5(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "md5").hexdigest()


def dvc_md5(path: Path) -> str:
    """The md5 DVC 3 records for ``path``: a file's md5, or ``<md5 of the sorted file listing>.dir``."""
    path = Path(path)
    if path.is_file():
        return _file_md5(path)
    entries = [
        {"md5": _file_md5(p), "relpath": posixpath.join(*p.relative_to(path).parts)}
        for p in path.rglob("*")
        if p.is_file() and SKIPPED_PARTS.isdisjoint(p.relative_to(path).parts)
    ]
    entries.sort(key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"


def resolve_dep(cfg: AgentFlowConfig, dep: str) -> Path:
    """Where a ``dvc.yaml`` path lives for this config: ``data/`` and the env registry (``configs/.../envs``)
    follow ``base``."""
    head, _, rest = dep.partition("/")
    if head == "data":
        return Path(cfg.base.data_dir) / rest
    if head == "configs" and dep.endswith("/envs"):
        return Path(cfg.base.env_config_dir)
    return REPO_ROOT / dep


def params_subset(cfg: AgentFlowConfig, keys: tuple[str, ...]) -> dict[str, Any]:
    """The values of dotted params keys (``base.seed``, ``train``) from the validated config."""
    dump = cfg.model_dump(mode="json")
    out: dict[str, Any] = {}
    for key in keys:
        value: Any = dump
        for part in key.split("."):
            value = value[part]
        out[key] = value
    return out


def stage_fingerprint(cfg: AgentFlowConfig, name: str) -> str:
    """sha256 over a stage's deps (DVC md5s) and params values: changes exactly when DVC would rerun it."""
    stage = load_stages()[name]
    deps = {dep: dvc_md5(resolve_dep(cfg, dep)) for dep in stage.deps if resolve_dep(cfg, dep).exists()}
    body = json.dumps({"deps": deps, "params": params_subset(cfg, stage.params)}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()


def params_hash(cfg: AgentFlowConfig) -> str:
    """sha256 of the whole validated config (defaults filled in): equal hashes, equal runs."""
    return hashlib.sha256(json.dumps(cfg.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()
