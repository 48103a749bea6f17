"""Paired comparisons judged by their confidence bound (agentflow_core.evaluation.paired), on hand-made samples."""

from __future__ import annotations

import math

import pytest

from agentflow_core.evaluation.paired import (
    EpisodeOutcome,
    compare_paired,
    paired_by_key,
    paired_difference,
    t_quantile,
)


def test_t_quantile_matches_the_tables() -> None:
    # Student's t, two-sided 95%: the printed tables' values
    for dof, table in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228), (30, 2.042), (120, 1.980)):
        assert t_quantile(0.975, dof) == pytest.approx(table, rel=2e-3)
    assert t_quantile(0.5, 7) == pytest.approx(0.0, abs=1e-12)


def test_paired_difference_hand_computed() -> None:
    # d = [1, 0, 0, 1]: mean 0.5, sd 0.57735, n 4, t(0.975, 3) = 3.1824 -> half width 0.9187
    d = paired_difference([1.0, 0.0, 0.0, 1.0])
    assert d.pairs == 4 and d.mean == pytest.approx(0.5)
    assert d.low == pytest.approx(0.5 - 3.1824 * 0.57735 / 2, abs=3e-3)
    assert d.high == pytest.approx(0.5 + 3.1824 * 0.57735 / 2, abs=3e-3)
    single = paired_difference([0.3])
    assert single.mean == 0.3 and single.low == -math.inf and single.high == math.inf
    constant = paired_difference([0.5] * 6)  # no spread: a zero-width interval at the value
    assert constant.low == constant.high == pytest.approx(0.5)
    with pytest.raises(ValueError):
        paired_difference([])


def test_a_small_regression_on_few_episodes_is_not_a_confident_one() -> None:
    # 64 validation episodes, offline actor fails 4 that BC passes: raw difference -0.0625 < -0.05, yet the
    # upper bound of the paired difference is above -0.05: the sample does not show a regression beyond the margin
    d = paired_difference([-1.0] * 4 + [0.0] * 60)
    assert d.mean == pytest.approx(-0.0625)
    assert d.high > -0.05 > d.mean
    # 40 of 64 lost: confidently worse
    assert paired_difference([-1.0] * 40 + [0.0] * 24).high < -0.05


def test_paired_by_key_blocks_by_variant() -> None:
    a = [("v1", 1.0), ("v1", 0.0), ("v2", 1.0), ("v3", 1.0)]
    b = [("v1", 0.0), ("v2", 1.0), ("v2", 0.0), ("v4", 1.0)]
    # v1: 0.5 - 0.0, v2: 1.0 - 0.5; v3 and v4 were played by one side only
    d = paired_by_key(a, b)
    assert d.pairs == 2 and d.mean == pytest.approx(0.5) and d.low == d.high == pytest.approx(0.5)
    with pytest.raises(ValueError, match="no common"):
        paired_by_key([("x", 1.0)], [("y", 1.0)])


def _outcomes(successes: list[bool], returns: list[float]) -> list[EpisodeOutcome]:
    return [EpisodeOutcome(f"{i}", s, r) for i, (s, r) in enumerate(zip(successes, returns, strict=True))]


def test_the_challenger_beats_only_beyond_the_bound() -> None:
    champion = _outcomes([False] * 10 + [True] * 30, [0.0] * 10 + [1.0] * 30)
    # wins 10 of 40, loses none: success diff 0.25, lower bound 0.25 - 2.023 * 0.4385 / 6.325 = 0.110 > 0
    better = compare_paired(_outcomes([True] * 40, [1.0] * 40), champion)
    assert better.wins == 10 and better.losses == 0 and better.beats
    assert better.success_diff_low == pytest.approx(0.25 - 2.0227 * 0.43853 / math.sqrt(40), abs=2e-3)
    # wins 2, loses 1 on 40: not beyond the bound on success, and the returns move with it
    close = _outcomes([True, True, False] + [False] * 7 + [True] * 30, [1.0, 1.0, 0.0] + [0.0] * 7 + [1.0] * 30)
    champion_close = _outcomes(
        [False, False, True] + [False] * 7 + [True] * 30, [0.0, 0.0, 1.0] + [0.0] * 7 + [1.0] * 30
    )
    result = compare_paired(close, champion_close)
    assert (result.wins, result.losses) == (2, 1) and not result.beats
    # losing more pairs than it wins never promotes, whatever the return says
    worse = compare_paired(
        _outcomes([False, True] * 20, [9.0] * 40), _outcomes([True, False, True, True] * 10, [0.0] * 40)
    )
    assert worse.losses > worse.wins and worse.mean_return_diff_low > 0 and not worse.beats
