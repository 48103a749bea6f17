"""The impedance-matching auto-tuner: hand-computed decisions, the choice round trip, train reading it, and a
tiny run whose training uses a changed choice and still learns."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from agentflow_core.config import AgentFlowConfig
from agentflow_core.semantics import CHECKOUT
from agentflow_core.tuning import (
    Cores,
    ImpedanceMeter,
    Sparsity,
    TuneChoice,
    UpdateTiming,
    WorkerTiming,
    apply_choice,
    choose,
    choose_cadence,
    choose_envs_per_worker,
    choose_n_steps,
    choose_workers,
)
from tasks.context import PhaseContext
from tests.tiny import tiny_params


def _cfg(**sections: dict) -> AgentFlowConfig:
    data: dict = {"tune": {"enabled": True}}
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return AgentFlowConfig.model_validate(data)


def test_worker_timing_rates_by_hand() -> None:
    t = WorkerTiming(envs=16, steps=10, env_s=0.08, inference_s=0.02)
    assert t.env_rate == pytest.approx(2000.0)  # 160 steps / 0.08 s
    assert t.inference_rate == pytest.approx(8000.0)  # 160 actions / 0.02 s
    assert t.env_inference_ratio == pytest.approx(0.25)
    assert t.worker_sps == pytest.approx(1600.0)  # 160 / 0.1 s


def test_envs_per_worker_takes_the_smallest_k_at_the_ratio_when_it_keeps_the_throughput() -> None:
    tc = _cfg().tune
    # a forward of fixed cost 1 ms, envs 0.1 ms each: ratio 1/(0.1 k) -> 2.5, 1.25, 0.625, 0.3125 for k = 4..32
    timings = [WorkerTiming(k, 10, env_s=10 * 0.0001 * k, inference_s=10 * 0.001) for k in (4, 8, 16, 32)]
    assert [round(t.env_inference_ratio, 4) for t in timings] == [2.5, 1.25, 0.625, 0.3125]
    decision = choose_envs_per_worker(tc, timings, shipped_k=16)
    # k=16 is the first at or below 1.2 but gives 16/(0.0026)=6154 sps against k=32's 7619: 81% < 90%, so the fastest
    assert decision.value == 32 and "the fastest is k=32" in decision.reason
    loose = tc.model_copy(update={"env_inference_ratio": 0.7})
    flat = [WorkerTiming(k, 10, env_s=10 * 0.0001 * k, inference_s=10 * 0.0001 * k / 2) for k in (8, 16)]
    assert choose_envs_per_worker(loose, flat, shipped_k=16).value == 8  # ratio 0.5 for both, same sps: smallest


def test_n_steps_follows_the_goal_interval_and_holds_an_episode() -> None:
    tc = _cfg().tune
    sparse = Sparsity(steps=3000, rewarded_steps=300, goals=100, max_episode_steps=50)  # a goal every 30 steps
    assert choose_n_steps(tc, sparse, 64).value == 128  # 4 goals x 30 = 120 -> 128
    dense = Sparsity(steps=1000, rewarded_steps=1000, goals=200, max_episode_steps=50)  # every 5: 20 steps
    assert choose_n_steps(tc, dense, 64).value == 64  # at least one whole 50-step episode -> 64
    rare = Sparsity(steps=10_000, rewarded_steps=10, goals=10, max_episode_steps=50)  # 4 x 1000
    decision = choose_n_steps(tc, rare, 64)
    assert decision.value == 256 and "capped" in decision.reason


def test_epochs_are_cut_only_while_the_learner_holds_the_envs_back() -> None:
    cfg = _cfg()
    update = UpdateTiming(minibatch=512, step_s=0.01)  # 10 epochs x 4 minibatches of a 2048 batch: 0.4 s
    # production 10,000/s vs consumption 2048/0.4 = 5,120/s: 1.95x > 1.5; 7 epochs: 0.28 s, 7,314/s, 1.37x
    minibatch, epochs, rates = choose_cadence(cfg, cfg.tune, 2048, 10_000.0, update)
    assert (minibatch.value, epochs.value) == (512, 7)
    assert rates["production_over_consumption"] == pytest.approx(10_000 / (2048 / 0.28))
    _, kept, _ = choose_cadence(cfg, cfg.tune, 2048, 2_000.0, update)  # 0.39x: the learner keeps up
    assert kept.value == 10 and "shipped epochs stay" in kept.reason
    _, floor, _ = choose_cadence(cfg, cfg.tune, 2048, 1e6, update)
    assert floor.value == cfg.tune.min_epochs


def test_workers_follow_the_cores_that_run_at_once() -> None:
    cfg = _cfg()
    oversold = choose_workers(cfg, cfg.tune, Cores(logical=8, usable=2, detail="this host"))
    assert oversold.value == 2 and "time-share 2 cores" in oversold.reason
    assert choose_workers(cfg, cfg.tune, Cores(logical=16, usable=16, detail="4 nodes")).value == 16
    inprocess = _cfg(pool={"num_workers": 0})
    assert choose_workers(inprocess, inprocess.tune, Cores(1, 1, "")).value == 0


def test_measure_cores_caps_a_local_ray_at_the_schedulable_cores() -> None:
    from tasks.backend import backend_of

    cores = backend_of(_cfg(base={"ray": {"num_cpus": 64}})).cores()
    assert cores.logical == 64 and cores.usable == min(64, len(os.sched_getaffinity(0)))


def test_choice_applies_round_trips_and_train_reads_it_only_when_it_fits(tmp_path: Path) -> None:
    from tasks.steps.tune import CHOICE_FILE, tuned_config

    cfg = _cfg()
    timings = [WorkerTiming(k, 8, env_s=8 * 0.0004 * k, inference_s=8 * 0.0002) for k in (16, 32, 64)]
    sparsity = Sparsity(steps=1000, rewarded_steps=1000, goals=170, max_episode_steps=50)
    choice = choose(cfg, Cores(8, 2, "this host"), timings, sparsity, UpdateTiming(512, 0.003))
    assert (choice.num_workers, choice.num_envs, choice.n_steps) == (2, 2 * 16, 64)  # k=16: ratio 0.03 already
    assert choice.num_envs * choice.n_steps % choice.minibatch_size == 0
    assert [d.knob for d in choice.decisions][:2] == ["pool.num_workers", "envs_per_worker"]
    assert TuneChoice.from_json(json.loads(json.dumps(choice.to_json()))) == choice
    wide = TuneChoice(**{**choice.__dict__, "num_envs": 256, "n_steps": 128, "minibatch_size": 1024})
    tuned = apply_choice(cfg, wide, CHECKOUT)
    assert (tuned.train.num_envs, tuned.train.n_steps, tuned.train.minibatch_size) == (256, 128, 1024)
    assert tuned.train.learning_rate == cfg.train.learning_rate  # nothing else changes

    assert tuned_config(cfg, tmp_path)[1]["applied"] is False  # no choice.json yet
    (tmp_path / CHOICE_FILE).write_text(json.dumps(wide.to_json()))
    used, record = tuned_config(cfg, tmp_path)
    assert record["applied"] and used.train.num_envs == 256
    off = cfg.model_copy(update={"tune": cfg.tune.model_copy(update={"enabled": False})})
    assert tuned_config(off, tmp_path) == (
        off,
        {"applied": False, "reason": "tune.enabled is false: the static settings"},
    )
    other = cfg.model_copy(update={"train": cfg.train.model_copy(update={"n_epochs": 3})})
    stale_cfg, stale = tuned_config(other, tmp_path)
    assert stale_cfg is other and "other static settings" in stale["reason"]


def test_impedance_meter_by_hand() -> None:
    meter = ImpedanceMeter(num_envs=32, n_steps=64, workers=2, inference_s_per_step=0.0002)
    m = {"time/rollout_s": 0.64, "time/update_s": 0.16, "rollout/episodes": 100.0, "rollout/success_rate": 0.5}
    out = meter.observe(m)
    assert out["impedance/production_sps"] == pytest.approx(2048 / 0.64)
    assert out["impedance/consumption_sps"] == pytest.approx(2048 / 0.16)
    assert out["impedance/production_over_consumption"] == pytest.approx(0.25)
    # per worker: 0.01 s per pool step of 16 envs, 0.0002 s of it the forward
    assert out["impedance/env_step_rate"] == pytest.approx(16 / 0.0098)
    assert out["impedance/inference_rate"] == pytest.approx(16 / 0.0002)
    assert out["impedance/env_inference_ratio"] == pytest.approx(0.0002 / 0.0098)
    assert out["impedance/steps_between_goals"] == pytest.approx(2048 / 50)
    assert out["impedance/goals_per_slot_per_update"] == pytest.approx(50 / 32)
    meter.observe({**m, "time/rollout_s": 1.28})
    assert meter.summary()["impedance/production_sps"] == pytest.approx((3200 + 1600) / 2)


@pytest.mark.slow
def test_tiny_cycle_trains_with_a_changed_choice_and_still_learns(tmp_path: Path) -> None:
    from tasks.paths import DataPaths
    from tasks.steps.explore import run_explore
    from tasks.steps.train import run_train
    from tasks.steps.tune import run_tune, tuned_config
    from tasks.steps.variants import run_variants

    torch.set_num_threads(1)
    # a longer exploration than the tiny cycle's gives behaviour cloning ~100 samples (320 steps: ~20)
    params = tiny_params(tmp_path, train={"total_steps": 4096}, explore={"total_steps": 2000})
    params["tune"] = {"enabled": True, "envs_per_worker": [16], "probe_steps": 4}
    cfg = AgentFlowConfig.model_validate(params)
    paths = DataPaths.of(cfg)
    run_variants(PhaseContext.of(cfg), paths.variants)
    run_explore(PhaseContext.of(cfg), paths.variants, paths.trajectories)
    summary = run_tune(
        PhaseContext.of(cfg), paths.variants, paths.trajectories, paths.tuning, paths.metrics_file("tune")
    )
    choice = json.loads((paths.tuning / "choice.json").read_text())
    assert choice["settings"]["train.num_envs"] == 16 != cfg.train.num_envs  # one in-process worker x 16 envs
    timing = choice["measured"]["worker_timings"][0]
    assert timing["envs"] == 16 and timing["env_s"] > 0 and timing["inference_s"] > 0
    assert choice["measured"]["sparsity"]["goals"] > 0 and len(choice["decisions"]) == 7
    assert summary["budget/tune/wall_s"] < 20  # the probe's share of a cycle stays small
    tuned, record = tuned_config(cfg, paths.tuning)
    assert record["applied"] and tuned.train.num_envs == 16
    trained = run_train(
        PhaseContext.of(tuned), paths.variants, paths.trajectories, paths.checkpoints, False, tuning=record
    )
    assert trained["passed"] and trained["tuning"]["applied"]
    batch = 16 * tuned.train.n_steps
    assert trained["global_step"] == -(-4096 // batch) * batch  # whole updates of the tuned batch
    # measured: 0.76 with the choice (16 envs x 256 steps), 0.77 with the static 8 x 64; the exploration policy ~0.3
    assert trained["test_process_success"] >= 0.6
    impedance = trained["impedance"]
    assert impedance["impedance/production_sps"] > 0 and impedance["impedance/consumption_sps"] > 0


def test_report_shows_the_choice_and_the_measured_impedance() -> None:
    from agentflow_core.evaluation.report import _tuning_tables

    train = {
        "tuning": {"applied": True},
        "tuning_decisions": [{"knob": "train.num_envs", "shipped": 32, "value": 128, "reason": "2 worker(s) x 64"}],
        "impedance": {"impedance/production_sps": 1456.6},
    }
    (choice_title, _, rows), (impedance_title, _, measured) = _tuning_tables(train)
    assert rows == [["train.num_envs", 32, 128, "2 worker(s) x 64"]] and "Auto-tuner" in choice_title
    assert measured == [["production_sps", "1457"]] and "Impedance" in impedance_title
    (_, _, static_rows), *_ = _tuning_tables({"tuning": {"applied": False, "reason": "tune.enabled is false"}})
    assert static_rows == [["(all)", "static", "static", "tune.enabled is false"]]
