"""Three disjoint splits of the variant catalogue: train, validation (model selection), test (reporting).

The split is computed once, with the catalogue (the variants phase), and stored beside it as
``splits.json`` (lists of content hashes), so DVC versions it with the catalogue and every later
phase reads the same one. It is stratified: variants are grouped into cells (family × every
dimension's value), the cells are visited in a seeded order and each variant goes to the split
furthest below its share so far (largest-deficit apportionment, so every cell is split in
proportion and the totals are exact). A repair pass then moves a train variant into validation or
test for any (family, dimension value) stratum that split would otherwise miss, when the stratum
has a train variant to spare. Exploration, behaviour cloning and PPO read ``train`` only;
validation picks the checkpoint; test is read only to report.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.errors import DATA_ERRORS, DataFileError
from agentflow_core.variants import VariantSpec, catalogue_counts, read_catalogue, read_meta, write_catalogue

SPLITS = ("train", "validation", "test")
SPLIT_FILE = "splits.json"


def _cell(variant: VariantSpec, dimensions: Sequence[str]) -> tuple[str, ...]:
    return (variant.family, *(str(variant.params.get(d)) for d in dimensions))


def _strata(variant: VariantSpec, dimensions: Sequence[str]) -> list[tuple[str, str, str]]:
    return [(variant.family, d, str(variant.params.get(d))) for d in dimensions]


def assign_splits(
    variants: Sequence[VariantSpec], validation: float, test: float, dimensions: Sequence[str], seed: int
) -> dict[str, list[str]]:
    """Split name -> content hashes (catalogue order), deterministic from ``seed``."""
    rng = np.random.default_rng(seed)
    cells: dict[tuple[str, ...], list[VariantSpec]] = {}
    for v in sorted(variants, key=lambda v: v.content_hash):
        cells.setdefault(_cell(v, dimensions), []).append(v)
    keys = sorted(cells)
    shares = np.array([1.0 - validation - test, validation, test])
    counts = np.zeros(3)
    split_of: dict[str, int] = {}
    for k in rng.permutation(len(keys)):
        members = cells[keys[k]]
        for i in rng.permutation(len(members)):
            deficit = shares * (counts.sum() + 1) - counts
            chosen = int(np.argmax(deficit))
            counts[chosen] += 1
            split_of[members[i].content_hash] = chosen
    _repair(variants, dimensions, split_of)
    out: dict[str, list[str]] = {name: [] for name in SPLITS}
    for v in variants:
        out[SPLITS[split_of[v.content_hash]]].append(v.content_hash)
    return out


def _repair(variants: Sequence[VariantSpec], dimensions: Sequence[str], split_of: dict[str, int]) -> None:
    """Give validation and test a variant of every (family, dimension value) stratum that has one to spare."""
    by_stratum: dict[tuple[str, str, str], list[VariantSpec]] = {}
    for v in sorted(variants, key=lambda v: v.content_hash):
        for stratum in _strata(v, dimensions) or [(v.family, "", "")]:
            by_stratum.setdefault(stratum, []).append(v)
    for split in (1, 2):
        for stratum in sorted(by_stratum):
            members = by_stratum[stratum]
            if any(split_of[v.content_hash] == split for v in members):
                continue
            spare = [v for v in members if split_of[v.content_hash] == 0]
            if len(spare) >= 2:
                split_of[spare[0].content_hash] = split


def split_card(
    variants: Sequence[VariantSpec], splits: Mapping[str, Sequence[str]], dimensions: Sequence[str]
) -> dict[str, Any]:
    """Per split: its size and counts by family and dimension value (for the catalogue card)."""
    by_hash = {v.content_hash: v for v in variants}
    return {name: catalogue_counts([by_hash[h] for h in hashes], list(dimensions)) for name, hashes in splits.items()}


def splits_json(splits: Mapping[str, Sequence[str]], meta: Mapping[str, Any]) -> str:
    """The text of ``splits.json``: the hashes per split and how they were drawn."""
    return json.dumps({**dict(meta), "splits": {name: list(splits[name]) for name in SPLITS}}, sort_keys=True) + "\n"


def write_split_catalogue(
    variants: Sequence[VariantSpec],
    out_dir: Path | str,
    meta: Mapping[str, Any],
    *,
    validation: float,
    test: float,
    seed: int,
    dimensions: Sequence[str],
) -> tuple[Path, dict[str, list[str]]]:
    """Split ``variants`` over ``dimensions`` and write the catalogue with its ``splits.json`` (one atomic directory).

    The card's ``split`` entry holds the fractions, seed, dimensions and per-split counts. Returns
    the parquet path and the split.
    """
    dims = sorted(dimensions)
    splits = assign_splits(variants, validation, test, dims, seed)
    drawn = {"seed": seed, "validation": validation, "test": test, "dimensions": dims}
    card = {**dict(meta), "split": {**drawn, "file": SPLIT_FILE, "counts": split_card(variants, splits, dims)}}
    return write_catalogue(variants, out_dir, card, {SPLIT_FILE: splits_json(splits, drawn)}), splits


def read_splits(catalogue: Path | str) -> dict[str, list[VariantSpec]]:
    """The catalogue's variants per split (catalogue order), checked to be disjoint and complete."""
    path = Path(catalogue)
    directory = path if path.is_dir() else path.parent
    file = directory / SPLIT_FILE
    variants = read_catalogue(path)
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        hashes = {name: set(data["splits"][name]) for name in SPLITS}
    except DATA_ERRORS as exc:
        raise DataFileError(file, f"no readable train/validation/test split ({type(exc).__name__}: {exc})") from None
    known = {v.content_hash for v in variants}
    union = set().union(*hashes.values())
    if sum(map(len, hashes.values())) != len(union) or union != known:
        raise DataFileError(file, "splits are not a disjoint cover of the catalogue: rerun `agentflow variants`")
    out = {name: [v for v in variants if v.content_hash in hashes[name]] for name in SPLITS}
    empty = [name for name, members in out.items() if not members]
    if empty:
        raise DataFileError(file, f"split(s) {', '.join(empty)} hold no variant: raise the catalogue size or fractions")
    return out


def channel_catalogue(catalogue: Path | str, out_dir: Path | str, base_envs: Collection[str]) -> Path:
    """The catalogue's variants of the channels ``base_envs`` only, each in the split it already had.

    Splits are not redrawn: a channel's test variants stay exactly the test variants of the full
    catalogue, so a policy trained on the other channels' train split never saw them. Returns
    ``out_dir`` (the catalogue directory the steps read).
    """
    directory = Path(catalogue) if Path(catalogue).is_dir() else Path(catalogue).parent
    splits = read_splits(directory)
    kept = {name: [v for v in members if v.base_env_id in base_envs] for name, members in splits.items()}
    drawn = json.loads((directory / SPLIT_FILE).read_text(encoding="utf-8"))
    drawn.pop("splits", None)
    hashes = {name: [v.content_hash for v in members] for name, members in kept.items()}
    meta = {**read_meta(directory), "channels": sorted(base_envs)}
    variants = [v for v in read_catalogue(directory) if v.base_env_id in base_envs]
    write_catalogue(variants, out_dir, meta, {SPLIT_FILE: splits_json(hashes, drawn)})
    return Path(out_dir)
