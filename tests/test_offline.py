"""The offline stage: transitions from the versioned dataset, and BC -> CQL -> PPO end to end on the tiny cycle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentflow_core.rl.offline_data import load_transitions
from agentflow_core.rl.trajectories import TrajectoryWriter
from agentflow_core.semantics import CHECKOUT, GOAL_TOKEN, N_ACTIONS, OBS_DIM
from tasks.context import PhaseContext
from tasks.dataset import append_cycle


def _row(
    episode: str, step: int, *, seed: int, ts: float, terminated: bool = False, truncated: bool = False
) -> dict[str, Any]:
    obs = np.zeros(OBS_DIM, np.float32)
    obs[step] = 1.0  # the state is the step index: next_obs pairs are checkable
    return {
        "episode_id": episode,
        "env_id": "e",
        "variant_hash": "v",
        "env_version": "1",
        "policy_hash": "p",
        "seed": seed,
        "timestamp": ts,
        "step_id": step + 1,
        "obs": obs.tolist(),
        "action_mask": [True] * N_ACTIONS,
        "action": step % N_ACTIONS,
        "explored": False,
        "tokens": [GOAL_TOKEN] if terminated else [],
        "reward": float(step),
        "env_reward": 0.0,
        "base_reward": 0.0,
        "shaping_reward": 0.0,
        "terminated": terminated,
        "truncated": truncated,
        "failure_reason": None,
        "risk": 0.0,
    }


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    writer = TrajectoryWriter(path, vocabulary=CHECKOUT)
    for row in rows:
        writer.append(row)
    writer.close()
    return path


def test_transitions_pair_steps_drop_unbootstrappable_ends_and_age_by_cycle(tmp_path: Path) -> None:
    dataset = tmp_path / "trajectories"
    # cycle 1: a terminated 3-step episode (rows written out of order) and a truncated 2-step one
    first = [
        _row("a", 1, seed=1, ts=10.0),
        _row("a", 0, seed=1, ts=0.0),
        _row("a", 2, seed=1, ts=20.0, terminated=True),
        _row("b", 0, seed=1, ts=0.0),
        _row("b", 1, seed=1, ts=20.0, truncated=True),
    ]
    append_cycle(dataset, _write(tmp_path / "c1", first), cycle="one", seed=1)
    # cycle 2: a 2-step episode cut off by the end of the run (no terminal row)
    append_cycle(
        dataset, _write(tmp_path / "c2", [_row("c", 0, seed=2, ts=5.0), _row("c", 1, seed=2, ts=6.0)]), "two", 2
    )
    data = load_transitions(dataset, CHECKOUT)
    # a: 3 transitions (the last terminated); b: its truncated last row dropped; c: its cut-off last row dropped
    assert len(data) == 5
    steps = data.obs.argmax(1).tolist()
    assert steps == [0, 1, 2, 0, 0]
    assert data.next_obs[:2].argmax(1).tolist() == [1, 2] and data.next_obs[3:].argmax(1).tolist() == [1, 1]
    assert data.terminated.tolist() == [False, False, True, False, False]
    assert data.reward.tolist() == [0.0, 1.0, 2.0, 0.0, 0.0]
    # ages: cycle "one" is one cycle old plus up to 1 by collection order inside it (its first-written row, a1,
    # oldest; timestamps play no part: they differ from run to run); "two" is the newest
    assert data.age[:4] == pytest.approx([1 + 0.75, 1 + 1.0, 1 + 0.5, 1 + 0.25], abs=1e-6)
    assert data.age[4] == pytest.approx(1.0, abs=1e-6)  # the older row of cycle two (written first)
    assert load_transitions(dataset, CHECKOUT, variants={"other"}).obs.shape == (0, OBS_DIM)


@pytest.mark.slow
def test_offline_stage_hands_ppo_its_actor_and_a_decaying_kl(tmp_path: Path, tiny_config: Any) -> None:
    from agentflow_core.rl.ppo import MemorySink
    from tasks.steps.explore import run_explore
    from tasks.steps.offline import ACTOR_FILE, run_offline
    from tasks.steps.train import run_train
    from tasks.steps.variants import run_variants

    torch.set_num_threads(1)
    cfg = tiny_config(train={"total_steps": 1024, "eval_every_updates": 2})
    catalogue, traj, offline = (
        tmp_path / "data" / "variants",
        tmp_path / "data" / "trajectories",
        tmp_path / "data" / "offline",
    )
    run_variants(PhaseContext.of(cfg), catalogue)
    run_explore(PhaseContext.of(cfg), catalogue, traj)
    metrics = tmp_path / "offline.json"
    summary = run_offline(PhaseContext.of(cfg), catalogue, traj, offline, metrics)
    assert summary["passed"] and (offline / ACTOR_FILE).is_file()
    assert summary["transitions"] > 0 and summary["replay_draws_newest_share"] == 1.0  # one cycle: all newest
    assert summary["improve_kl_after"] < summary["improve_kl_before"]
    written = json.loads(metrics.read_text())
    assert written["offline_vs_bc_validation"] == pytest.approx(
        written["offline_validation_process_success"] - written["bc_validation_process_success"]
    )
    sink = MemorySink()
    result = run_train(PhaseContext.of(cfg), catalogue, traj, tmp_path / "out", False, sink=sink, offline_dir=offline)
    assert result["bc"]["source"] == "offline" and result["offline"]["kl_coef"] == 0.1
    # checkout's channels price nothing and have no oracle: no value or regret metric, not even NaN
    assert not any(k.startswith(("test_business_value", "test_regret_closed", "test_value_gap")) for k in result)
    assert result["mean_episode_steps"] > 0 and "test_oracle" not in result and "test_bc" in result
    assert sink.series("offline/kl_coef") == pytest.approx([0.1, 0.1 * (1 - 1 / 20)])
    assert all(np.isfinite(sink.series("offline/kl_to_offline")))
    # switched off: no actor is left for training, which falls back to BC
    off = cfg.model_copy(update={"offline": cfg.offline.model_copy(update={"enabled": False})})
    assert run_offline(PhaseContext.of(off), catalogue, traj, offline)["enabled"] is False
    assert not (offline / ACTOR_FILE).exists()


def test_minari_export_reads_back_with_minari_and_h5py(tmp_path: Path) -> None:
    import h5py
    import minari

    from tasks.minari_export import DATASET_ID, export_minari

    rows = [_row("a", 0, seed=1, ts=0.0), _row("a", 1, seed=1, ts=1.0), _row("a", 2, seed=1, ts=2.0, terminated=True)]
    rows += [_row("b", 0, seed=1, ts=0.0), _row("b", 1, seed=1, ts=1.0)]  # cut off by the end of the run
    traj = _write(tmp_path / "trajectories", rows)
    summary = export_minari(traj, tmp_path / "minari", CHECKOUT)
    assert (summary["episodes"], summary["steps"]) == (2, 5)
    dataset = minari.MinariDataset(tmp_path / "minari" / DATASET_ID / "data")
    assert dataset.total_episodes == 2 and dataset.total_steps == 5
    a, b = list(dataset.iterate_episodes())
    assert a.observations.shape == (4, OBS_DIM) and a.actions.tolist() == [0, 1, 2]
    assert a.observations[:3].argmax(1).tolist() == [0, 1, 2]  # s_t as recorded
    assert a.rewards.tolist() == [0.0, 1.0, 2.0]
    assert a.terminations.tolist() == [False, False, True] and not a.truncations.any()
    assert b.truncations.tolist() == [False, True] and not b.terminations.any()
    assert a.infos["action_mask"].shape == (4, N_ACTIONS) and not a.infos["action_mask"][-1].any()
    # the final observation: the recorded final tokens, the last recorded features
    from agentflow_core.semantics import TOKEN_INDEX

    assert a.observations[-1][TOKEN_INDEX[GOAL_TOKEN]] == 1.0
    with h5py.File(tmp_path / "minari" / DATASET_ID / "data" / "main_data.hdf5", "r") as f:
        assert sorted(f.keys()) == ["episode_0", "episode_1"]
        assert f["episode_0"]["actions"][()].tolist() == [0, 1, 2]
        assert f["episode_1"]["observations"].shape == (3, OBS_DIM)
