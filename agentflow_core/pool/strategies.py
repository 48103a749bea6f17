"""The four scheduling strategies over :class:`~agentflow_core.pool.scheduler.BaseScheduler`, and the factory.

``uniform`` and ``round_robin`` are the baselines, ``heat`` is docs/design.md §2.1's cold-first
sampling, ``plr_coverage`` is Prioritized Level Replay (Jiang et al. 2021) with a semantic-coverage
bonus; :func:`make_scheduler` builds one by name with the pool config's coefficients.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.errors import AgentFlowError
from agentflow_core.pool.scheduler import BaseScheduler, EpisodeStats, gumbel_top_k

STRATEGIES = ("uniform", "round_robin", "heat", "plr_coverage")


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

    ``P = (1 - floor) * [(1 - chi) * ((1 - rho - kappa) * P_S + rho * P_C + kappa * P_T) + chi * P_H] + floor / n_active``

    - ``P_S``: rank prioritisation of the learning signal ``S_i``: ``h(S_i) = 1/rank(S_i)``,
      ``P_S ∝ h(S_i)^(1/beta)``. ``S_i`` is an EMA of the positive value loss (|advantage|) the
      pool reports, else of ``1 - success``; never-played variants rank first (cold start).
    - ``P_C``: staleness ``(c - C_i) / sum_j (c - C_j)``, ``c`` = draws so far, ``C_i`` = draw at
      which ``i`` was last sampled -- PLR's guard against stale scores.
    - ``P_T``: rarity of the semantic tokens a variant's episodes reached, ``max_t 1/count(t)``
      with ``count`` over all episodes so far -- steers toward long-tail business states.
    - ``P_H``: uniform over the cold variants (heat below ``cold_threshold``, docs/design.md §2.1): the share
      ``chi`` of every draw goes to variants the schedule has let cool, so the long tail is replayed
      (while no variant is cold the PLR mix takes the whole share).
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
        cold_coef: float = 0.0,
        floor: float = 0.05,
        score_ema: float = 0.5,
        max_staleness: float = 4.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(n_variants, rng, **kwargs)
        if staleness_coef + token_coef > 1.0:
            raise ValueError(f"staleness_coef + token_coef must be <= 1, got {staleness_coef + token_coef}")
        if not 0.0 <= cold_coef < 1.0:
            raise ValueError(f"cold_coef must be in [0, 1), got {cold_coef}")
        self.temperature, self.staleness_coef, self.token_coef = temperature, staleness_coef, token_coef
        self.cold_coef = cold_coef
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

    def cold_probabilities(self) -> np.ndarray:
        """``P_H``: uniform over the active cold variants; zero while none is cold."""
        cold = (self.heat.cold() & self.active).astype(np.float64)
        total = cold.sum()
        return cold / total if total > 0 else cold

    def weights(self) -> np.ndarray:
        """PLR's mix of score and staleness distributions plus the token-coverage and cold shares, floored."""
        p_t = self.token_probabilities()
        kappa = self.token_coef if p_t.any() else 0.0
        p_h = self.cold_probabilities() if self.cold_coef > 0 else np.zeros(self.n_variants)
        chi = self.cold_coef if p_h.any() else 0.0
        plr = (
            (1.0 - self.staleness_coef - kappa) * self.score_probabilities()
            + self.staleness_coef * self.staleness_probabilities()
            + kappa * p_t
        )
        mixed = (1.0 - chi) * plr + chi * p_h
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
            cold_coef=cfg.plr_cold_coef,
            floor=cfg.plr_floor,
            score_ema=cfg.plr_score_ema,
            max_staleness=cfg.plr_max_staleness,
            **common,
        )
    raise ValueError(f"unknown scheduler strategy {strategy!r}, expected one of {STRATEGIES}")
