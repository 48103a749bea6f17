"""State coverage of the stress rollouts: token frequency by env family × variant group (docs/design.md §4.3).

A *visited state* is the state each action was taken in, plus the final state of every episode,
so each state of an episode counts once. The frequency of a token in a row is the share of that
row's visited states in which the token is active. Long-tail tokens (seen, but in fewer than
``long_tail`` of all visited states, e.g. PAYMENT_FAILED) are the ones a heatmap must not hide;
``state_coverage`` is the share of reachable tokens seen at all.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.evaluation.records import StepRecord


@dataclass(frozen=True)
class CoverageTable:
    """``frequency[r, t]``: share of row ``r``'s visited states with token ``tokens[t]`` active."""

    rows: list[str]
    tokens: list[str]
    frequency: np.ndarray
    states: np.ndarray
    overall: np.ndarray
    long_tail: list[str]
    unseen: list[str]
    state_coverage: float
    group_dimension: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form for the stress analysis (frequencies rounded to 5 places)."""
        return {
            "group_dimension": self.group_dimension,
            "rows": self.rows,
            "tokens": self.tokens,
            "frequency": np.round(self.frequency, 5).tolist(),
            "states_per_row": self.states.tolist(),
            "overall": {t: round(float(f), 5) for t, f in zip(self.tokens, self.overall, strict=True)},
            "long_tail": self.long_tail,
            "unseen": self.unseen,
            "state_coverage": self.state_coverage,
        }


def _visited(steps: Iterable[StepRecord]) -> Iterable[tuple[StepRecord, frozenset[str]]]:
    for step in steps:
        yield step, step.state_tokens
        if step.terminated or step.truncated:
            yield step, step.tokens


def coverage_table(
    steps: Iterable[StepRecord],
    group_dimension: str,
    reachable: Sequence[str],
    long_tail: float,
    tokens: Sequence[str],
) -> CoverageTable:
    """Token frequencies per ``family · <group value>`` row, with long-tail and unseen tokens (of ``tokens``)."""
    names, index = tuple(tokens), {t: i for i, t in enumerate(tokens)}
    counts: dict[str, np.ndarray] = {}
    states: dict[str, int] = {}
    for step, visited in _visited(steps):
        row = f"{step.family} · {step.params.get(group_dimension, '-')}"
        if row not in counts:
            counts[row], states[row] = np.zeros(len(names), np.int64), 0
        states[row] += 1
        for token in visited:
            counts[row][index[token]] += 1
    rows = sorted(counts)
    matrix = np.stack([counts[r] for r in rows]) if rows else np.zeros((0, len(names)), np.int64)
    per_row = np.array([states[r] for r in rows], np.int64)
    frequency = matrix / np.maximum(per_row, 1)[:, None] if rows else np.zeros((0, len(names)))
    overall = matrix.sum(0) / max(int(per_row.sum()), 1)
    seen = {t for t, c in zip(names, matrix.sum(0), strict=True) if c > 0}
    tail = [t for t, f in zip(names, overall, strict=True) if t in seen and f < long_tail]
    reachable_set = [t for t in reachable if t in index]
    unseen = [t for t in reachable_set if t not in seen]
    coverage = (len(reachable_set) - len(unseen)) / len(reachable_set) if reachable_set else 1.0
    return CoverageTable(rows, list(names), frequency, per_row, overall, tail, unseen, coverage, group_dimension)
