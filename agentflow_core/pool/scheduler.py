"""Variant schedulers: which catalogue variant a pool slot plays next.

Four strategies share one small interface (:class:`Scheduler`) and one bookkeeping base:

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

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.errors import AgentFlowError

STRATEGIES = ("uniform", "round_robin", "heat", "plr_coverage")


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


class UniformScheduler(BaseScheduler):
    """Every active variant equally likely (domain randomisation's default)."""

    name = "uniform"


class RoundRobinScheduler(BaseScheduler):
    """Visit active variants in catalogue order, cyclically.

    :meth:`probabilities` reports the long-run visit share (uniform over active variants); the
    draw itself is deterministic.
    """

    name = "round_robin"

    def __init__(self, n_variants: int, rng: np.random.Generator, **kwargs: Any) -> None:
        super().__init__(n_variants, rng, **kwargs)
        self.cursor = 0

    def _draw(self, n: int) -> np.ndarray:
        active = np.flatnonzero(self.active)
        if len(active) == 0:
            raise AgentFlowError("every variant is quarantined; nothing left to schedule")
        start = int(np.searchsorted(active, self.cursor))
        order = np.roll(active, -start)
        indices = np.resize(order, n)
        self.cursor = int(indices[-1]) + 1
        return indices.astype(np.int64)

    def _extra_state(self) -> dict[str, Any]:
        return {"cursor": self.cursor}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.cursor = int(state["cursor"])


class HeatScheduler(BaseScheduler):
    """Cold-first sampling on heat (docs/design.md §2.1).

    A cold variant (``h < cold_threshold``) weighs ``cold_weight``, a warm one 1. Warm draws are
    deliberately *not* steered to the least-warm variants: that would equalise heat into
    round-robin, where (at ~16 rounds per catalogue sweep) nothing ever gets cold. Spreading
    them evenly lets variants cool and then be taken promptly once cold, which bounds the gap
    between visits. Drawing within a round is without replacement.
    """

    name = "heat"

    def __init__(self, n_variants: int, rng: np.random.Generator, *, cold_weight: float = 20.0, **kwargs: Any) -> None:
        super().__init__(n_variants, rng, **kwargs)
        self.cold_weight = cold_weight

    def weights(self) -> np.ndarray:
        """``cold_weight`` for a cold variant, 1 for a warm one."""
        h = self.heat.values()
        return np.where(h < self.heat.threshold, self.cold_weight, 1.0)


class PLRCoverageScheduler(BaseScheduler):
    """Prioritized Level Replay (Jiang et al. 2021) with a semantic-coverage bonus.

    ``P = (1 - floor) * [(1 - rho - kappa) * P_S + rho * P_C + kappa * P_T] + floor / n_active``

    - ``P_S``: rank prioritisation of the learning signal ``S_i``: ``h(S_i) = 1/rank(S_i)``,
      ``P_S ∝ h(S_i)^(1/beta)``. ``S_i`` is an EMA of the positive value loss (|advantage|) the
      pool reports, else of ``1 - success``; never-played variants rank first (cold start).
    - ``P_C``: staleness ``(c - C_i) / sum_j (c - C_j)``, ``c`` = draws so far, ``C_i`` = draw at
      which ``i`` was last sampled -- PLR's guard against stale scores.
    - ``P_T``: rarity of the semantic tokens a variant's episodes reached, ``max_t 1/count(t)``
      with ``count`` over all episodes so far -- steers toward long-tail business states.
    - ``floor``: a uniform share, so every active variant keeps probability > 0.

    Bounded staleness: a variant not drawn for ``max_staleness`` catalogue sweeps
    (``max_staleness * n_active`` draws) is overdue and is drawn first in the next round. The
    staleness term alone only makes long gaps unlikely; this makes them impossible, which is
    what "no variant is ever starved" needs over 100k+ draws.
    """

    name = "plr_coverage"

    def __init__(
        self,
        n_variants: int,
        rng: np.random.Generator,
        *,
        temperature: float = 1.0,
        staleness_coef: float = 0.3,
        token_coef: float = 0.1,
        floor: float = 0.05,
        score_ema: float = 0.5,
        max_staleness: float = 4.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(n_variants, rng, **kwargs)
        if staleness_coef + token_coef > 1.0:
            raise ValueError(f"staleness_coef + token_coef must be <= 1, got {staleness_coef + token_coef}")
        self.temperature, self.staleness_coef, self.token_coef = temperature, staleness_coef, token_coef
        self.floor, self.score_ema, self.max_staleness = floor, score_ema, max_staleness
        self.overdue_draws = 0
        self.scores = np.full(n_variants, np.nan)
        self.token_index: dict[str, int] = {}
        self.token_counts = np.zeros(0, dtype=np.int64)
        self.reached = np.zeros((n_variants, 0), dtype=bool)

    def _draw(self, n: int) -> np.ndarray:
        """Overdue variants first (most stale first), the rest by :meth:`probabilities`."""
        stale = np.where(self.active, self.draws - self.last_draw, -1)
        overdue = np.flatnonzero(stale >= self.max_staleness * self.active.sum())
        overdue = overdue[np.argsort(-stale[overdue], kind="stable")][:n]
        self.overdue_draws += len(overdue)
        p = self.probabilities()
        if len(overdue) == 0 or len(overdue) == n:
            return overdue if len(overdue) == n else gumbel_top_k(self.rng, p, n)
        p[overdue] = 0.0
        return np.concatenate([overdue, gumbel_top_k(self.rng, p / p.sum(), n - len(overdue))])

    def _observe(self, index: int, stats: EpisodeStats) -> None:
        signal = max(stats.value_loss, 0.0) if stats.value_loss is not None else 1.0 - float(stats.success)
        old = float(self.scores[index])
        self.scores[index] = signal if math.isnan(old) else (1 - self.score_ema) * old + self.score_ema * signal
        for token in sorted(stats.tokens):  # scalar writes: an episode reaches a handful of tokens
            column = self._token_column(token)
            self.token_counts[column] += 1
            self.reached[index, column] = True

    def _token_column(self, token: str) -> int:
        column = self.token_index.get(token)
        if column is None:
            column = self.token_index[token] = len(self.token_index)
            if column >= self.reached.shape[1]:
                grow = max(8, self.reached.shape[1])
                self.reached = np.pad(self.reached, ((0, 0), (0, grow)))
                self.token_counts = np.pad(self.token_counts, (0, grow))
        return column

    def score_probabilities(self) -> np.ndarray:
        """``P_S``: 1/rank of the learning signal, sharpened by ``1/temperature``; ties share a rank."""
        scores = np.where(np.isnan(self.scores), np.inf, self.scores)[self.active]
        ascending = np.sort(scores)
        rank = 1 + len(scores) - np.searchsorted(ascending, scores, side="right")  # 1 + #strictly higher
        h = np.power(1.0 / rank, 1.0 / self.temperature)
        out = np.zeros(self.n_variants)
        out[self.active] = h / h.sum()
        return out

    def staleness_probabilities(self) -> np.ndarray:
        """``P_C``: proportional to draws since last sampled."""
        stale = np.where(self.active, self.draws - self.last_draw, 0).astype(np.float64)
        total = stale.sum()
        return stale / total if total > 0 else self.active / self.active.sum()

    def token_probabilities(self) -> np.ndarray:
        """``P_T``: rarest reached token's ``1/count``, normalised; zero before any tokens."""
        n_tokens = len(self.token_index)
        if n_tokens == 0:
            return np.zeros(self.n_variants)
        rarity = 1.0 / np.maximum(self.token_counts[:n_tokens], 1)
        bonus = np.where(self.reached[:, :n_tokens], rarity, 0.0).max(axis=1) * self.active
        total = bonus.sum()
        return bonus / total if total > 0 else np.zeros(self.n_variants)

    def weights(self) -> np.ndarray:
        """PLR's mix of score and staleness distributions plus the token-coverage bonus, floored."""
        p_t = self.token_probabilities()
        kappa = self.token_coef if p_t.any() else 0.0
        mixed = (
            (1.0 - self.staleness_coef - kappa) * self.score_probabilities()
            + self.staleness_coef * self.staleness_probabilities()
            + kappa * p_t
        )
        return (1.0 - self.floor) * mixed + self.floor * self.active / self.active.sum()

    def _extra_state(self) -> dict[str, Any]:
        n_tokens = len(self.token_index)
        return {
            "overdue_draws": self.overdue_draws,
            "scores": [None if np.isnan(s) else float(s) for s in self.scores],
            "tokens": {
                t: {"count": int(self.token_counts[c]), "variants": np.flatnonzero(self.reached[:, c]).tolist()}
                for t, c in self.token_index.items()
                if c < n_tokens
            },
        }

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.overdue_draws = int(state["overdue_draws"])
        self.scores = np.array([np.nan if s is None else s for s in state["scores"]], dtype=np.float64)
        self.token_index, self.token_counts = {}, np.zeros(0, dtype=np.int64)
        self.reached = np.zeros((self.n_variants, 0), dtype=bool)
        for token, entry in state["tokens"].items():
            column = self._token_column(token)
            self.token_counts[column] = int(entry["count"])
            self.reached[entry["variants"], column] = True


def make_scheduler(
    strategy: str, n_variants: int, rng: np.random.Generator, cfg: PoolConfig | None = None
) -> BaseScheduler:
    """Build a scheduler by name with the pool config's coefficients."""
    cfg = cfg or PoolConfig()
    common: dict[str, Any] = {"heat_decay": cfg.heat_decay, "cold_threshold": cfg.cold_threshold}
    if strategy == "uniform":
        return UniformScheduler(n_variants, rng, **common)
    if strategy == "round_robin":
        return RoundRobinScheduler(n_variants, rng, **common)
    if strategy == "heat":
        return HeatScheduler(n_variants, rng, cold_weight=cfg.heat_cold_weight, **common)
    if strategy == "plr_coverage":
        return PLRCoverageScheduler(
            n_variants,
            rng,
            temperature=cfg.plr_temperature,
            staleness_coef=cfg.plr_staleness_coef,
            token_coef=cfg.plr_token_coef,
            floor=cfg.plr_floor,
            score_ema=cfg.plr_score_ema,
            max_staleness=cfg.plr_max_staleness,
            **common,
        )
    raise ValueError(f"unknown scheduler strategy {strategy!r}, expected one of {STRATEGIES}")
