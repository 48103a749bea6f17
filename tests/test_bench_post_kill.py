"""benchmarks.train_bench.post_kill_ratios: the kill run's slowdown after the kill, against uninterrupted runs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.train_bench import post_kill_ratios, replacement_speed


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


def _pool(seconds: list[list[float]], lost_at: int, worker: int = 1) -> dict:
    return {
        "rollout_workers": [0, 1],
        "worker_rollout_s": seconds,
        "lost_in_rollouts": [lost_at],
        "recoveries": [{"worker": worker, "recovery_s": 0.05}],
    }


def test_a_machine_slowing_down_after_the_kill_is_not_the_replacements_fault() -> None:
    # row 0: start-up; row 3: the kill (worker 1's slice redone on its replacement); from row 4 on the
    # machine runs 40% slower, both workers alike: throughput drops, the replacement is at full speed
    seconds = [[5.0, 6.0], [1.0, 1.1], [1.0, 1.1], [1.0, 3.3], [1.4, 1.54], [1.4, 1.54]]
    ratio, redone = replacement_speed(_pool(seconds, 3))
    assert ratio == pytest.approx(1.0)
    assert redone == pytest.approx(3.0)  # the redone rollout: 3.3 s against 1.0, where 1.1 was usual


def test_a_replacement_slower_than_the_worker_it_replaced_shows() -> None:
    seconds = [[5.0, 6.0], [1.0, 1.0], [1.0, 1.0], [1.0, 2.0], [1.0, 1.25], [1.0, 1.25], [1.0, 1.25]]
    ratio, _ = replacement_speed(_pool(seconds, 3))
    assert ratio == pytest.approx(0.8)
    # the column is the lost worker's, whichever it was
    swapped = [[b, a] for a, b in seconds]
    assert replacement_speed(_pool(swapped, 3, worker=0))[0] == pytest.approx(0.8)


def test_no_loss_in_a_rollout_or_none_before_it_is_nan() -> None:
    seconds = [[5.0, 6.0], [1.0, 3.0], [1.0, 1.0]]
    assert all(math.isnan(x) for x in replacement_speed({**_pool(seconds, 1), "lost_in_rollouts": []}))
    assert all(math.isnan(x) for x in replacement_speed(_pool(seconds, 1)))


def test_the_split_ceiling_divides_only_the_rollouts_among_the_workers() -> None:
    from benchmarks.train_bench import split_ceiling

    # 80 s runs whose rollouts took 60 s: two workers at best take 80 - 30 = 50 s -> 1.6x
    assert split_ceiling([80.0], [60.0], 2) == pytest.approx(1.6)
    # over two runs as the benchmark weighs them: their time over their ideal time, not a mean of ratios
    assert split_ceiling([80.0, 60.0], [60.0, 40.0], 2) == pytest.approx(140.0 / (50.0 + 40.0))
    assert split_ceiling([80.0], [60.0], 1) == pytest.approx(1.0)  # one worker divides nothing
    assert split_ceiling([80.0], [60.0], 4) == pytest.approx(80.0 / 35.0)
    assert all(
        math.isnan(split_ceiling(w, r, n)) for w, r, n in (([], [], 2), ([80.0], [60.0, 1.0], 2), ([1.0], [9.0], 2))
    )


def test_repeated_runs_keep_the_keys_a_benchmark_lists_per_run() -> None:
    from benchmarks.runs import combine_runs

    runs = [
        {"ratio": r, "ceiling": c, "order": f"run {i}", "targets": {"ratio": 1.5}, "repeat_keys": ["ceiling", "order"]}
        for i, (r, c) in enumerate(((1.4, 1.5), (1.6, 1.7)))
    ]
    out = combine_runs(runs)
    assert out["runs"] == {"ratio": [1.4, 1.6], "ceiling": [1.5, 1.7], "order": ["run 0", "run 1"]}


def test_the_kill_runs_params_turn_the_convergence_stop_off_and_change_nothing_else(tmp_path: Path) -> None:
    """A small config converges before the kill's update; the kill run must reach it (and the updates after)."""
    import yaml

    from benchmarks.train_bench import _params_with
    from tests.tiny import tiny_params

    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(tiny_params(tmp_path, pool={"num_workers": 2})))
    ray = yaml.safe_load(_params_with(params, tmp_path, "ray").read_text())
    kill_path = _params_with(params, tmp_path, "ray", "ray-kill", stop_on_convergence=False)
    kill = yaml.safe_load(kill_path.read_text())
    assert kill_path.name == "params-ray-kill.yaml" and kill["train"]["gate"]["stop_on_convergence"] is False
    kill["train"]["gate"].pop("stop_on_convergence")
    ray["train"]["gate"].pop("stop_on_convergence", None)
    assert kill == ray
