"""``agentflow bench learning`` end to end on a tiny config, and the pieces that make the comparison fair."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from agentflow_core.splits import read_splits
from benchmarks.learning_eval import Checkpoint, Evaluator, LearnerRun
from benchmarks.learning_figures import SUCCESS_TARGETS, TARGETS, headline, levels, selected, vs, vs_better_peer
from benchmarks.sb3_envs import TrainVariantEnv, _batch
from flows.cli.bench import bench_app
from tasks.compose import env_factory
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.steps.variants import run_variants
from tests.tiny import REPO, write_tiny_params

PEERS = ("maskableppo", "maskableppo_bc")
KEYS = (
    "test_process_success",
    "test_process_success_vs_rules",
    "test_success_by_family",
    "time_to_rules_vs_maskableppo",
    "time_to_rules_vs_maskableppo_bc",
    "time_to_rules_vs_better_peer",
    "steps_to_rules_vs_better_peer",
    "agentflow_reached_rules",
    "test_process_success_rules",
    "priced",
    *(f"{peer}_{key}" for peer in PEERS for key in ("reached_rules", "test_process_success", "test_success_by_family")),
)
VALUE_KEYS = (
    "test_business_value",
    "test_regret_closed",
    "test_business_value_rules",
    "test_business_value_oracle",
    "time_to_70pct_regret_vs_better_peer",
    "steps_to_70pct_regret_vs_better_peer",
    "time_to_rules_value_vs_better_peer",
    *(f"test_regret_closed_over_{peer}" for peer in PEERS),
    *(f"time_to_70pct_regret_vs_{peer}" for peer in PEERS),
    *(
        f"{learner}_{key}"
        for learner in ("agentflow", *PEERS)
        for key in ("reached_70pct_regret", "time_to_70pct_regret_s", "steps_to_70pct_regret", "reached_rules_value")
    ),
    *(f"{peer}_test_regret_closed" for peer in PEERS),
)


def write_tiny_checkout_v2_params(root: Path) -> Path:
    """The shipped checkout_v2 params.yaml on two channels, eight dimension cells, a few hundred steps per phase,
    one process."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["pool"].update(backend="inprocess", num_workers=0)
    params["base"].update(
        state_dir=str(root / ".agentflow"),
        data_dir=str(root / "data"),
        env_config_dir=str(REPO / "configs" / "checkout_v2" / "envs"),
    )
    params["variants"].update(
        base_envs=["checkout_v2_sim_v1", "checkout_v2_rows_v1"],
        dimensions={"card": ["debit", "prepaid"], "gateway": ["stable", "flaky"], "customer": ["returning"]},
        samples_per_combination=3,
        split={"validation": 0.25, "test": 0.25},
    )
    params["explore"].update(total_steps=640, num_envs=8, min_state_coverage=0.0, remediation={"max_steps": 0})
    params["offline"] = {
        "gradient_steps": 100,
        "improve_steps": 20,
        "eval_episodes": 8,
        "gate": {"min_validation_process_success": 0.0, "max_regression_vs_bc": 1.0},
    }
    params["train"].update(total_steps=1024, num_envs=8, n_steps=64, minibatch_size=128, n_epochs=2, eval_episodes=8)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def _bench(params: Path, *options: str) -> None:
    args = ["learning", "--params", str(params), "--eval-every-updates", "1", "--test-episodes", "12", *options]
    result = CliRunner().invoke(bench_app, args)
    assert result.exit_code == 0, result.output


def _check_curves(out: dict[str, Any], steps: int, batch: int) -> None:
    """Every learner's checkpoints at the same PPO steps; the BC peer's clock and steps start at the exploration's,
    AgentFlow's too where PPO starts from the rules' logs (``train.bc_warm_start``), else at 0."""
    logs = out["agentflow"]["stages"]["exploration"]
    explore_steps = out["agentflow_explore_steps"]
    assert out["maskableppo_bc_explore_steps"] == logs["env_steps"] > 0 and explore_steps in (0, logs["env_steps"])
    for name, offset in (("agentflow", explore_steps), ("maskableppo", 0), ("maskableppo_bc", logs["env_steps"])):
        curve = out[name]["curve"]
        assert [c["env_steps"] - offset for c in curve] == list(range(0, steps + 1, batch))
        assert all(0.0 <= c["test_process_success"] <= 1.0 for c in curve)
        assert curve[-1]["train_s"] >= curve[0]["train_s"] > 0.0
    assert out["maskableppo_bc"]["setup_s"]["explore_s"] == logs["s"]
    if explore_steps:
        assert out["agentflow"]["setup_s"]["explore_s"] == logs["s"]
    assert out["maskableppo_bc"]["curve"][0]["train_s"] > logs["s"] + out["maskableppo_bc"]["setup_s"]["bc_s"]
    assert out["maskableppo_bc"]["stages"]["bc"]["samples"] > 0
    assert out["maskableppo_env_steps"] == out["maskableppo_bc_env_steps"] - logs["env_steps"] == steps
    assert out["agentflow_env_steps"] == explore_steps + steps


