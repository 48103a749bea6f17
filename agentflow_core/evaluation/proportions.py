"""Success proportions with Wilson score intervals, overall and per stratum (family, dimension value).

The Wilson interval (Wilson 1927; Brown, Cai & DasGupta 2001 recommend it over the Wald interval)
stays inside [0, 1] and keeps its coverage at small n and at rates near 0 or 1, which is where
per-family and per-dimension cells of an evaluation live.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Z_95 = 1.959963984540054


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; (0, 1) when there are no trials."""
    if n <= 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Proportion:
    """``successes`` of ``n`` with its rate and 95% Wilson interval."""

    successes: int
    n: int

    @property
    def rate(self) -> float:
        """Point estimate; 0 when nothing was observed (the interval then spans [0, 1])."""
        return self.successes / self.n if self.n else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        """Wilson score 95% interval, sound at small n and at rates near 0 or 1."""
        return wilson_interval(self.successes, self.n)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: rate, interval and the counts behind them."""
        low, high = self.ci95
        return {"rate": self.rate, "ci95": [low, high], "successes": self.successes, "n": self.n}


def _count(outcomes: Sequence[bool], keys: Sequence[str]) -> dict[str, Proportion]:
    tally: dict[str, list[int]] = {}
    for ok, key in zip(outcomes, keys, strict=True):
        cell = tally.setdefault(key, [0, 0])
        cell[0] += int(ok)
        cell[1] += 1
    return {key: Proportion(s, n) for key, (s, n) in sorted(tally.items())}


@dataclass(frozen=True)
class SuccessBreakdown:
    """One success measure overall, per family and per value of every variant dimension."""

    overall: Proportion
    by_family: dict[str, Proportion]
    by_dimension: dict[str, dict[str, Proportion]]

    @classmethod
    def of(
        cls,
        outcomes: Sequence[bool],
        families: Sequence[str],
        params: Sequence[Mapping[str, Any]],
        dimensions: Sequence[str],
    ) -> SuccessBreakdown:
        """Tally episode ``outcomes`` by their variant's family and dimension values."""
        return cls(
            Proportion(sum(map(bool, outcomes)), len(outcomes)),
            _count(outcomes, families),
            {d: _count(outcomes, [str(p.get(d)) for p in params]) for d in dimensions},
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: overall rate with the per-family and per-dimension-value cells."""
        return {
            **self.overall.to_dict(),
            "by_family": {k: v.to_dict() for k, v in self.by_family.items()},
            "by_dimension": {d: {k: v.to_dict() for k, v in cells.items()} for d, cells in self.by_dimension.items()},
        }

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat numbers: ``{prefix}``, its interval bounds, and ``{prefix}/<family>`` / ``{prefix}/<dimension>/<value>``."""
        out: dict[str, float] = {}

        def put(name: str, prop: Proportion) -> None:
            low, high = prop.ci95
            out[name], out[f"{name}/ci95_low"], out[f"{name}/ci95_high"] = prop.rate, low, high

        put(prefix, self.overall)
        for family, prop in self.by_family.items():
            put(f"{prefix}/{family}", prop)
        for dimension, cells in self.by_dimension.items():
            for value, prop in cells.items():
                put(f"{prefix}/{dimension}/{value}", prop)
        return out
