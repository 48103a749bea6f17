"""Damaged state has a recovery path, and garbage numbers never reach a checkpoint.

The learner stops at the first non-finite quantity of an update (naming it); a damaged latest or
best checkpoint (truncated, random bytes, empty, oversized header, forged shapes) is reported and
the newest intact one is used; pointer files never leave their root.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from test_ppo import make_learner

from agentflow_core.errors import NonFiniteError
from agentflow_core.rl.checkpoint import (
    BEST,
    LATEST,
    MODEL_FILE,
    STATE_FILE,
    CheckpointError,
    CheckpointManager,
    latest_checkpoint,
    load_checkpoint,
    load_intact,
)
from agentflow_core.semantics import CHECKOUT
from tasks.context import PhaseContext


class NaNReward:
    """A reward transform that turns one env's reward into NaN (a NaN token reward would, before validation)."""

    def reset(self, batch: Any) -> None:
        """Nothing to reset."""

    def __call__(self, batch: Any) -> np.ndarray:
        reward = np.asarray(batch.reward, dtype=np.float32).copy()
        reward[3] = np.nan
        return reward

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Stateless."""


def test_nan_reward_stops_the_update_naming_rewards_and_nothing_is_checkpointed(tmp_path: Path) -> None:
    ppo = make_learner(seed=0)
    ppo.reward_transform = NaNReward()
    manager = CheckpointManager(tmp_path, every_updates=1, every_minutes=1e6, vocabulary=CHECKOUT)
    with pytest.raises(NonFiniteError, match=r"update 1: non-finite rewards \(first at rollout step 0, env 3: nan\)"):
        ppo.train_iteration()
    assert ppo.update == 0
    with pytest.raises(NonFiniteError, match="parameter"):  # the NaN already reached the weights: refuse to save
        manager.save(ppo)
    assert not list(tmp_path.glob("update_*")) and latest_checkpoint(tmp_path) is None


def test_a_non_finite_parameter_is_named() -> None:
    ppo = make_learner(seed=0)
    metrics = ppo.train_iteration()
    ppo.check_finite(metrics)  # a clean update passes
    with torch.no_grad():
        ppo.policy.actor[2].weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"update 2: non-finite parameter actor\.2\.weight \(1 entries\)"):
        ppo.check_finite(metrics)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three checkpoints (updates 1, 2, 3) with best -> update 2."""
    root = tmp_path_factory.mktemp("ckpts")
    ppo = make_learner(seed=1)
    manager = CheckpointManager(root, every_updates=1, every_minutes=1e6, keep_last=3, vocabulary=CHECKOUT)
    for _ in range(3):
        ppo.train_iteration()
        path = manager.save(ppo)
        if ppo.update == 2:
            manager.mark_best(path)
    return root


