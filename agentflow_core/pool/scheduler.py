"""Variant schedulers: which catalogue variant a pool slot plays next.

Four strategies (:mod:`agentflow_core.pool.strategies`) share one small interface
(:class:`Scheduler`) and one bookkeeping base (:class:`BaseScheduler`, here):

- ``uniform``      -- every active variant equally likely.
- ``round_robin``  -- walk the catalogue in order (deterministic; the coverage baseline).
- ``heat``         -- docs/design.md §2.1 heat decay: ``h <- decay*h + 1`` for a variant sampled in a round,
                      ``h <- decay*h`` otherwise; variants with ``h < cold_threshold`` ("cold") are
                      preferred, so long-tail variants keep being visited.
- ``plr_coverage`` -- Prioritized Level Replay (Jiang et al. 2021, "Prioritized Level Replay"):
                      rank-transformed learning-signal scores mixed with staleness, plus a bonus
                      for variants that reached rare semantic tokens, plus a floor so nothing starves.

Clock: the heat clock advances one *round* per :meth:`Scheduler.sample` call (one autoreset
round of the pool; call ``sample(0)`` to tick without drawing). Staleness counts *draws*
(episodes started), as PLR's episode counter. Heat is decayed lazily: each variant stores its
heat and the round it was last touched, and the current value is ``h * decay**(now - then)``,
computed for all variants at once -- there is no per-round loop over the catalogue.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentflow_core.errors import AgentFlowError


@dataclass(frozen=True)
class EpisodeStats:
    """What the pool reports about one finished episode of a variant."""

    return_: float
    success: bool
    length: int
    failure_reason: str | None = None
    tokens: frozenset[str] = frozenset()
    value_loss: float | None = None


@runtime_checkable
class Scheduler(Protocol):
    """Chooses variant indices for pool slots and learns from finished episodes."""

    n_variants: int

    def sample(self, n: int) -> np.ndarray:
        """``n`` variant indices for the slots that need a new episode (one heat round)."""
        ...

    def update(self, index: int, stats: EpisodeStats) -> None:
        """Record a finished episode of variant ``index``."""
        ...

    def probabilities(self) -> np.ndarray:
        """Per-variant probability of the next single draw; sums to 1, 0 for quarantined."""
        ...

    def quarantine(self, index: int, reason: str) -> None:
        """Never sample ``index`` again (a crashing or invalid variant); ``reason`` is kept."""
        ...

    @property
    def quarantined(self) -> dict[int, str]:
        """Quarantined variant index -> reason."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for checkpoints."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        ...

    def stats_table(self) -> list[dict[str, Any]]:
        """One row per variant: episodes, successes, failures by reason, heat, last_sampled."""
        ...


