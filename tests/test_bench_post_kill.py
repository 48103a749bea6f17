"""tasks.bench.train_bench.post_kill_ratios: the kill run's slowdown after the kill, against uninterrupted runs."""

from __future__ import annotations

import math

import pytest

from tasks.bench.train_bench import post_kill_ratios


def test_a_drift_shared_with_the_uninterrupted_runs_is_not_counted_as_the_kills() -> None:
    # update 1 holds the start-up, update k + 1 = 4 the kill; later updates run 20% slower in every run
    kill = [10.0, 100.0, 100.0, 30.0, 80.0, 80.0]
    control = [[12.0, 100.0, 100.0, 100.0, 80.0, 80.0], [11.0, 100.0, 100.0, 100.0, 80.0, 80.0, 80.0]]
    raw, uninterrupted = post_kill_ratios(kill, control, 3)
    assert raw == pytest.approx(0.8)  # the kill run alone reads as a lasting 20% loss
    assert uninterrupted == pytest.approx(0.8)  # but the runs without a kill lose the same
    assert raw / uninterrupted == pytest.approx(1.0)


def test_a_lasting_slowdown_after_the_kill_shows() -> None:
    kill = [10.0, 100.0, 100.0, 30.0, 50.0, 50.0]
    control = [[10.0, 100.0, 100.0, 100.0, 100.0, 100.0]]
    raw, uninterrupted = post_kill_ratios(kill, control, 3)
    assert raw / uninterrupted == pytest.approx(0.5)


def test_updates_only_the_kill_run_has_are_left_out_and_no_data_is_nan() -> None:
    kill = [10.0, 100.0, 100.0, 30.0, 100.0, 1.0, 1.0]  # updates 6 and 7: the control runs stopped at 5
    raw, uninterrupted = post_kill_ratios(kill, [[10.0, 100.0, 100.0, 100.0, 100.0]], 3)
    assert (raw, uninterrupted) == (pytest.approx(1.0), pytest.approx(1.0))
    assert all(math.isnan(x) for x in post_kill_ratios([10.0, 100.0], [[10.0, 100.0]], 3))
