"""``agentflow bench learning`` end to end on a tiny config, and the pieces that make the comparison fair."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from agentflow_core.splits import read_splits
from benchmarks.learning_bench import _vs
from benchmarks.sb3_envs import TrainVariantEnv, _batch
from flows.cli.bench import bench_app
from tasks.compose import env_factory
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.steps.variants import run_variants
from tests.tiny import write_tiny_params

KEYS = (
    "test_process_success",
    "test_process_success_vs_rules",
    "test_success_by_family",
    "time_to_rules_vs_maskableppo",
    "steps_to_rules_vs_maskableppo",
    "agentflow_reached_rules",
    "maskableppo_reached_rules",
    "maskableppo_test_process_success",
    "maskableppo_test_process_success_vs_rules",
    "maskableppo_test_success_by_family",
    "test_process_success_rules",
)


def test_bench_learning_end_to_end_on_a_tiny_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = write_tiny_params(tmp_path)
    monkeypatch.chdir(tmp_path)  # data/bench/learning.json and BENCHMARKS.md land here, not in the repo
    result = CliRunner().invoke(
        bench_app, ["learning", "--params", str(params), "--eval-every-updates", "1", "--test-episodes", "12"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads((tmp_path / "data" / "bench" / "learning.json").read_text())
    assert set(KEYS) <= set(out)
    assert (
        set(out["test_success_by_family"])
        == set(out["maskableppo_test_success_by_family"])
        == {"web_checkout", "order_db", "payment_api"}
    )
    hashes = out["test_variant_hashes"]
    assert hashes["agentflow"] and hashes["agentflow"] == hashes["maskableppo"]
    cfg = load_config(params)
    run_variants(PhaseContext.of(cfg), tmp_path / "catalogue")  # the same seed gives the bench's catalogue and splits
    splits = read_splits(tmp_path / "catalogue")
    assert set(hashes["agentflow"]) <= {v.content_hash for v in splits["test"]}
    steps = cfg.train.num_updates * cfg.train.num_envs * cfg.train.n_steps
    explore_steps = out["agentflow_explore_steps"]
    assert explore_steps >= cfg.explore.total_steps  # exploration's env steps count towards AgentFlow's steps
    for name, offset in (("agentflow", explore_steps), ("maskableppo", 0)):
        curve = out[name]["curve"]
        batch = cfg.train.num_envs * cfg.train.n_steps
        assert [c["env_steps"] - offset for c in curve] == list(range(0, steps + 1, batch))
        assert all(0.0 <= c["test_process_success"] <= 1.0 for c in curve)
        assert curve[-1]["train_s"] >= curve[0]["train_s"] > 0.0
    assert out["agentflow"]["setup_s"]["explore_s"] > 0.0 and out["agentflow"]["setup_s"]["bc_s"] > 0.0
    assert out["maskableppo_env_steps"] == out["agentflow_env_steps"] - explore_steps == steps
    assert out["config"]["maskableppo"]["batch_size"] == cfg.train.minibatch_size
    assert set(out["targets_met"]) == {
        "test_process_success",
        "min_family_process_success_vs_rules",
        "time_to_rules_vs_maskableppo",
    }
    assert "## Learning: AgentFlow vs sb3-contrib MaskablePPO" in (tmp_path / "BENCHMARKS.md").read_text()


def test_bench_learning_rejects_a_bad_step_count(tmp_path: Path) -> None:
    result = CliRunner().invoke(bench_app, ["learning", "--params", str(write_tiny_params(tmp_path)), "--steps", "0"])
    assert result.exit_code == 2


def test_time_to_rules_ratio_never_invents_a_figure() -> None:
    ours = {"reached_rules": True, "time_to_rules_s": 30.0, "train_s": 100.0}
    peer_reached = {"reached_rules": True, "time_to_rules_s": 120.0, "train_s": 300.0}
    peer_never = {"reached_rules": False, "time_to_rules_s": None, "train_s": 300.0}
    assert _vs(ours, peer_reached, "time_to_rules_s", "train_s") == pytest.approx(0.25)
    assert _vs(ours, peer_never, "time_to_rules_s", "train_s") == pytest.approx(0.1)  # against its whole budget
    never = {"reached_rules": False, "time_to_rules_s": None, "train_s": 100.0}
    assert _vs(never, peer_reached, "time_to_rules_s", "train_s") is None
    at_once = {"reached_rules": True, "time_to_rules_s": 0.0, "train_s": 300.0}  # its first checkpoint reached it
    assert _vs(ours, at_once, "time_to_rules_s", "train_s") is None


def test_sb3_step_batch_keeps_terminated_truncated_and_final_obs_apart() -> None:
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    infos = [
        {"terminal_observation": np.full(4, -1.0, np.float32)},
        {"terminal_observation": np.full(4, -2.0, np.float32), "TimeLimit.truncated": True},
        {},
    ]
    batch = _batch(obs, np.array([1.0, 2.0, 3.0]), np.array([True, True, False]), infos)
    assert batch.terminated.tolist() == [True, False, False]
    assert batch.truncated.tolist() == [False, True, False]
    assert batch.final_obs[:, 0].tolist() == [-1.0, -2.0, 8.0]
    assert batch.obs is obs and batch.reward.dtype == np.float32


def test_train_variant_env_plays_only_its_split_and_exposes_masks(tmp_path: Path, tiny_config: Any) -> None:
    cfg = tiny_config()
    run_variants(PhaseContext.of(cfg), tmp_path / "variants")
    train = read_splits(tmp_path / "variants")["train"]
    env = TrainVariantEnv(train, env_factory(PhaseContext.of(cfg), train))
    seen = set()
    try:
        env.reset(seed=0)
        for _ in range(30):
            obs, info = env.reset()
            seen.add(info["base_env_id"])
            assert env.action_masks().tolist() == info["action_mask"].tolist()
            assert obs.shape == env.observation_space.shape
            legal = int(np.flatnonzero(env.action_masks())[0])
            _obs, _reward, _terminated, _truncated, step_info = env.step(legal)
            assert step_info["base_env_id"] == info["base_env_id"]
    finally:
        env.close()
    assert seen <= {v.base_env_id for v in train} and len(seen) > 1
