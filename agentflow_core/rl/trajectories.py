"""Columnar trajectory shards: one parquet row per env step, a ``_meta.json`` card, episode reader.

Row = one transition ``(s_t, a_t) → s_{t+1}``: ``obs``/``action_mask`` describe ``s_t`` (what
the policy saw, so behaviour cloning can use the rows directly); ``tokens``, ``terminated``,
``truncated``, ``failure_reason`` and the rewards describe the step's outcome ``s_{t+1}``.
``step_id`` is the env's step counter after the action (1 for the first action of an episode).

Shards are written atomically (temporary file + ``os.replace``), so a crash never leaves a
truncated parquet file under its final name; the card lists every shard with its row count and
sha256 so readers (and DVC) can verify them. Episodes may straddle shards; the reader
regroups them by ``episode_id``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from agentflow_core.atomic import atomic_file, write_text
from agentflow_core.errors import DATA_ERRORS, DataFileError
from agentflow_core.semantics import Vocabulary

SCHEMA_VERSION = 1
META_FILE = "_meta.json"


def schema(vocabulary: Vocabulary) -> pa.Schema:
    """The step-row schema over ``vocabulary``'s widths."""
    return pa.schema(
        [
            *_COLUMNS[:8],
            ("obs", pa.list_(pa.float32(), vocabulary.obs_dim)),
            ("action_mask", pa.list_(pa.bool_(), vocabulary.n_actions)),
            *_COLUMNS[8:],
        ]
    )


_COLUMNS: list[tuple[str, pa.DataType]] = [
    ("episode_id", pa.string()),
    ("env_id", pa.string()),
    ("variant_hash", pa.string()),
    ("env_version", pa.string()),
    ("policy_hash", pa.string()),
    ("seed", pa.int64()),
    ("timestamp", pa.float64()),  # unix seconds
    ("step_id", pa.int32()),
    ("action", pa.int16()),
    ("explored", pa.bool_()),  # True when the action was the ε-random one
    ("tokens", pa.list_(pa.string())),
    ("reward", pa.float32()),  # total training reward (base + shaping)
    ("env_reward", pa.float32()),  # the env's business reward
    ("base_reward", pa.float32()),
    ("shaping_reward", pa.float32()),
    ("terminated", pa.bool_()),
    ("truncated", pa.bool_()),
    ("failure_reason", pa.string()),
    ("risk", pa.float32()),
]


