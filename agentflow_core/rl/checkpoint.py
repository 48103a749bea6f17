"""Atomic, code-free training checkpoints that resume bit-identically.

Layout of one checkpoint directory ``<root>/update_<NNNNNNNN>/``:

* ``model.safetensors`` -- the policy's state dict;
* ``state.safetensors`` -- optimizer moments, the sampling generator and torch's global RNG state;
* ``state.json`` -- global step, update index, numpy ``bit_generator`` state, python ``random``
  state, adaptive controller, scheduler, reward normaliser, best-so-far metric, policy hash,
  vocabulary version and any caller extras.

Nothing is pickled, so loading a checkpoint cannot execute code. A save writes everything into a
hidden temp directory and publishes it with one ``os.replace``; ``latest.json`` / ``best.json``
pointers are replaced the same way. A crash mid-save therefore leaves the previous checkpoint and
pointer untouched (at worst a stale ``.tmp-*`` directory, removed by the next save).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agentflow_core.rl.policy import policy_hash
from agentflow_core.rl.ppo import PPO
from agentflow_core.semantics import VOCAB_VERSION

MODEL_FILE = "model.safetensors"
TENSORS_FILE = "state.safetensors"
STATE_FILE = "state.json"
LATEST = "latest.json"
BEST = "best.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: plain tensors and JSON, no live objects."""

    path: Path
    model: dict[str, torch.Tensor]
    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(f".tmp-{path.name}-{uuid.uuid4().hex}")
    with open(tmp, "w") as fh:
        json.dump(payload, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def save_checkpoint(
    root: Path, name: str, model: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> Path:
    """Write one checkpoint directory atomically and point ``latest.json`` at it."""
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
    tmp = root / f".tmp-{name}-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        save_file(_contiguous(model), str(tmp / MODEL_FILE))
        save_file(_contiguous(tensors), str(tmp / TENSORS_FILE))
        with open(tmp / STATE_FILE, "w") as fh:
            json.dump(state, fh, indent=1, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        _fsync_dir(tmp)
        final = root / name
        if final.exists():  # re-saving the same update: move the old copy aside first
            trash = root / f".tmp-old-{name}-{uuid.uuid4().hex}"
            os.replace(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(root)
    _write_json_atomic(root / LATEST, {"name": name})
    return final


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint directory (safetensors + JSON only; refuses other vocabularies)."""
    state = json.loads((path / STATE_FILE).read_text())
    if state.get("vocab_version") != VOCAB_VERSION:
        raise ValueError(
            f"{path}: vocab_version {state.get('vocab_version')!r} != {VOCAB_VERSION!r}; the encoding changed"
        )
    return Checkpoint(path, load_file(str(path / MODEL_FILE)), load_file(str(path / TENSORS_FILE)), state)


def _pointer(root: Path, pointer: str) -> Path | None:
    file = root / pointer
    if not file.exists():
        return None
    target = root / json.loads(file.read_text())["name"]
    return target if target.is_dir() else None


def latest_checkpoint(root: Path) -> Path | None:
    """The directory ``latest.json`` names, or None when there is no complete checkpoint."""
    return _pointer(root, LATEST)


def best_checkpoint(root: Path) -> Path | None:
    """The directory ``best.json`` names (best held-out evaluation so far)."""
    return _pointer(root, BEST)


def capture_global_rng() -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """Python ``random`` (JSON) and torch's global RNG (tensor) states."""
    version, internal, gauss = random.getstate()
    return {"python_random": [version, list(internal), gauss]}, {"rng/torch_global": torch.get_rng_state()}


def restore_global_rng(state: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """Inverse of :func:`capture_global_rng`."""
    version, internal, gauss = state["python_random"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(tensors["rng/torch_global"])


class CheckpointManager:
    """Saves a :class:`PPO` learner every K updates and every T minutes, keeps the last few and the best."""

    def __init__(
        self,
        root: Path,
        every_updates: int,
        every_minutes: float,
        keep_last: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root, self.every_updates, self.every_s, self.keep_last = (
            Path(root),
            every_updates,
            every_minutes * 60.0,
            keep_last,
        )
        self.clock = clock
        self._last_save_t = clock()

    def due(self, update: int) -> bool:
        """Checkpoint now? (``update`` counts completed updates; saves happen between updates.)"""
        return update % self.every_updates == 0 or self.clock() - self._last_save_t >= self.every_s

    def save(self, ppo: PPO, best_metric: float | None = None, extra: dict[str, Any] | None = None) -> Path:
        """Snapshot everything the learner's future depends on."""
        rng_json, rng_tensors = capture_global_rng()
        state = {
            "format_version": FORMAT_VERSION,
            "vocab_version": VOCAB_VERSION,
            "policy_hash": policy_hash(ppo.policy),
            "hidden_sizes": list(ppo.policy.hidden_sizes),
            "best_metric": best_metric,
            "ppo": ppo.state_json(),
            "extra": extra or {},
            **rng_json,
        }
        path = save_checkpoint(
            self.root,
            f"update_{ppo.update:08d}",
            ppo.policy.state_dict(),
            {**ppo.state_tensors(), **rng_tensors},
            state,
        )
        self._last_save_t = self.clock()
        self._prune()
        return path

    def mark_best(self, path: Path) -> None:
        """Point ``best.json`` at a saved checkpoint (pruning never deletes it)."""
        _write_json_atomic(self.root / BEST, {"name": path.name})

    def _prune(self) -> None:
        keep = {p for p in (latest_checkpoint(self.root), best_checkpoint(self.root)) if p is not None}
        saved = sorted(p for p in self.root.glob("update_*") if p.is_dir())
        keep.update(saved[-self.keep_last :])
        for p in saved:
            if p not in keep:
                shutil.rmtree(p, ignore_errors=True)


def restore_ppo(ppo: PPO, ckpt: Checkpoint, restore_rng: bool = True, restore_optimizer: bool = True) -> None:
    """Load weights, optimizer, generators and controller/normaliser/scheduler state into ``ppo``."""
    ppo.policy.load_state_dict(ckpt.model)
    ppo.load_state(ckpt.state["ppo"], ckpt.tensors, restore_rng=restore_rng, restore_optimizer=restore_optimizer)
    if restore_rng:
        restore_global_rng(ckpt.state, ckpt.tensors)
