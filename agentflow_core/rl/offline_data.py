"""The trajectory dataset as off-policy transitions ``(s, mask, a, r, s', mask', terminated, age)``.

A dataset row is one step: ``obs``/``action_mask`` describe ``s_t``, ``reward`` and ``terminated`` the
step's outcome (:mod:`agentflow_core.rl.trajectories`). Rows are regrouped by episode and ordered by
``step_id``; the next row of the same episode gives ``s_{t+1}`` and its mask. An episode's last row
keeps its transition only when it terminated (no bootstrap, so ``s'`` is never read); a truncated
episode's or a cut-off one's last row is dropped, because the row layout does not store the state
after the last action and a target without it would be wrong.

``age`` is the transition's age in cycles for the freshness part of prioritized replay: the card's
shards name the cycle that wrote them (``tasks.dataset.append_cycle``); the newest cycle is 0, one
older 1, and inside a cycle the age grows by up to 1 from its newest to its oldest row in collection
order (the rows' position in the cycle's shards, not their wall-clock timestamps: those differ from run to
run, and priorities built on them would make the same data train a different Q).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from agentflow_core.rl.trajectories import read_card, read_steps
from agentflow_core.semantics import Vocabulary


@dataclass(frozen=True)
class Transitions:
    """Columns of ``n`` transitions (NumPy arrays, first axis ``n``)."""

    obs: np.ndarray  # [n, obs_dim] float32
    mask: np.ndarray  # [n, n_actions] bool, the legal actions in s
    action: np.ndarray  # [n] int64
    reward: np.ndarray  # [n] float32, the training reward the explore phase recorded
    next_obs: np.ndarray  # [n, obs_dim] float32 (zeros where terminated)
    next_mask: np.ndarray  # [n, n_actions] bool (all legal where terminated: never read)
    terminated: np.ndarray  # [n] bool
    age: np.ndarray  # [n] float64, in cycles (0 = newest)
    episode: np.ndarray  # [n] int64, an episode index (held-out splits keep episodes whole)

    def __len__(self) -> int:
        return int(self.action.shape[0])

    def take(self, index: np.ndarray) -> Transitions:
        """The transitions at ``index``."""
        return Transitions(**{name: getattr(self, name)[index] for name in self.__dataclass_fields__})

    def split(self, share: float, rng: np.random.Generator) -> tuple[Transitions, Transitions]:
        """(train, held-out): about ``share`` of the episodes, whole, held out."""
        episodes = np.unique(self.episode)
        held = rng.random(episodes.size) < share
        if share > 0 and not held.any() and episodes.size > 1:
            held[rng.integers(episodes.size)] = True
        out = np.isin(self.episode, episodes[held])
        return self.take(np.flatnonzero(~out)), self.take(np.flatnonzero(out))


def _row_ages(path: Path, n_rows: int) -> np.ndarray:
    """Age in cycles of every row, in :func:`read_steps` order (shard order of the card)."""
    shards = read_card(path)["shards"]
    cycle_of_row = np.zeros(n_rows, dtype=np.int64)
    cycles: list[str] = []
    start = 0
    for shard in shards:
        name = str(shard.get("cycle", "initial"))
        if name not in cycles:
            cycles.append(name)
        rows = int(shard["rows"])
        cycle_of_row[start : start + rows] = cycles.index(name)
        start += rows
    age = (len(cycles) - 1 - cycle_of_row).astype(np.float64)
    for c in range(len(cycles)):
        position = np.flatnonzero(cycle_of_row == c)  # collection order: the last row written is the newest
        if position.size > 1:
            age[position] += (position.size - 1 - np.arange(position.size)) / (position.size - 1) * (1.0 - 1e-9)
    return age


def load_transitions(path: Path, vocabulary: Vocabulary, variants: Collection[str] | None = None) -> Transitions:
    """Every usable transition of the dataset at ``path`` (recorded in ``vocabulary``), optionally of ``variants``."""
    table = read_steps(Path(path), vocabulary=vocabulary)
    n = table.num_rows
    obs_dim, n_actions = vocabulary.obs_dim, vocabulary.n_actions
    if n == 0:
        return _empty(obs_dim, n_actions)
    age = _row_ages(Path(path), n)
    ids = np.asarray(table.column("episode_id").to_pylist(), dtype=object)
    keep = np.ones(n, dtype=bool)
    if variants is not None:
        wanted = set(variants)
        keep = np.fromiter((h in wanted for h in table.column("variant_hash").to_pylist()), dtype=bool, count=n)
    order = np.lexsort((table.column("step_id").to_numpy(), ids))
    order = order[keep[order]]
    if order.size == 0:
        return _empty(obs_dim, n_actions)
    ids = ids[order]
    obs = np.asarray(table.column("obs").combine_chunks().flatten(), dtype=np.float32).reshape(-1, obs_dim)[order]
    masks = np.asarray(
        table.column("action_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False), dtype=bool
    ).reshape(-1, n_actions)[order]
    actions = table.column("action").to_numpy().astype(np.int64)[order]
    rewards = table.column("reward").to_numpy().astype(np.float32)[order]
    terminated = table.column("terminated").to_numpy(zero_copy_only=False).astype(bool)[order]
    same_next = np.r_[ids[1:] == ids[:-1], False]  # the next row continues this episode
    usable = same_next | terminated
    next_obs = np.zeros_like(obs)
    next_mask = np.ones_like(masks)
    next_obs[:-1][same_next[:-1]] = obs[1:][same_next[:-1]]
    next_mask[:-1][same_next[:-1]] = masks[1:][same_next[:-1]]
    episode = np.cumsum(np.r_[True, ids[1:] != ids[:-1]]) - 1
    idx = np.flatnonzero(usable)
    return Transitions(
        obs=obs[idx],
        mask=masks[idx] | (np.arange(n_actions) == actions[idx, None]),  # a taken action was legal by definition
        action=actions[idx],
        reward=rewards[idx],
        next_obs=next_obs[idx],
        next_mask=next_mask[idx],
        terminated=terminated[idx] & ~same_next[idx],
        age=age[order][idx],
        episode=episode[idx].astype(np.int64),
    )


def _empty(obs_dim: int, n_actions: int) -> Transitions:
    return Transitions(
        obs=np.zeros((0, obs_dim), np.float32),
        mask=np.zeros((0, n_actions), bool),
        action=np.zeros(0, np.int64),
        reward=np.zeros(0, np.float32),
        next_obs=np.zeros((0, obs_dim), np.float32),
        next_mask=np.zeros((0, n_actions), bool),
        terminated=np.zeros(0, bool),
        age=np.zeros(0, np.float64),
        episode=np.zeros(0, np.int64),
    )