def _damage(file: Path, how: str) -> None:
    data = file.read_bytes()
    if how == "truncated":
        file.write_bytes(data[: len(data) // 2])
    elif how == "random_bytes":
        file.write_bytes(np.random.default_rng(0).bytes(len(data)))
    elif how == "empty":
        file.write_bytes(b"")
    elif how == "oversized_header":
        file.write_bytes((1 << 62).to_bytes(8, "little") + data[8:])


DAMAGE = ["truncated", "random_bytes", "empty", "oversized_header"]


@pytest.mark.parametrize("how", DAMAGE)
@pytest.mark.parametrize(("pointer", "damaged", "expected"), [(LATEST, 3, 2), (BEST, 2, 3)])
def test_a_damaged_checkpoint_falls_back_to_the_newest_intact_one(
    saved: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    how: str,
    pointer: str,
    damaged: int,
    expected: int,
) -> None:
    root = tmp_path / "ckpts"
    shutil.copytree(saved, root)
    _damage(root / f"update_{damaged:08d}" / MODEL_FILE, how)
    with pytest.raises(CheckpointError, match=f"update_{damaged:08d}"):
        load_checkpoint(root / f"update_{damaged:08d}", vocabulary=CHECKOUT)
    with caplog.at_level(logging.WARNING, logger="agentflow.checkpoint"):
        ckpt = load_intact(root, pointer, hidden_sizes=[32, 32], vocabulary=CHECKOUT)
    assert ckpt is not None and ckpt.path.name == f"update_{expected:08d}"
    assert f"skipping damaged checkpoint {root / f'update_{damaged:08d}'}" in caplog.text


def test_damaged_state_json_falls_back_and_all_damaged_is_one_error(saved: Path, tmp_path: Path) -> None:
    root = tmp_path / "ckpts"
    shutil.copytree(saved, root)
    (root / "update_00000003" / STATE_FILE).write_bytes(b"\xff\xfe{")
    ckpt = load_intact(root, LATEST, vocabulary=CHECKOUT)
    assert ckpt is not None and ckpt.path.name == "update_00000002"
    for name in ("update_00000001", "update_00000002"):
        (root / name / STATE_FILE).write_text("")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint among 3"):
        load_intact(root, LATEST, vocabulary=CHECKOUT)


def test_pointers_stay_inside_their_root(saved: Path, tmp_path: Path) -> None:
    other = tmp_path / "other_run"
    shutil.copytree(saved, other)
    root = tmp_path / "ckpts"
    shutil.copytree(saved, root)
    shutil.rmtree(root / "update_00000003")
    for target in ("../other_run/update_00000003", str(other / "update_00000003"), "..", "."):
        (root / LATEST).write_text(json.dumps({"name": target}))
        assert latest_checkpoint(root) is None
        ckpt = load_intact(root, LATEST, vocabulary=CHECKOUT)
        assert ckpt is not None and ckpt.path == root / "update_00000002"
    (root / "escape").symlink_to(other / "update_00000003")
    (root / LATEST).write_text(json.dumps({"name": "escape"}))
    assert latest_checkpoint(root) is None


def test_the_fallback_skips_a_symlinked_update_folder_and_deep_pointers(saved: Path, tmp_path: Path) -> None:
    other = tmp_path / "other_run"
    shutil.copytree(saved, other)
    root = tmp_path / "ckpts"
    shutil.copytree(saved, root)
    (root / LATEST).unlink()
    (root / "update_99999999").symlink_to(other / "update_00000003", target_is_directory=True)
    ckpt = load_intact(root, LATEST, vocabulary=CHECKOUT)
    assert ckpt is not None and ckpt.path == root / "update_00000003"
    (root / LATEST).write_text("[" * 2000 + "]" * 2000)  # RecursionError in json, within the pointer's size cap
    assert latest_checkpoint(root) is None
    ckpt = load_intact(root, LATEST, vocabulary=CHECKOUT)
    assert ckpt is not None and ckpt.path == root / "update_00000003"


@pytest.mark.parametrize(
    ("hidden_sizes", "reason"),
    [
        ([1_000_000_000, 1_000_000_000], "outside 1..8 layers"),  # would be a 160 GB network
        ([4096] * 8, "do not match hidden_sizes"),  # in bounds, but not what the file holds
        ("64,64", "outside"),
    ],
)
def test_forged_hidden_sizes_are_refused_before_allocation(
    saved: Path, tmp_path: Path, hidden_sizes: Any, reason: str
) -> None:
    path = tmp_path / "update_00000003"
    shutil.copytree(saved / "update_00000003", path)
    state = json.loads((path / STATE_FILE).read_text())
    state["hidden_sizes"] = hidden_sizes
    (path / STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(CheckpointError, match=reason):
        load_checkpoint(path, vocabulary=CHECKOUT)


def test_the_configured_network_must_match(saved: Path) -> None:
    with pytest.raises(CheckpointError, match=r"hidden_sizes \[32, 32\] != configured \[64, 64\]"):
        load_checkpoint(saved / "update_00000003", hidden_sizes=[64, 64], vocabulary=CHECKOUT)


def test_stress_and_the_champion_candidate_skip_a_damaged_best(saved: Path, tmp_path: Path) -> None:
    from agentflow_core.config import AgentFlowConfig
    from tasks.model_registry import candidate_checkpoint
    from tasks.steps.stress import load_policy, resolve_checkpoint

    root = tmp_path / "data" / "checkpoints" / "checkpoints"  # where train writes them
    shutil.copytree(saved, root)
    _damage(root / "update_00000002" / MODEL_FILE, "truncated")  # best.json -> update 2
    cfg = AgentFlowConfig.model_validate({"base": {"data_dir": str(tmp_path / "data")}})
    ref = resolve_checkpoint(PhaseContext.of(cfg), None)
    assert Path(ref) == root / "update_00000003"
    assert load_policy(ref, PhaseContext.of(cfg).process).checkpoint == ref
    assert candidate_checkpoint(PhaseContext.of(cfg)) == root / "update_00000003"