@pytest.mark.bench
def test_bench_learning_end_to_end_on_a_tiny_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    params = write_tiny_params(tmp_path)
    monkeypatch.chdir(tmp_path)  # data/bench/learning.json and BENCHMARKS.md land here, not in the repo
    _bench(params)
    out = json.loads((tmp_path / "data" / "bench" / "learning.json").read_text())
    assert set(KEYS) <= set(out) and not out["priced"]
    assert not set(VALUE_KEYS) & set(out)  # nothing priced: the process-success yardsticks only
    families = {"web_checkout", "order_db", "payment_api"}
    assert all(set(out[f"{p}test_success_by_family"]) == families for p in ("", "maskableppo_", "maskableppo_bc_"))
    hashes = out["test_variant_hashes"]
    assert hashes["agentflow"] and hashes["agentflow"] == hashes["maskableppo"] == hashes["maskableppo_bc"]
    cfg = load_config(params)
    run_variants(PhaseContext.of(cfg), tmp_path / "catalogue")  # the same seed gives the bench's catalogue and splits
    assert set(hashes["agentflow"]) <= {v.content_hash for v in read_splits(tmp_path / "catalogue")["test"]}
    assert out["agentflow_explore_steps"] >= cfg.explore.total_steps
    steps = cfg.train.num_updates * cfg.train.num_envs * cfg.train.n_steps
    _check_curves(out, steps, cfg.train.num_envs * cfg.train.n_steps)
    assert out["agentflow"]["stages"]["offline"]["bc_samples"] > 0  # offline.enabled: BC -> CQL before PPO
    assert out["config"]["maskableppo"]["batch_size"] == out["config"]["maskableppo_bc"]["batch_size"]
    assert out["config"]["maskableppo_bc"]["bc"]["batch_size"] == 256
    assert set(out["targets_met"]) == set(SUCCESS_TARGETS)
    assert "## Learning: AgentFlow vs sb3-contrib MaskablePPO" in (tmp_path / "BENCHMARKS.md").read_text()


@pytest.mark.bench
def test_bench_learning_on_a_priced_process_reports_value_and_regret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    params = write_tiny_checkout_v2_params(tmp_path)
    monkeypatch.chdir(tmp_path)
    _bench(params, "--out", str(tmp_path / "scratch" / "learning.json"))
    assert not (tmp_path / "data" / "bench" / "learning.json").exists() and not (tmp_path / "BENCHMARKS.md").exists()
    out = json.loads((tmp_path / "scratch" / "learning.json").read_text())
    assert (tmp_path / "scratch" / "learning.png").is_file()
    assert out["priced"] and set(KEYS) | set(VALUE_KEYS) <= set(out)
    rules, oracle = out["test_business_value_rules"], out["test_business_value_oracle"]
    assert oracle > rules
    for name in ("agentflow", *PEERS):
        best = max(out[name]["curve"], key=lambda c: tuple(c["selection"]))  # the best validation value, earliest
        assert best["selection"][0] == best["validation_business_value"]
        prefix = "" if name == "agentflow" else f"{name}_"
        closed = (out[f"{prefix}test_business_value"] - rules) / (oracle - rules)
        assert out[f"{prefix}test_regret_closed"] == pytest.approx(closed)
        for c in out[name]["curve"]:
            assert c["test_regret_closed"] == pytest.approx((c["test_business_value"] - rules) / (oracle - rules))
    for peer in PEERS:
        margin = out["test_regret_closed"] - out[f"{peer}_test_regret_closed"]
        assert out[f"test_regret_closed_over_{peer}"] == pytest.approx(margin)
    cfg = load_config(params)
    assert not cfg.train.bc_warm_start  # the shipped start: PPO from a fresh network, no offline stage on its clock
    assert out["agentflow_explore_steps"] == 0 and "offline" not in out["agentflow"]["stages"]
    _check_curves(out, cfg.train.num_updates * cfg.train.num_envs * cfg.train.n_steps, 512)
    assert set(out["targets_met"]) == set(TARGETS)


def test_bench_learning_rejects_a_bad_step_count(tmp_path: Path) -> None:
    result = CliRunner().invoke(bench_app, ["learning", "--params", str(write_tiny_params(tmp_path)), "--steps", "0"])
    assert result.exit_code == 2