def _sha256(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


class TrajectoryWriter:
    """Buffers rows and flushes a shard of ``shard_rows`` rows atomically; ``close`` writes the card."""

    def __init__(
        self,
        out_dir: Path,
        shard_rows: int = 50_000,
        card: Mapping[str, Any] | None = None,
        *,
        vocabulary: Vocabulary,
    ) -> None:
        self.vocabulary, self.schema = vocabulary, schema(vocabulary)
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.shard_rows = shard_rows
        self.extra_card = dict(card or {})
        self._columns: dict[str, list[Any]] = {name: [] for name in self.schema.names}
        self.shards: list[dict[str, Any]] = []
        self.rows = 0
        self._episodes: set[str] = set()
        self._goal_episodes: set[str] = set()
        self._env_versions: dict[str, str] = {}
        self._env_rows: Counter[str] = Counter()
        self._policy_hashes: set[str] = set()
        self._seeds: set[int] = set()
        self._failures: Counter[str] = Counter()

    def append(self, row: Mapping[str, Any]) -> None:
        """Add one step; every schema column must be present (``failure_reason`` may be None)."""
        for name, column in self._columns.items():
            column.append(row[name])
        self.rows += 1
        self._episodes.add(row["episode_id"])
        if row["terminated"] and self.vocabulary.goal in row["tokens"]:
            self._goal_episodes.add(row["episode_id"])
        self._env_versions[row["env_id"]] = row["env_version"]
        self._env_rows[row["env_id"]] += 1
        self._policy_hashes.add(row["policy_hash"])
        self._seeds.add(int(row["seed"]))
        if row["failure_reason"]:
            self._failures[row["failure_reason"]] += 1
        if len(self._columns["episode_id"]) >= self.shard_rows:
            self.flush()

    def flush(self) -> None:
        """Write the buffered rows as the next shard (no-op when empty)."""
        n = len(self._columns["episode_id"])
        if n == 0:
            return
        table = pa.table(self._columns, schema=self.schema)
        name = f"part-{len(self.shards):05d}.parquet"
        final = self.out_dir / name
        with atomic_file(final) as tmp:
            pq.write_table(table, tmp)
        self.shards.append({"file": name, "rows": n, "sha256": _sha256(final)})
        self._columns = {name: [] for name in self.schema.names}

    def close(self) -> dict[str, Any]:
        """Flush the tail and write ``_meta.json``; returns the card."""
        self.flush()
        card = {
            "schema_version": SCHEMA_VERSION,
            "vocab_version": self.vocabulary.version,
            "schema": {field.name: str(field.type) for field in self.schema},
            "rows": self.rows,
            "episodes": len(self._episodes),
            "goal_episodes": len(self._goal_episodes),
            "env_versions": dict(sorted(self._env_versions.items())),
            "rows_per_env": dict(sorted(self._env_rows.items())),
            "policy_hashes": sorted(self._policy_hashes),
            "seeds": sorted(self._seeds),
            "failure_reasons": dict(sorted(self._failures.items())),
            "shards": self.shards,
            **self.extra_card,
        }
        write_text(self.out_dir / META_FILE, json.dumps(card, indent=2, sort_keys=True))
        return card


def read_card(path: Path) -> dict[str, Any]:
    """The dataset card; a damaged one is a :class:`DataFileError` naming it."""
    file = Path(path) / META_FILE
    try:
        card = json.loads(file.read_text(encoding="utf-8"))
    except DATA_ERRORS as exc:
        raise DataFileError(file, f"{type(exc).__name__}: {exc}") from None
    if not isinstance(card, dict) or not isinstance(card.get("shards"), list):
        raise DataFileError(file, "expected an object with a 'shards' list")
    return card


def read_steps(path: Path, verify: bool = True, *, vocabulary: Vocabulary) -> pa.Table:
    """All rows of a dataset directory, in shard order; checksums verified against the card.

    Shard names come from the card and must name files inside ``path`` (a card is data).
    """
    path = Path(path)
    card = read_card(path)
    steps = schema(vocabulary)
    root = path.resolve()
    tables = []
    for shard in card["shards"]:
        name = shard.get("file") if isinstance(shard, dict) else None
        file = path / str(name)
        if not isinstance(name, str) or not file.resolve().is_relative_to(root) or not file.is_file():
            raise DataFileError(path / META_FILE, f"shard {str(name)[:80]!r} is not a file inside {path}")
        if verify and _sha256(file) != shard.get("sha256"):
            raise DataFileError(file, f"sha256 does not match {META_FILE}")
        try:
            table = pq.read_table(file, schema=steps)
        except (*DATA_ERRORS, pa.ArrowException) as exc:
            raise DataFileError(file, f"{type(exc).__name__}: {exc}") from None
        _require_finite(table, file)
        tables.append(table)
    return pa.concat_tables(tables) if tables else steps.empty_table()


FINITE_COLUMNS = ("obs", "reward", "env_reward", "base_reward", "shaping_reward")


def _require_finite(table: pa.Table, file: Path) -> None:
    """A shard whose numbers hold NaN/inf is damaged, whatever its checksum says (a card is data too)."""
    for name in FINITE_COLUMNS:
        column = table.column(name).combine_chunks()
        values = column.flatten() if pa.types.is_fixed_size_list(column.type) else column
        finite = np.isfinite(values.to_numpy(zero_copy_only=False))
        if not finite.all():
            width = len(finite) // max(table.num_rows, 1)
            row = int(np.flatnonzero(~finite)[0]) // max(width, 1)
            raise DataFileError(file, f"non-finite value in column {name!r} at row {row}")


@dataclass(frozen=True)
class Episode:
    """One episode's steps as arrays, ordered by ``step_id``."""

    episode_id: str
    env_id: str
    variant_hash: str
    obs: np.ndarray  # [T, obs_dim] float32
    action_mask: np.ndarray  # [T, n_actions] bool
    actions: np.ndarray  # [T] int64
    rewards: np.ndarray  # [T] float32
    env_rewards: np.ndarray  # [T] float32
    tokens: list[list[str]]  # tokens after each step
    terminated: bool
    truncated: bool
    failure_reason: str | None
    goal: str  # the process's goal token

    @property
    def complete(self) -> bool:
        """The episode ended, by termination or truncation."""
        return self.terminated or self.truncated

    @property
    def success(self) -> bool:
        """Reached the goal: terminated with the goal token in the final state."""
        return self.terminated and self.goal in self.tokens[-1]

    def __len__(self) -> int:
        return len(self.actions)


def iter_episodes(path: Path, verify: bool = True, *, vocabulary: Vocabulary) -> Iterator[Episode]:
    """Yield every episode (including ones cut off at the end of the run: ``complete`` is False)."""
    table = read_steps(path, verify=verify, vocabulary=vocabulary)
    if table.num_rows == 0:
        return
    ids = np.asarray(table.column("episode_id").to_pylist(), dtype=object)
    step_ids = table.column("step_id").to_numpy()
    order = np.lexsort((step_ids, ids))
    ids = ids[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    ends = np.r_[starts[1:], len(ids)]
    cols = {name: table.column(name).take(pa.array(order)) for name in table.column_names}
    obs = np.asarray(cols["obs"].combine_chunks().flatten(), dtype=np.float32).reshape(-1, vocabulary.obs_dim)
    masks = np.asarray(
        cols["action_mask"].combine_chunks().flatten().to_numpy(zero_copy_only=False), dtype=bool
    ).reshape(-1, vocabulary.n_actions)
    actions = cols["action"].to_numpy().astype(np.int64)
    rewards = cols["reward"].to_numpy()
    env_rewards = cols["env_reward"].to_numpy()
    tokens = cols["tokens"].to_pylist()
    env_ids, hashes = cols["env_id"].to_pylist(), cols["variant_hash"].to_pylist()
    terminated, truncated = cols["terminated"].to_pylist(), cols["truncated"].to_pylist()
    failures = cols["failure_reason"].to_pylist()
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        yield Episode(
            episode_id=str(ids[s]),
            env_id=env_ids[s],
            variant_hash=hashes[s],
            obs=obs[s:e],
            action_mask=masks[s:e],
            actions=actions[s:e],
            rewards=rewards[s:e],
            env_rewards=env_rewards[s:e],
            tokens=tokens[s:e],
            terminated=bool(terminated[e - 1]),
            truncated=bool(truncated[e - 1]),
            failure_reason=failures[e - 1],
            goal=vocabulary.goal,
        )


def goal_episodes(path: Path, verify: bool = True, *, vocabulary: Vocabulary) -> Iterator[Episode]:
    """Episodes that reached the goal token."""
    return (ep for ep in iter_episodes(path, verify=verify, vocabulary=vocabulary) if ep.success)


def process_successful_episodes(
    path: Path, accepted: Mapping[str, frozenset[str]], verify: bool = True, *, vocabulary: Vocabulary
) -> Iterator[Episode]:
    """Episodes of the variants in ``accepted`` (variant hash -> accepted terminal tokens) that ended in one.

    The behaviour-cloning filter: the goal, or the handled outcome that is right for the variant
    (``agentflow_core.semantics.accepted_outcomes``); variants not in ``accepted`` are skipped, so
    passing the train split's variants keeps validation and test variants out of BC.
    """
    for ep in iter_episodes(path, verify=verify, vocabulary=vocabulary):
        tokens = accepted.get(ep.variant_hash)
        if tokens is not None and ep.terminated and not tokens.isdisjoint(ep.tokens[-1]):
            yield ep


def behaviour_cloning_arrays(
    path: Path, accepted: Mapping[str, frozenset[str]], vocabulary: Vocabulary
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(obs [M, obs_dim], actions [M], action_mask [M, n_actions])`` over every process-successful episode."""
    episodes = list(process_successful_episodes(path, accepted, vocabulary=vocabulary))
    if not episodes:
        n_obs, n_act = vocabulary.obs_dim, vocabulary.n_actions
        return np.zeros((0, n_obs), np.float32), np.zeros(0, np.int64), np.zeros((0, n_act), bool)
    return (
        np.concatenate([e.obs for e in episodes]),
        np.concatenate([e.actions for e in episodes]),
        np.concatenate([e.action_mask for e in episodes]),
    )
