"""Atomic, code-free training checkpoints that resume bit-identically.

Layout of one checkpoint directory ``<root>/update_<NNNNNNNN>/``:

* ``model.safetensors`` -- the policy's state dict;
* ``state.safetensors`` -- optimizer moments, the sampling generator and torch's global RNG state;
* ``state.json`` -- global step, update index, numpy ``bit_generator`` state, python ``random``
  state, adaptive controller, scheduler, reward normaliser, best-so-far metric, policy hash,
  vocabulary version and any caller extras.

Nothing is pickled, so loading a checkpoint cannot execute code. Loading validates before it
allocates: ``state.json`` size and structure, the safetensors headers (length, offsets inside the
file) and the model's tensor shapes against ``hidden_sizes`` (a forged ``state.json`` must not
make a caller build a 160 GB network). Any damage is one :class:`CheckpointError`;
:func:`load_intact` then falls back to the newest intact checkpoint and logs what it skipped.
Pointer files name a directory inside their root and nothing else. A save writes everything into a
hidden temp directory and publishes it with one ``os.replace``; ``latest.json`` / ``best.json``
pointers are replaced the same way. A crash mid-save therefore leaves the previous checkpoint and
pointer untouched (at worst a stale ``.tmp-*`` directory, removed by the next save).
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from agentflow_core.atomic import atomic_dir, remove_stale, write_json
from agentflow_core.config import MAX_LAYERS, MAX_WIDTH
from agentflow_core.errors import AgentFlowError, NonFiniteError
from agentflow_core.rl.policy import policy_hash
from agentflow_core.rl.ppo import PPO
from agentflow_core.semantics import Vocabulary

logger = logging.getLogger("agentflow.checkpoint")

MODEL_FILE = "model.safetensors"
TENSORS_FILE = "state.safetensors"
STATE_FILE = "state.json"
LATEST = "latest.json"
BEST = "best.json"
FORMAT_VERSION = 1
MAX_STATE_BYTES = 64 << 20
MAX_HEADER_BYTES = 16 << 20
MAX_POINTER_BYTES = 4096
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")


class CheckpointError(AgentFlowError, ValueError):
    """A checkpoint directory is missing a file, damaged, or does not fit the configured network."""

    def __init__(self, path: Path, reason: str) -> None:
        self.path, self.reason = path, reason
        super().__init__(f"checkpoint {path}: {reason}")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: plain tensors and JSON, no live objects."""

    path: Path
    model: dict[str, torch.Tensor]
    tensors: dict[str, torch.Tensor]
    state: dict[str, Any]


def _contiguous(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in tensors.items()}


def save_checkpoint(
    root: Path, name: str, model: dict[str, torch.Tensor], tensors: dict[str, torch.Tensor], state: dict[str, Any]
) -> Path:
    """Write one checkpoint directory atomically and point ``latest.json`` at it (never a non-finite model)."""
    for key, value in model.items():
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise NonFiniteError(int(state.get("ppo", {}).get("update", -1)), f"parameter {key}", "refused to save")
    root.mkdir(parents=True, exist_ok=True)
    remove_stale(root)
    with atomic_dir(root / name) as tmp:
        save_file(_contiguous(model), str(tmp / MODEL_FILE))
        save_file(_contiguous(tensors), str(tmp / TENSORS_FILE))
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1, sort_keys=True), encoding="utf-8")
    write_json(root / LATEST, {"name": name}, indent=1)
    return root / name


def model_shapes(hidden_sizes: Sequence[int], vocabulary: Vocabulary) -> dict[str, tuple[int, ...]]:
    """The state-dict shapes of ``ActorCritic(hidden_sizes=...)`` over ``vocabulary``, computed without building it."""
    shapes: dict[str, tuple[int, ...]] = {}
    for tower, out in (("critic", 1), ("actor", vocabulary.n_actions)):
        dims = [vocabulary.obs_dim, *hidden_sizes, out]
        for i in range(len(dims) - 1):
            shapes[f"{tower}.{2 * i}.weight"] = (dims[i + 1], dims[i])
            shapes[f"{tower}.{2 * i}.bias"] = (dims[i + 1],)
    return shapes


def _read_state(path: Path, vocabulary: Vocabulary) -> dict[str, Any]:
    file = path / STATE_FILE
    try:
        too_large = file.stat().st_size > MAX_STATE_BYTES
        state = None if too_large else json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError, MemoryError) as exc:
        raise CheckpointError(path, f"{STATE_FILE} unreadable: {type(exc).__name__}: {str(exc)[:200]}") from None
    if too_large:
        raise CheckpointError(path, f"{STATE_FILE} is larger than {MAX_STATE_BYTES} bytes")
    if not isinstance(state, dict):
        raise CheckpointError(path, f"{STATE_FILE} holds {type(state).__name__}, expected an object")
    if state.get("vocab_version") != vocabulary.version:
        raise CheckpointError(
            path,
            f"vocab_version {str(state.get('vocab_version'))[:40]!r} != {vocabulary.version!r}; the encoding changed",
        )
    sizes = state.get("hidden_sizes")
    if not (
        isinstance(sizes, list)
        and 1 <= len(sizes) <= MAX_LAYERS
        and all(isinstance(h, int) and not isinstance(h, bool) and 0 < h <= MAX_WIDTH for h in sizes)
    ):
        raise CheckpointError(
            path, f"hidden_sizes {str(sizes)[:80]} outside 1..{MAX_LAYERS} layers of 1..{MAX_WIDTH} units"
        )
    return state


