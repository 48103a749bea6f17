"""Business value and the regret closed (agentflow_core.evaluation.value), on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from agentflow_core.evaluation.value import ValueBreakdown, mean_value, regret_closed, value_metrics


def test_regret_closed_hand_computed() -> None:
    # rules 40, oracle 100: the gap is 60
    assert regret_closed(70.0, 40.0, 100.0) == pytest.approx(0.5)
    assert regret_closed(100.0, 40.0, 100.0) == pytest.approx(1.0)
    assert regret_closed(40.0, 40.0, 100.0) == pytest.approx(0.0)
    assert regret_closed(10.0, 40.0, 100.0) == pytest.approx(-0.5)  # worse than the rules
    assert regret_closed(112.0, 40.0, 100.0) == pytest.approx(1.2)  # the oracle is not optimal on the sample
    # negative values: rules -5, oracle 3, policy -1 -> 4 / 8
    assert regret_closed(-1.0, -5.0, 3.0) == pytest.approx(0.5)


def test_regret_closed_without_a_gap_is_undefined() -> None:
    # the rules already match the oracle (or beat it on the sample): no regret to close, no ratio
    assert regret_closed(50.0, 40.0, 40.0) is None
    assert regret_closed(40.0, 40.0, 40.0) is None
    assert regret_closed(45.0, 50.0, 40.0) is None
    assert regret_closed(40.0, 40.0, 40.0 + 1e-12) is None  # within the tolerance
    assert regret_closed(40.0, 40.0, 40.001) == pytest.approx(0.0)


def test_mean_value_needs_every_episode_priced() -> None:
    assert mean_value([1.0, 2.0, 6.0]) == pytest.approx(3.0)
    assert mean_value([1.0, None, 6.0]) is None
    assert mean_value([1.0, math.nan]) is None
    assert mean_value([]) is None


def test_value_breakdown_per_family_and_dimension() -> None:
    values = [10.0, 20.0, 30.0, 0.0]
    families = ["a", "a", "b", "b"]
    params = [{"card": "debit"}, {"card": "credit"}, {"card": "debit"}, {"card": "credit"}]
    breakdown = ValueBreakdown.of(values, families, params, ["card"])
    assert breakdown is not None
    assert breakdown.overall == pytest.approx(15.0)
    assert breakdown.by_family == {"a": pytest.approx(15.0), "b": pytest.approx(15.0)}
    assert breakdown.by_dimension["card"] == {"credit": pytest.approx(10.0), "debit": pytest.approx(20.0)}
    metrics = breakdown.metrics("test/business_value")
    assert metrics["test/business_value/card/debit"] == pytest.approx(20.0)
    assert ValueBreakdown.of([1.0, None], ["a", "a"], [{}, {}], []) is None


def _flat(value: float) -> ValueBreakdown:
    return ValueBreakdown(value, 4, {"a": value}, {})


def test_value_metrics_headline() -> None:
    out = value_metrics(
        {
            "trained": _flat(80.0),
            "rules": _flat(40.0),
            "oracle": _flat(100.0),
            "bc": _flat(40.0),
            "offline": _flat(55.0),
            "exploration": _flat(-20.0),
        },
        mean_steps=14.5,
    )
    assert out["test_business_value"] == 80.0
    assert out["test_business_value_rules"] == 40.0
    assert out["test_business_value_oracle"] == 100.0
    assert out["test_regret_closed"] == pytest.approx(40 / 60)
    assert out["test_regret_closed_bc"] == pytest.approx(0.0)
    assert out["test_regret_closed_offline"] == pytest.approx(0.25)
    assert out["test_value_gap"] == pytest.approx(60.0)
    assert out["test_rules_vs_oracle"] == pytest.approx(0.4)
    assert out["mean_episode_steps"] == 14.5


def test_value_metrics_are_absent_without_value_or_oracle() -> None:
    # a channel that prices nothing: only the episode length
    assert value_metrics({"trained": None, "rules": None}, 3.0) == {"mean_episode_steps": 3.0}
    # priced, but no oracle: values, no regret
    out = value_metrics({"trained": _flat(5.0), "rules": _flat(4.0)}, 3.0)
    assert out["test_business_value"] == 5.0 and out["test_business_value_rules"] == 4.0
    assert not any(k.startswith(("test_regret_closed", "test_value_gap")) for k in out)
    # no gap: the values and the gap, no ratio
    out = value_metrics({"trained": _flat(5.0), "rules": _flat(4.0), "oracle": _flat(4.0)}, 3.0)
    assert out["test_value_gap"] == 0.0 and "test_regret_closed" not in out
    assert not any(isinstance(v, float) and math.isnan(v) for v in out.values())


def test_value_tables_lead_with_policy_rules_oracle_per_family_and_dimension_value() -> None:
    from agentflow_core.evaluation.value import value_tables

    def breakdown(overall: float, family: float, cheap: float, dear: float) -> dict:
        return ValueBreakdown(overall, 8, {"sim": family}, {"card": {"cheap": cheap, "dear": dear}}).to_dict()

    tables = value_tables(
        {
            "trained": breakdown(70.0, 70.0, 60.0, 80.0),
            "rules": breakdown(40.0, 40.0, 40.0, 40.0),
            "oracle": breakdown(100.0, 100.0, 100.0, 100.0),
        }
    )
    (title, headers, rows), (_, _, by_value) = tables
    assert "policy vs rules vs oracle" in title
    assert headers == ["stratum", "policy", "rules", "oracle", "regret closed"]
    assert rows[0] == ["all", "70.000", "40.000", "100.000", "0.50"]
    assert rows[1][0] == "family sim"
    assert by_value == [
        ["card = cheap", "60.000", "40.000", "100.000", "0.33"],
        ["card = dear", "80.000", "40.000", "100.000", "0.67"],
    ]
    assert value_tables({}) == []
