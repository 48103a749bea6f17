"""Per-env reward normalisation with running (Welford) statistics keyed by ``env_id``.

Channels pay on different scales (a web variant with many recoverable failures has a different
reward spread than an API variant), so one global statistic would let the noisiest family
dominate the advantage scale. Each ``env_id`` keeps its own count/mean/M2; a batch is merged
with Chan et al.'s parallel update, which equals feeding the rewards one by one (Welford).
``normalize`` returns ``(r - mean) / (std + 1e-8)`` with the population std. Calibration can
seed the statistics (:meth:`merge_stats`), and the state round-trips through JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STATE_VERSION = 1


@dataclass
class RunningStat:
    """Welford accumulator: ``count``, ``mean`` and ``m2`` (sum of squared deviations)."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0

    @property
    def var(self) -> float:
        """Population variance (0 before any sample), as the normaliser divides by it."""
        return self.m2 / self.count if self.count else 0.0

    @property
    def std(self) -> float:
        """Population standard deviation."""
        return math.sqrt(self.var)

    def merge(self, count: int, mean: float, m2: float) -> None:
        """Chan's parallel combination of two (count, mean, M2) summaries."""
        if count <= 0:
            return
        total = self.count + count
        delta = mean - self.mean
        self.mean += delta * count / total
        self.m2 += m2 + delta * delta * self.count * count / total
        self.count = total


class PerEnvRewardNormalizer:
    """Running mean/std per ``env_id``; never one global statistic."""

    def __init__(self, epsilon: float = 1e-8, clip: float | None = None) -> None:
        self.epsilon, self.clip = epsilon, clip
        self.stats: dict[str, RunningStat] = {}

    def update(self, env_ids: Sequence[str], rewards: np.ndarray) -> None:
        """Fold a batch of rewards into each env's statistics."""
        rewards = np.asarray(rewards, dtype=np.float64)
        keys, inverse = np.unique(np.asarray(env_ids, dtype=object).astype(str), return_inverse=True)
        counts = np.bincount(inverse, minlength=len(keys))
        means = np.bincount(inverse, weights=rewards, minlength=len(keys)) / counts
        m2s = np.bincount(inverse, weights=(rewards - means[inverse]) ** 2, minlength=len(keys))
        for key, count, mean, m2 in zip(keys.tolist(), counts.tolist(), means.tolist(), m2s.tolist(), strict=True):
            self.stats.setdefault(key, RunningStat()).merge(int(count), float(mean), float(m2))

    def normalize(self, env_ids: Sequence[str], rewards: np.ndarray, update: bool = True) -> np.ndarray:
        """``(r - mean_env) / (std_env + eps)`` per element; updates the statistics first by default."""
        if update:
            self.update(env_ids, rewards)
        stats = [self.stats.get(str(k)) or RunningStat() for k in env_ids]
        mean = np.array([s.mean for s in stats])
        std = np.array([s.std for s in stats])
        out = (np.asarray(rewards, dtype=np.float64) - mean) / (std + self.epsilon)
        if self.clip is not None:
            out = np.clip(out, -self.clip, self.clip)
        return out.astype(np.float32)

    def merge_stats(self, env_id: str, count: int, mean: float, var: float) -> None:
        """Fold in a summary measured elsewhere (e.g. calibration's ``resets`` rollouts)."""
        self.stats.setdefault(env_id, RunningStat()).merge(int(count), float(mean), float(var) * int(count))

    def merge(self, other: PerEnvRewardNormalizer) -> None:
        """Fold in every env's statistics from another normaliser (e.g. another worker)."""
        for key, s in other.stats.items():
            self.stats.setdefault(key, RunningStat()).merge(s.count, s.mean, s.m2)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state."""
        return {
            "version": STATE_VERSION,
            "epsilon": self.epsilon,
            "clip": self.clip,
            "stats": {k: {"count": s.count, "mean": s.mean, "m2": s.m2} for k, s in sorted(self.stats.items())},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; refuses another state version."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"normalizer state version {state.get('version')!r}, expected {STATE_VERSION}")
        self.epsilon, self.clip = float(state["epsilon"]), state["clip"]
        self.stats = {
            k: RunningStat(int(v["count"]), float(v["mean"]), float(v["m2"])) for k, v in state["stats"].items()
        }
