"""Business value of evaluation episodes and the share of the rules-to-oracle gap a policy closes.

A channel that prices its episodes reports ``info["business_value"]`` on an episode's last step
(the order value on success minus the costs of the actions taken, say). Three policies are
played on the same test episodes: the process's **rules** (its hand-written rule table, the
demonstrator whose logs feed behaviour cloning), the **oracle** (a policy that reads the hidden
state the observation does not show: the upper bound, played for evaluation only) and the
trained **policy**. The headline is the regret closed,

    regret_closed = (V_policy - V_rules) / (V_oracle - V_rules)

0 for a policy exactly as good as the rules, 1 for one as good as the oracle, negative for one
worse than the rules; it may exceed 1 when the oracle is not optimal on the sample.

Degenerate case: when the oracle is not better than the rules on the sample
(``V_oracle - V_rules <= tolerance``) there is no regret to close and the ratio is undefined;
:func:`regret_closed` returns None and the metric is left out (``value_gap`` still says why).
A channel that reports no business value for some episode gives no value at all (None): a mean
over the priced episodes only would be a different quantity.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Relative tolerance below which the oracle counts as no better than the rules.
GAP_TOLERANCE = 1e-9


def regret_closed(policy: float, rules: float, oracle: float) -> float | None:
    """``(policy - rules) / (oracle - rules)``; None when the oracle is not better than the rules (no gap)."""
    gap = oracle - rules
    if gap <= GAP_TOLERANCE * max(1.0, abs(oracle), abs(rules)):
        return None
    return (policy - rules) / gap


def mean_value(values: Sequence[float | None]) -> float | None:
    """The mean business value of the episodes, or None if any episode was not priced (or there are none)."""
    if not values or any(v is None or not math.isfinite(v) for v in values):
        return None
    return math.fsum(values) / len(values)  # type: ignore[arg-type]


def _means(values: Sequence[float], keys: Sequence[str]) -> dict[str, float]:
    cells: dict[str, list[float]] = {}
    for value, key in zip(values, keys, strict=True):
        cells.setdefault(key, []).append(value)
    return {key: math.fsum(cell) / len(cell) for key, cell in sorted(cells.items())}


@dataclass(frozen=True)
class ValueBreakdown:
    """Mean business value overall, per family and per value of every variant dimension."""

    overall: float
    episodes: int
    by_family: dict[str, float]
    by_dimension: dict[str, dict[str, float]]

    @classmethod
    def of(
        cls,
        values: Sequence[float | None],
        families: Sequence[str],
        params: Sequence[Mapping[str, Any]],
        dimensions: Sequence[str],
    ) -> ValueBreakdown | None:
        """Tally episode values by their variant's family and dimension values; None if any is unpriced."""
        overall = mean_value(values)
        if overall is None:
            return None
        priced = [float(v) for v in values]  # type: ignore[arg-type]
        return cls(
            overall,
            len(priced),
            _means(priced, families),
            {d: _means(priced, [str(p.get(d)) for p in params]) for d in dimensions},
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "mean": self.overall,
            "episodes": self.episodes,
            "by_family": dict(self.by_family),
            "by_dimension": {d: dict(cells) for d, cells in self.by_dimension.items()},
        }

    def metrics(self, prefix: str) -> dict[str, float]:
        """Flat numbers: ``{prefix}``, ``{prefix}/<family>`` and ``{prefix}/<dimension>/<value>``."""
        out = {prefix: self.overall}
        out.update({f"{prefix}/{family}": v for family, v in self.by_family.items()})
        for dimension, cells in self.by_dimension.items():
            out.update({f"{prefix}/{dimension}/{value}": v for value, v in cells.items()})
        return out


# The actors whose regret closed is reported, by their name in the final evaluation and the metric suffix.
REGRET_ACTORS = (("trained", ""), ("bc", "_bc"), ("offline", "_offline"))


def value_metrics(values: Mapping[str, ValueBreakdown | None], mean_steps: float) -> dict[str, float]:
    """The test split's value metrics from each actor's breakdown (``trained``, ``rules``, ``oracle``, ...).

    ``test_business_value`` (and ``_rules``, ``_oracle``, ``_bc``, ``_offline``) for every priced
    actor; ``test_regret_closed`` (and ``_bc``, ``_offline``) where the rules and the oracle were
    both priced and the oracle is better; ``test_value_gap`` = oracle - rules; ``mean_episode_steps``
    (the trained policy's) always. Per family and dimension value under ``test/business_value...``.
    """
    out: dict[str, float] = {"mean_episode_steps": float(mean_steps)}
    for name, breakdown in values.items():
        if breakdown is None:
            continue
        suffix = "" if name == "trained" else f"_{name}"
        out[f"test_business_value{suffix}"] = breakdown.overall
        out.update(breakdown.metrics(f"test/business_value{suffix}"))
    rules, oracle = values.get("rules"), values.get("oracle")
    if rules is None or oracle is None:
        return out
    out["test_value_gap"] = oracle.overall - rules.overall
    if oracle.overall > 0:  # the ratio of two values means something only on a positive scale
        out["test_rules_vs_oracle"] = rules.overall / oracle.overall
    for name, suffix in REGRET_ACTORS:
        actor = values.get(name)
        closed = None if actor is None else regret_closed(actor.overall, rules.overall, oracle.overall)
        if closed is not None:
            out[f"test_regret_closed{suffix}"] = closed
    return out


# The report's names of the policies whose business value it shows, in its column order.
VALUE_COLUMNS = (("trained", "policy"), ("rules", "rules"), ("oracle", "oracle"), ("bc", "BC"), ("offline", "BC+CQL"))

Table = tuple[str, list[str], list[list[Any]]]


def _closed_cell(policy: float | None, rules: float | None, oracle: float | None) -> str:
    if policy is None or rules is None or oracle is None:
        return "-"
    closed = regret_closed(policy, rules, oracle)
    return "no gap" if closed is None else f"{closed:.2f}"


def value_tables(values: Mapping[str, Mapping[str, Any]]) -> list[Table]:
    """The report's opening tables: business value of policy vs rules vs oracle, per family and dimension value.

    ``values`` maps a policy (``trained``, ``rules``, ``oracle``, ``bc``, ``offline``) to its
    :meth:`ValueBreakdown.to_dict`; the regret closed is the trained policy's, per cell.
    """
    columns = [(key, label) for key, label in VALUE_COLUMNS if key in values]
    if "trained" not in values:
        return []
    headers = ["stratum", *[label for _, label in columns], "regret closed"]

    def row(label: str, pick: Any) -> list[Any]:
        cells = {key: pick(values[key]) for key, _ in columns}
        shown = ["-" if cells[key] is None else f"{cells[key]:.3f}" for key, _ in columns]
        return [label, *shown, _closed_cell(cells.get("trained"), cells.get("rules"), cells.get("oracle"))]

    rows = [row("all", lambda v: v["mean"])]
    families = sorted(values["trained"]["by_family"])
    rows += [row(f"family {f}", lambda v, f=f: v["by_family"].get(f)) for f in families]
    by_dimension = values["trained"]["by_dimension"]
    dimension_rows = [
        row(f"{d} = {value}", lambda v, d=d, value=value: v["by_dimension"].get(d, {}).get(value))
        for d in sorted(by_dimension)
        for value in sorted(by_dimension[d])
    ]
    title = "Test split: business value per episode, policy vs rules vs oracle"
    return [(title, headers, rows), ("Business value per dimension value", headers, dimension_rows)]