def _safetensors_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Tensor shapes from a safetensors header, after checking it fits the file (no tensor is read)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            prefix = fh.read(8)
            n = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
            if not 0 < n <= min(MAX_HEADER_BYTES, size - 8):
                raise CheckpointError(file.parent, f"{file.name}: header length {n} does not fit a {size}-byte file")
            header = json.loads(fh.read(n))
    except (OSError, ValueError, RecursionError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(file.parent, f"{file.name} unreadable: {type(exc).__name__}: {str(exc)[:200]}") from None
    if not isinstance(header, dict):
        raise CheckpointError(file.parent, f"{file.name}: header is not an object")
    data_bytes = size - 8 - n
    shapes: dict[str, tuple[int, ...]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets, shape = (info.get("data_offsets"), info.get("shape")) if isinstance(info, dict) else (None, None)
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(isinstance(o, int) for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_bytes
            and isinstance(shape, list)
            and all(isinstance(d, int) and d >= 0 for d in shape)
        ):
            raise CheckpointError(file.parent, f"{file.name}: tensor {str(name)[:80]!r} lies outside the file")
        shapes[name] = tuple(shape)
    return shapes


def load_checkpoint(path: Path, hidden_sizes: Sequence[int] | None = None, *, vocabulary: Vocabulary) -> Checkpoint:
    """Read and validate a checkpoint directory (safetensors + JSON only; refuses other vocabularies than ``vocabulary``).

    ``hidden_sizes`` (the configured network) must match the checkpoint's when given; either way the
    model tensors must have exactly the shapes its own ``hidden_sizes`` imply. Damage raises
    :class:`CheckpointError` before any tensor is allocated.
    """
    path = Path(path)
    state = _read_state(path, vocabulary)
    if hidden_sizes is not None and list(hidden_sizes) != state["hidden_sizes"]:
        raise CheckpointError(path, f"hidden_sizes {state['hidden_sizes']} != configured {list(hidden_sizes)}")
    expected = model_shapes(state["hidden_sizes"], vocabulary)
    found = _safetensors_shapes(path / MODEL_FILE)
    if found != expected:
        wrong = sorted(set(found) ^ set(expected) | {k for k in found if k in expected and found[k] != expected[k]})
        raise CheckpointError(
            path, f"{MODEL_FILE}: tensors {wrong[:4]} do not match hidden_sizes {state['hidden_sizes']}"
        )
    _safetensors_shapes(path / TENSORS_FILE)
    try:
        model, tensors = load_file(str(path / MODEL_FILE)), load_file(str(path / TENSORS_FILE))
    except Exception as exc:  # safetensors raises its own SafetensorError for any inconsistency left
        raise CheckpointError(path, f"unreadable tensors: {type(exc).__name__}: {str(exc)[:200]}") from None
    return Checkpoint(path, model, tensors, state)


def _pointer(root: Path, pointer: str) -> Path | None:
    """The directory a pointer file names: a plain name of a directory directly inside ``root``, else None."""
    file = root / pointer
    try:
        if not file.is_file() or file.stat().st_size > MAX_POINTER_BYTES:
            return None
        name = json.loads(file.read_text(encoding="utf-8")).get("name")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        return None
    target = root / name
    return target if target.is_dir() and target.resolve().parent == root.resolve() else None


def _inside(root: Path, candidate: Path) -> bool:
    """A real directory directly inside ``root``: a symlink (to a folder elsewhere) is never a checkpoint."""
    return candidate.is_dir() and not candidate.is_symlink() and candidate.resolve().parent == root.resolve()


def load_intact(
    root: Path, pointer: str = LATEST, hidden_sizes: Sequence[int] | None = None, *, vocabulary: Vocabulary
) -> Checkpoint | None:
    """The checkpoint ``pointer`` names, else the newest intact one; None when ``root`` holds none.

    Each damaged candidate is logged and skipped (``keep_last`` keeps older ones for exactly this);
    when every candidate is damaged, :class:`CheckpointError` lists the first reasons.
    """
    root = Path(root)
    named = _pointer(root, pointer)
    if (root / pointer).exists() and named is None:
        logger.warning("checkpoint: ignoring %s (not a pointer to a directory inside %s)", root / pointer, root)
    saved = sorted((p for p in root.glob("update_*") if _inside(root, p)), reverse=True) if root.is_dir() else []
    candidates = [named] + [p for p in saved if p != named] if named is not None else saved
    skipped: list[str] = []
    for candidate in candidates:
        try:
            ckpt = load_checkpoint(candidate, hidden_sizes, vocabulary=vocabulary)
        except CheckpointError as exc:
            logger.warning("checkpoint: skipping damaged %s", exc)
            skipped.append(exc.reason)
            continue
        if skipped:
            logger.warning("checkpoint: using %s instead of %d damaged newer one(s)", candidate, len(skipped))
        return ckpt
    if skipped:
        raise CheckpointError(root, f"no intact checkpoint among {len(skipped)}: {'; '.join(skipped[:3])}")
    return None


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
        *,
        vocabulary: Vocabulary,
    ) -> None:
        self.vocabulary = vocabulary  # its version is stored with every checkpoint (load refuses another)
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
            "vocab_version": self.vocabulary.version,
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
        write_json(self.root / BEST, {"name": path.name}, indent=1)

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