def test_time_to_a_level_ratio_never_invents_a_figure() -> None:
    ours = {"reached_rules": True, "time_to_rules_s": 30.0, "train_s": 100.0}
    peer_reached = {"reached_rules": True, "time_to_rules_s": 120.0, "train_s": 300.0}
    peer_never = {"reached_rules": False, "time_to_rules_s": None, "train_s": 300.0}
    assert vs(ours, peer_reached, "rules", "time") == pytest.approx(0.25)
    assert vs(ours, peer_never, "rules", "time") == pytest.approx(0.1)  # against its whole budget: an upper bound
    never = {"reached_rules": False, "time_to_rules_s": None, "train_s": 100.0}
    assert vs(never, peer_reached, "rules", "time") is None
    at_once = {"reached_rules": True, "time_to_rules_s": 0.0, "train_s": 300.0}  # its first checkpoint reached it
    assert vs(ours, at_once, "rules", "time") is None
    # against the faster peer: the larger ratio; undefined if either is
    assert vs_better_peer([0.25, 0.1]) == pytest.approx(0.25)
    assert vs_better_peer([0.25, None]) is None


def _checkpoint(env_steps: int, train_s: float, selection: float, value: float, closed: float) -> Checkpoint:
    return Checkpoint(env_steps, train_s, 1.0, selection, 1.0, 1.0, value, closed, {"f": 1.0}, (selection, 1.0))


def test_levels_and_headline_on_hand_computed_curves() -> None:
    # rules 10, oracle 20: regret closed = (value - 10) / 10
    ours = LearnerRun("agentflow", train_s=50.0, env_steps=5000)
    ours.checkpoints = [_checkpoint(1000, 5.0, 9.0, 9.0, -0.1), _checkpoint(2000, 10.0, 18.0, 18.0, 0.8)]
    scratch = LearnerRun("maskableppo", train_s=80.0, env_steps=8000)
    scratch.checkpoints = [_checkpoint(0, 1.0, 5.0, 5.0, -0.5), _checkpoint(4000, 40.0, 17.5, 17.5, 0.75)]
    warm = LearnerRun("maskableppo_bc", train_s=60.0, env_steps=6000)
    warm.checkpoints = [_checkpoint(1000, 6.0, 10.0, 10.0, 0.0), _checkpoint(3000, 30.0, 16.0, 16.0, 0.6)]
    assert [selected(run) for run in (ours, scratch, warm)] == [1, 1, 1]
    evaluator = cast(Evaluator, SimpleNamespace(rules=SimpleNamespace(process_success_rate=1.0)))
    figures = {}
    for run in (ours, scratch, warm):
        out: dict[str, Any] = {"train_s": run.train_s, "env_steps": run.env_steps, "test_regret_closed": None}
        for level, reached_it in levels(priced=True).items():
            reached = next((c for c in run.checkpoints if reached_it(c, evaluator)), None)
            out[f"reached_{level}"] = reached is not None
            out[f"time_to_{level}_s"] = None if reached is None else reached.train_s
            out[f"steps_to_{level}"] = None if reached is None else reached.env_steps
        out["test_regret_closed"] = run.checkpoints[selected(run)].test_regret_closed
        figures[run.name] = out
    assert figures["maskableppo_bc"]["time_to_rules_value_s"] == 6.0  # regret closed 0.0: the rules' value
    assert not figures["maskableppo_bc"]["reached_70pct_regret"]
    result = headline(figures["agentflow"], {p: figures[p] for p in PEERS}, priced=True)
    assert result["time_to_70pct_regret_vs_maskableppo"] == pytest.approx(10.0 / 40.0)
    assert result["time_to_70pct_regret_vs_maskableppo_bc"] == pytest.approx(10.0 / 60.0)  # its whole budget
    assert result["time_to_70pct_regret_vs_better_peer"] == pytest.approx(0.25)
    assert result["steps_to_70pct_regret_vs_better_peer"] == pytest.approx(2000 / 4000)
    assert result["test_regret_closed_over_maskableppo"] == pytest.approx(0.05)
    assert result["test_regret_closed_over_maskableppo_bc"] == pytest.approx(0.2)
    assert result["time_to_rules_value_vs_maskableppo_bc"] == pytest.approx(10.0 / 6.0)


def test_sb3_step_batch_keeps_terminated_truncated_and_final_obs_apart() -> None:
    obs = np.arange(12, dtype=np.float32).reshape(3, 4)
    infos: list[dict[str, Any]] = [
        {"terminal_observation": np.full(4, -1.0, np.float32)},
        {"terminal_observation": np.full(4, -2.0, np.float32), "TimeLimit.truncated": True},
        {},
    ]
    batch = _batch(obs, np.array([1.0, 2.0, 3.0]), np.array([True, True, False]), infos, 5)
    assert batch.terminated.tolist() == [True, False, False]
    assert batch.truncated.tolist() == [False, True, False]
    assert batch.final_obs[:, 0].tolist() == [-1.0, -2.0, 8.0]
    assert batch.obs is obs and batch.reward.dtype == np.float32 and batch.action_mask.shape == (3, 5)


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
