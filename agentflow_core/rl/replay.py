"""Prioritized replay over a fixed transition set: TD-error x freshness priorities on a sum-tree.

Schaul et al. 2016 ("Prioritized Experience Replay", proportional variant): transition ``i`` is drawn
with probability ``P(i) = p_i / sum_k p_k`` and its gradient is weighted by the importance-sampling
weight ``w_i = (N * P(i))^-beta / max_k w_k``. docs/design-003.md §4.1 mixes in freshness: here
``p_i = (|delta_i| + eps)^alpha * freshness_i`` with ``freshness_i = decay^age_i``, ``age_i`` the
transition's age in cycles (0 for the newest cycle's shards, fractional inside a cycle by
timestamp), so data a newer retrain collected is replayed more often than old data with the same
TD error.

:class:`SumTree` keeps the priorities in a complete binary tree whose internal nodes hold the sum
of their children: an update is O(log n) and drawing a transition for a prefix sum is one O(log n)
descent, done here for a whole batch at once (one NumPy step per tree level).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class SumTree:
    """Priorities of ``capacity`` items; ``find(prefix)`` returns the item whose cumulative range holds ``prefix``."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"capacity must be positive, got {capacity}")
        self.capacity = capacity
        self.depth = max(0, (capacity - 1).bit_length())
        self.leaf0 = 1 << self.depth  # leaves start here (a power of two)
        self.nodes = np.zeros(2 * self.leaf0, dtype=np.float64)  # nodes[1] is the root; nodes[0] unused

    @property
    def total(self) -> float:
        """Sum of every priority."""
        return float(self.nodes[1])

    def get(self, index: np.ndarray) -> np.ndarray:
        """Priorities of the items ``index``."""
        return self.nodes[self.leaf0 + np.asarray(index)]

    def update(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Set the priorities of the items ``index`` (unique) and repair the sums on their paths to the root."""
        index = np.asarray(index, dtype=np.int64)
        priority = np.asarray(priority, dtype=np.float64)
        if index.size and (index.min() < 0 or index.max() >= self.capacity):
            raise IndexError(f"index out of range for a tree of {self.capacity} items")
        if not np.all(np.isfinite(priority)) or np.any(priority < 0):
            raise ValueError("priorities must be finite and non-negative")
        node = self.leaf0 + index
        self.nodes[node] = priority
        for _ in range(self.depth):
            node = np.unique(node // 2)
            self.nodes[node] = self.nodes[2 * node] + self.nodes[2 * node + 1]

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """For each prefix sum in ``[0, total)``, the item whose cumulative priority range contains it."""
        prefix = np.asarray(prefix, dtype=np.float64).copy()
        node = np.ones(prefix.shape, dtype=np.int64)
        for _ in range(self.depth):
            left = 2 * node
            go_right = prefix >= self.nodes[left]
            prefix = np.where(go_right, prefix - self.nodes[left], prefix)
            node = np.where(go_right, left + 1, left)
        # a prefix at the very top (rounding) can land on a zero leaf past the last item: clamp to the items
        return np.minimum(node - self.leaf0, self.capacity - 1)


@dataclass(frozen=True)
class ReplaySample:
    """A drawn batch: item indices, their draw probabilities and normalised importance-sampling weights."""

    indices: np.ndarray
    probabilities: np.ndarray
    weights: np.ndarray


def freshness(age: np.ndarray, decay: float) -> np.ndarray:
    """``decay^age``: 1 for the newest data, ``decay`` per cycle older."""
    return np.power(float(decay), np.asarray(age, dtype=np.float64))


class PrioritizedReplay:
    """Proportional prioritized replay with a freshness factor (``p = (|td| + eps)^alpha * decay^age``).

    New items start at the largest priority seen so far (Schaul et al.: every transition is replayed
    at least once soon); :meth:`update` sets the drawn items' TD errors after a gradient step.
    """

    def __init__(self, age: np.ndarray, *, alpha: float, beta: float, decay: float, eps: float = 1e-3) -> None:
        age = np.asarray(age, dtype=np.float64)
        if age.ndim != 1 or age.size == 0:
            raise ValueError("age must be a non-empty 1-D array")
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.fresh = freshness(age, decay)
        self.tree = SumTree(age.size)
        self.max_td = 1.0
        self.tree.update(np.arange(age.size), self.priority(np.full(age.size, self.max_td)))

    def __len__(self) -> int:
        return self.tree.capacity

    def priority(self, td_error: np.ndarray, index: np.ndarray | None = None) -> np.ndarray:
        """``(|td| + eps)^alpha * freshness`` of the items ``index`` (all items when None)."""
        fresh = self.fresh if index is None else self.fresh[index]
        return np.power(np.abs(np.asarray(td_error, dtype=np.float64)) + self.eps, self.alpha) * fresh

    def sample(self, batch_size: int, rng: np.random.Generator) -> ReplaySample:
        """Stratified proportional draw: one uniform prefix in each of ``batch_size`` equal slices of the total."""
        total = self.tree.total
        bounds = np.linspace(0.0, total, batch_size + 1)
        prefix = rng.uniform(bounds[:-1], bounds[1:])
        indices = self.tree.find(prefix)
        probabilities = self.tree.get(indices) / total
        weights = np.power(len(self) * probabilities, -self.beta)
        return ReplaySample(indices, probabilities, weights / weights.max())

    def update(self, indices: np.ndarray, td_error: np.ndarray) -> None:
        """New TD errors for drawn items (a batch may hold an item twice: its last error wins)."""
        indices = np.asarray(indices, dtype=np.int64)
        td_error = np.abs(np.asarray(td_error, dtype=np.float64))
        last = len(indices) - 1 - np.unique(indices[::-1], return_index=True)[1]
        indices, td_error = indices[last], td_error[last]
        self.max_td = max(self.max_td, float(td_error.max(initial=0.0)))
        self.tree.update(indices, self.priority(td_error, indices))
