"""The versioned trajectory dataset across cycles: a retrain appends its shards instead of replacing them.

``data/trajectories`` stays one dataset directory that :func:`agentflow_core.rl.trajectories.read_steps`
reads whole (so behaviour cloning sees every cycle's episodes). Appending rebuilds it atomically
(:func:`agentflow_core.atomic.atomic_dir`, the earlier shards hard-linked, never rewritten) with one card whose
``shards`` entries each name the ``cycle`` (the MLflow parent run id) and ``seed`` that wrote them,
and whose ``cycles`` list holds one lineage entry per cycle: rows, episodes, seed, behaviour policy,
catalogue, commit. Shards an earlier, non-retrain cycle wrote are labelled with that card's
``cycle`` or ``"initial"``. The totals (``rows``, ``episodes``, ``rows_per_env``, ...) cover every cycle.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from agentflow_core.atomic import atomic_dir, write_json
from agentflow_core.rl.trajectories import META_FILE, read_card

INITIAL_CYCLE = "initial"
_SUMMED = ("rows", "episodes", "goal_episodes")
_COUNTED = ("rows_per_env", "failure_reasons")
_LINEAGE = ("phase", "behaviour", "catalogue_sha256", "git_commit", "split", "reward_mode", "vocab_version")


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _lineage(card: dict[str, Any], cycle: str, seed: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"cycle": cycle, "seed": seed, "shards": len(card["shards"])}
    entry.update({k: card.get(k) for k in (*_SUMMED, "policy_hashes", *_LINEAGE)})
    entry["seeds"] = card.get("seeds", [])
    return entry


def dataset_seeds(dataset: Path) -> set[int]:
    """Every seed the dataset's episodes were collected with (empty when there is no dataset)."""
    if not (Path(dataset) / META_FILE).is_file():
        return set()
    return {int(s) for s in read_card(dataset).get("seeds", [])}


def visit_counts(dataset: Path) -> dict[str, int]:
    """Rows per env id over every cycle of the dataset (how often exploration has visited each variant)."""
    if not (Path(dataset) / META_FILE).is_file():
        return {}
    return {str(k): int(v) for k, v in read_card(dataset).get("rows_per_env", {}).items()}


def append_cycle(dataset: Path, new: Path, cycle: str, seed: int) -> dict[str, Any]:
    """Append the shards of the freshly written dataset ``new`` to ``dataset`` as cycle ``cycle``; returns the card."""
    dataset, new = Path(dataset), Path(new)
    new_card = read_card(new)
    old_card = read_card(dataset) if (dataset / META_FILE).is_file() else None
    if old_card is not None and set(old_card.get("seeds", [])) & set(new_card.get("seeds", [])):
        raise ValueError(f"cycle {cycle} reused a seed already in {dataset}: its episode ids would collide")
    shards: list[dict[str, Any]] = []
    cycles: list[dict[str, Any]] = []
    with atomic_dir(dataset) as tmp:
        if old_card is not None:
            first = str(old_card.get("cycle", INITIAL_CYCLE))
            cycles = list(old_card.get("cycles") or [_lineage(old_card, first, None)])
            for shard in old_card["shards"]:
                _link_or_copy(dataset / shard["file"], tmp / shard["file"])
                shards.append({"cycle": first, **shard})
        index = len(cycles)
        for shard in new_card["shards"]:
            name = f"cycle-{index:03d}-{shard['file']}"
            _link_or_copy(new / shard["file"], tmp / name)
            shards.append({**shard, "file": name, "cycle": cycle, "seed": seed})
        if (new / "coverage.json").is_file():
            shutil.copy2(new / "coverage.json", tmp / "coverage.json")
        cycles.append({**_lineage(new_card, cycle, seed), "appended_at": time.time()})
        card = _merged(old_card, new_card, shards, cycles)
        write_json(tmp / META_FILE, card)
    return card


def _merged(
    old: dict[str, Any] | None, new: dict[str, Any], shards: list[dict[str, Any]], cycles: list[dict[str, Any]]
) -> dict[str, Any]:
    cards = [c for c in (old, new) if c is not None]
    card = {k: v for k, v in new.items() if k not in ("cycle", "mlflow_run_id", "cycle_seed")}
    for key in _SUMMED:
        card[key] = sum(int(c.get(key, 0)) for c in cards)
    for key in _COUNTED:
        total: Counter[str] = Counter()
        for c in cards:
            total.update({str(k): int(v) for k, v in c.get(key, {}).items()})
        card[key] = dict(sorted(total.items()))
    card["env_versions"] = dict(sorted({k: v for c in cards for k, v in c.get("env_versions", {}).items()}.items()))
    card["policy_hashes"] = sorted({h for c in cards for h in c.get("policy_hashes", [])})
    card["seeds"] = sorted({int(s) for c in cards for s in c.get("seeds", [])})
    card["shards"] = shards
    card["cycles"] = cycles
    return card