class HeatTracker:
    """Heat (docs/design.md §2.1) per variant, decayed lazily: O(1) state per variant, vectorised reads.

    After round ``t`` a variant's heat is ``h_t = decay * h_{t-1} + k`` where ``k`` is how many
    times it was drawn in round ``t`` (0 when not drawn). Only drawn variants are written.
    """

    def __init__(self, n_variants: int, decay: float = 0.95, threshold: float = 0.3) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError(f"heat decay must be in (0, 1), got {decay}")
        self.decay, self.threshold = decay, threshold
        self.round = 0
        self.heat_at = np.zeros(n_variants, dtype=np.float64)
        self.stamped = np.zeros(n_variants, dtype=np.int64)

    def values(self) -> np.ndarray:
        """Every variant's heat after the last completed round."""
        return self.heat_at * np.power(self.decay, self.round - self.stamped)

    def values_of(self, indices: np.ndarray) -> np.ndarray:
        """The heat of ``indices`` only (what :meth:`values` holds for them, without the whole catalogue)."""
        return self.heat_at[indices] * np.power(self.decay, self.round - self.stamped[indices])

    def cold(self) -> np.ndarray:
        """Boolean mask of variants with heat below the cold threshold."""
        return self.values() < self.threshold

    def advance(self, indices: np.ndarray) -> None:
        """Close one round in which ``indices`` were drawn (repeats count once each)."""
        self.round += 1
        if len(indices) == 0:
            return
        idx, counts = np.unique(np.asarray(indices, dtype=np.int64), return_counts=True)
        current = self.heat_at[idx] * np.power(self.decay, self.round - self.stamped[idx])
        self.heat_at[idx] = current + counts
        self.stamped[idx] = self.round

    def state_dict(self) -> dict[str, Any]:
        """The round and every variant's current heat, enough to continue the decay exactly."""
        return {"round": self.round, "heat": self.values().tolist()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; every variant's heat is stamped at the saved round."""
        self.round = int(state["round"])
        self.heat_at = np.asarray(state["heat"], dtype=np.float64)
        self.stamped = np.full(len(self.heat_at), self.round, dtype=np.int64)


def gumbel_top_k(rng: np.random.Generator, p: np.ndarray, n: int) -> np.ndarray:
    """``n`` draws proportional to ``p``, without replacement while the support lasts.

    Gumbel-top-k (Kool et al. 2019) equals sequential sampling without replacement; beyond the
    support size the remainder is drawn with replacement. Vectorised: one pass over ``p``.
    """
    support = np.flatnonzero(p > 0)
    k = min(n, len(support))
    keys = np.log(p[support]) + rng.gumbel(size=len(support))
    chosen = np.argpartition(-keys, k - 1)[:k] if k else np.empty(0, dtype=np.int64)
    top = support[chosen[np.argsort(-keys[chosen], kind="stable")]]
    if n > k:
        extra = rng.choice(len(p), size=n - k, p=p)
        top = np.concatenate([top, extra])
    return top.astype(np.int64)


class BaseScheduler:
    """Shared bookkeeping; a strategy overrides :meth:`weights` (and round-robin :meth:`_draw`)."""

    name = "base"

    def __init__(
        self, n_variants: int, rng: np.random.Generator, *, heat_decay: float = 0.95, cold_threshold: float = 0.3
    ) -> None:
        if n_variants < 1:
            raise ValueError(f"a scheduler needs at least one variant, got {n_variants}")
        self.n_variants = n_variants
        self.rng = rng
        self.heat = HeatTracker(n_variants, heat_decay, cold_threshold)
        self.draws = 0
        self.cold_draws = 0  # draws that landed on a cold variant (heat below the threshold when drawn)
        self.last_draw = np.zeros(n_variants, dtype=np.int64)  # draw counter when last sampled (0: never)
        self.last_round = np.full(n_variants, -1, dtype=np.int64)
        self.samples = np.zeros(n_variants, dtype=np.int64)
        self.episodes = np.zeros(n_variants, dtype=np.int64)
        self.successes = np.zeros(n_variants, dtype=np.int64)
        self.failures: dict[str, Counter[int]] = {}
        self.active = np.ones(n_variants, dtype=bool)
        self._quarantined: dict[int, str] = {}

    # --- strategy hooks -------------------------------------------------------------------------
    def weights(self) -> np.ndarray:
        """Unnormalised, non-negative preference over all variants."""
        return np.ones(self.n_variants, dtype=np.float64)

    def _draw(self, n: int) -> np.ndarray:
        return gumbel_top_k(self.rng, self.probabilities(), n)

    def _observe(self, index: int, stats: EpisodeStats) -> None:
        """Strategy-specific learning from an episode (PLR scores, token counts)."""

    # --- the interface --------------------------------------------------------------------------
    def probabilities(self) -> np.ndarray:
        """Each variant's chance of the next draw: the strategy's weights over active variants.

        Falls back to uniform over active variants when the weights are all zero or not finite, and
        raises once every variant is quarantined.
        """
        if not self.active.any():
            raise AgentFlowError("every variant is quarantined; nothing left to schedule")
        w = np.where(self.active, np.maximum(self.weights(), 0.0), 0.0)
        total = w.sum()
        if not np.isfinite(total) or total <= 0.0:
            w = self.active.astype(np.float64)
            total = w.sum()
        return w / total

    def sample(self, n: int) -> np.ndarray:
        """``n`` variant indices for slots that start an episode; closes one heat round (``n`` may be 0)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        indices = self._draw(n) if n else np.empty(0, dtype=np.int64)
        if n:
            self.cold_draws += int((self.heat.values_of(indices) < self.heat.threshold).sum())
        self.heat.advance(indices)
        self.last_round[indices] = self.heat.round
        self.last_draw[indices] = self.draws + 1 + np.arange(len(indices))
        self.draws += len(indices)
        np.add.at(self.samples, indices, 1)
        return indices

    def update(self, index: int, stats: EpisodeStats) -> None:
        """Count the episode's success or failure reason and let the strategy learn from it."""
        if not 0 <= index < self.n_variants:
            raise IndexError(f"variant index {index} out of range [0, {self.n_variants})")
        self.episodes[index] += 1
        if stats.success:
            self.successes[index] += 1
        elif stats.failure_reason:
            self.failures.setdefault(stats.failure_reason, Counter())[index] += 1
        self._observe(index, stats)

    def quarantine(self, index: int, reason: str) -> None:
        """Never draw variant ``index`` again (its env keeps failing); ``reason`` is kept for reports."""
        if not 0 <= index < self.n_variants:
            raise IndexError(f"variant index {index} out of range [0, {self.n_variants})")
        self.active[index] = False
        self._quarantined[int(index)] = reason

    @property
    def quarantined(self) -> dict[int, str]:
        """Quarantined variant indices and why, for the pool's stats."""
        return dict(self._quarantined)

    def stats_table(self) -> list[dict[str, Any]]:
        """One row per variant: episodes, successes, failures by reason, heat, samples, probability, quarantine."""
        heat = self.heat.values()
        p = self.probabilities()
        by_variant: dict[int, dict[str, int]] = {}
        for reason, counts in self.failures.items():
            for i, c in counts.items():
                by_variant.setdefault(i, {})[reason] = c
        return [
            {
                "index": i,
                "episodes": int(self.episodes[i]),
                "successes": int(self.successes[i]),
                "failures": dict(sorted(by_variant.get(i, {}).items())),
                "heat": float(heat[i]),
                "cold": bool(heat[i] < self.heat.threshold),
                "samples": int(self.samples[i]),
                "last_sampled": int(self.last_round[i]) if self.last_round[i] >= 0 else None,
                "probability": float(p[i]),
                "quarantined": self._quarantined.get(i),
            }
            for i in range(self.n_variants)
        ]

    def state_dict(self) -> dict[str, Any]:
        """Everything the next draws depend on, the generator's state included (bit-identical resume)."""
        return {
            "strategy": self.name,
            "n_variants": self.n_variants,
            "draws": self.draws,
            "cold_draws": self.cold_draws,
            "heat": self.heat.state_dict(),
            "last_draw": self.last_draw.tolist(),
            "last_round": self.last_round.tolist(),
            "samples": self.samples.tolist(),
            "episodes": self.episodes.tolist(),
            "successes": self.successes.tolist(),
            "failures": {r: {str(i): c for i, c in counts.items()} for r, counts in self.failures.items()},
            "quarantined": {str(i): r for i, r in self._quarantined.items()},
            "rng": self.rng.bit_generator.state,
            **self._extra_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`; refuses one saved by another strategy or over another catalogue."""
        if state["strategy"] != self.name or int(state["n_variants"]) != self.n_variants:
            raise AgentFlowError(
                f"scheduler state is for {state['strategy']} over {state['n_variants']} variants, "
                f"not {self.name} over {self.n_variants}"
            )
        self.draws = int(state["draws"])
        self.cold_draws = int(state.get("cold_draws", 0))
        self.heat.load_state_dict(state["heat"])
        for key in ("last_draw", "last_round", "samples", "episodes", "successes"):
            setattr(self, key, np.asarray(state[key], dtype=np.int64))
        self.failures = {
            r: Counter({int(i): int(c) for i, c in counts.items()}) for r, counts in state["failures"].items()
        }
        self._quarantined = {int(i): r for i, r in state["quarantined"].items()}
        self.active = np.ones(self.n_variants, dtype=bool)
        self.active[list(self._quarantined)] = False
        self.rng.bit_generator.state = state["rng"]
        self._load_extra_state(state)

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Strategy-specific part of :meth:`load_state_dict`."""


def cold_share(state: Mapping[str, Any]) -> float | None:
    """The share of draws that landed on a cold variant, from a scheduler's :meth:`~BaseScheduler.state_dict`
    (or a sliced pool's ``{"slices": [...]}``); None before any draw."""
    states = state.get("slices", [state])
    draws = sum(int(s.get("draws", 0)) for s in states)
    return sum(int(s.get("cold_draws", 0)) for s in states) / draws if draws else None
