"""State coverage of exploration over the semantic token vocabulary, and the ε schedule it drives.

Definition (version 1; docs/learning.md "Exploration and coverage" copies it):

* A *state* is the token set ``T(s)`` of an encoded observation.
* **Reachable vocabulary** ``R``: the tokens the env catalogue can produce. It is declared by
  the caller -- by default every token of the process's vocabulary; ``run_explore`` passes the
  union of the intended tokens in the ``RAW_STATES`` of the catalogue's env families, i.e. the
  tokens some channel in the catalogue can actually emit.
* **Token coverage** = ``|seen ∩ R| / |R|``, where ``seen`` are the tokens present in any
  state observed by exploration (reset states included).
* **Transition edge**: for consecutive states ``s_t → s_{t+1}`` of one episode (never across an
  autoreset), every pair ``(a, b)`` with ``a ∈ T(s_t)`` and ``b ∈ T(s_{t+1}) \\ T(s_t)`` -- "token
  ``b`` appeared while ``a`` was active". Steps on which no token appears add no edge.
* **Edge coverage** = ``|E_explore| / |E_explore ∪ E_reference|``: the reference edges are
  those observed by a reference run (the scripted expert) plus any declared edges, so edge
  coverage falls below 1 exactly when exploration has not yet reproduced a transition the
  expert makes. With no reference it is 1 as soon as one edge is seen (0 before).
* **State coverage ratio** = ``min(token coverage, edge coverage)`` -- both the vocabulary
  and the expert's transitions must be covered before exploration is allowed to calm down.

The ε schedule (:func:`epsilon_for`) maps the ratio to the exploration rate: below
``coverage_low`` → ``epsilon_high``; between ``coverage_low`` and ``coverage_high`` → linear
from ``epsilon_high`` down to ``epsilon_mid``; above ``coverage_high`` → ``epsilon_low``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from agentflow_core.config import ExploreConfig
from agentflow_core.semantics import Vocabulary

DEFINITION_VERSION = 1

TokenBatch = np.ndarray | Sequence[Iterable[str]]


def multi_hot(tokens_batch: TokenBatch, vocabulary: Vocabulary) -> np.ndarray:
    """``[N, n_tokens]`` bool from encoded observations or from iterables of token names."""
    if isinstance(tokens_batch, np.ndarray):
        return tokens_batch[:, : vocabulary.n_tokens] > 0.5
    out = np.zeros((len(tokens_batch), vocabulary.n_tokens), dtype=bool)
    token_index = vocabulary.token_index()
    for i, tokens in enumerate(tokens_batch):
        out[i, [token_index[t] for t in tokens]] = True
    return out


def epsilon_for(coverage: float, cfg: ExploreConfig) -> float:
    """The coverage-driven exploration rate (thresholds and levels from ``ExploreConfig``)."""
    if coverage < cfg.coverage_low:
        return cfg.epsilon_high
    if coverage > cfg.coverage_high:
        return cfg.epsilon_low
    fraction = (coverage - cfg.coverage_low) / (cfg.coverage_high - cfg.coverage_low)
    return cfg.epsilon_high + fraction * (cfg.epsilon_mid - cfg.epsilon_high)


class CoverageTracker:
    """Counts token visits and transition edges; see the module docstring for the definitions."""

    def __init__(
        self,
        reachable_tokens: Collection[str] | None = None,
        reference_edges: Iterable[tuple[str, str]] = (),
        *,
        vocabulary: Vocabulary,
    ) -> None:
        self.vocabulary = vocabulary
        reachable_tokens = vocabulary.tokens if reachable_tokens is None else reachable_tokens
        unknown = sorted(set(reachable_tokens) - set(vocabulary.tokens))
        if unknown or not reachable_tokens:
            raise ValueError(f"reachable tokens must be a non-empty subset of the process's tokens; unknown {unknown}")
        n_tokens, token_index = vocabulary.n_tokens, vocabulary.token_index()
        self.reachable = np.zeros(n_tokens, dtype=bool)
        self.reachable[[token_index[t] for t in reachable_tokens]] = True
        self.token_visits = np.zeros(n_tokens, dtype=np.int64)
        self.edge_counts = np.zeros((n_tokens, n_tokens), dtype=np.int64)
        self.reference = np.zeros((n_tokens, n_tokens), dtype=bool)
        for a, b in reference_edges:
            self.reference[token_index[a], token_index[b]] = True

    @staticmethod
    def _edges(prev: np.ndarray, nxt: np.ndarray) -> np.ndarray:
        appeared = nxt & ~prev
        return prev.astype(np.int64).T @ appeared.astype(np.int64)

    def observe(self, tokens_batch: TokenBatch) -> None:
        """Count states without a predecessor (reset observations)."""
        self.token_visits += multi_hot(tokens_batch, self.vocabulary).sum(axis=0)

    def update(self, tokens_batch: TokenBatch, prev_tokens_batch: TokenBatch) -> None:
        """Count the states ``tokens_batch`` reached from ``prev_tokens_batch`` (same episode, row-aligned)."""
        nxt, prev = multi_hot(tokens_batch, self.vocabulary), multi_hot(prev_tokens_batch, self.vocabulary)
        self.token_visits += nxt.sum(axis=0)
        self.edge_counts += self._edges(prev, nxt)

    def add_reference(self, tokens_batch: TokenBatch, prev_tokens_batch: TokenBatch) -> None:
        """Add the edges of a reference run (scripted expert) to the edge denominator only."""
        self.reference |= (
            self._edges(multi_hot(prev_tokens_batch, self.vocabulary), multi_hot(tokens_batch, self.vocabulary)) > 0
        )

    @property
    def token_coverage(self) -> float:
        """Share of reachable tokens seen at least once."""
        return float(((self.token_visits > 0) & self.reachable).sum() / self.reachable.sum())

    @property
    def edge_coverage(self) -> float:
        """Explored transition edges over explored plus reference edges (0 when there are none)."""
        explored = self.edge_counts > 0
        universe = (explored | self.reference).sum()
        return float(explored.sum() / universe) if universe else 0.0

    @property
    def ratio(self) -> float:
        """State coverage ratio = min(token coverage, edge coverage)."""
        return min(self.token_coverage, self.edge_coverage)

    def graph(self) -> dict[str, Any]:
        """JSON-able token-transition graph with per-node/edge counts and the coverage numbers."""
        explored = self.edge_counts > 0
        sources, targets = np.nonzero(explored | self.reference)
        return {
            "definition_version": DEFINITION_VERSION,
            "token_coverage": self.token_coverage,
            "edge_coverage": self.edge_coverage,
            "state_coverage_ratio": self.ratio,
            "nodes": [
                {"token": t, "visits": int(self.token_visits[i]), "reachable": bool(self.reachable[i])}
                for i, t in enumerate(self.vocabulary.tokens)
            ],
            "edges": [
                {
                    "source": self.vocabulary.tokens[a],
                    "target": self.vocabulary.tokens[b],
                    "count": int(self.edge_counts[a, b]),
                    "explored": bool(explored[a, b]),
                    "reference": bool(self.reference[a, b]),
                }
                for a, b in zip(sources.tolist(), targets.tolist(), strict=True)
            ],
        }
