"""Overrides of params.yaml keys (``--set``, the flow's ``overrides``), the paired comparison's numbers, dataset appends."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from agentflow_core.errors import ConfigError
from agentflow_core.evaluation.paired import EpisodeOutcome, compare_paired, sign_test_p
from agentflow_core.rl.trajectories import TrajectoryWriter, read_card, read_steps, schema
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, OBS_DIM
from tasks.config_io import load_config
from tasks.dataset import append_cycle
from tasks.overrides import apply_overrides, overridden_config, parse_set, resolve_params
from tests.tiny import REPO, write_tiny_params


def test_parse_set_reads_yaml_values() -> None:
    got = parse_set(
        ["train.total_steps=4096", "train.clip_range=0.1", "train.bc_warm_start=false", "report.formats=[md, json]"]
    )
    assert got == {
        "train.total_steps": 4096,
        "train.clip_range": 0.1,
        "train.bc_warm_start": False,
        "report.formats": ["md", "json"],
    }
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_set(["train.total_steps"])


def test_overrides_set_nested_keys_and_leave_the_rest(tmp_path: Path) -> None:
    params = write_tiny_params(tmp_path)
    cfg, merged = overridden_config(params, {"train.total_steps": 4096, "train.reward.normalize": False})
    base = load_config(params)
    assert cfg.train.total_steps == 4096 and cfg.train.reward.normalize is False
    assert cfg.train.n_steps == base.train.n_steps and cfg.base == base.base
    assert merged["train"]["total_steps"] == 4096 and yaml.safe_load(params.read_text())["train"]["total_steps"] == 1024


def test_a_bad_override_names_the_key(tmp_path: Path) -> None:
    params = write_tiny_params(tmp_path)
    with pytest.raises(ConfigError) as unknown:
        overridden_config(params, {"train.clip_rnage": 0.1})
    assert unknown.value.key == "train.clip_rnage" and "no such key" in str(unknown.value)
    with pytest.raises(ConfigError) as bad:
        overridden_config(params, {"train.clip_range": 0})
    assert bad.value.key == "train.clip_range" and str(params) in bad.value.file
    with pytest.raises(ConfigError, match="train.total_steps is a value"):
        apply_overrides({"train": {"total_steps": 1}}, {"train.total_steps.x": 2})


def test_resolve_params_writes_one_validated_copy(tmp_path: Path) -> None:
    params = write_tiny_params(tmp_path)
    assert resolve_params(params, None) == str(params)
    first = resolve_params(params, {"train.total_steps": 512})
    assert first == resolve_params(params, {"train.total_steps": 512}) != str(params)
    assert Path(first).parent == tmp_path / ".agentflow" / "params"
    assert load_config(first).train.total_steps == 512


def test_cli_set_validates_before_anything_runs(tmp_path: Path) -> None:
    params = write_tiny_params(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "run", "-p", str(params), "--set", "train.clip_rnage=0.1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "train.clip_rnage" in done.stderr
    assert not (tmp_path / "data").exists()


def _outcomes(successes: list[bool], returns: list[float]) -> list[EpisodeOutcome]:
    return [EpisodeOutcome(f"{i}:v", s, r) for i, (s, r) in enumerate(zip(successes, returns, strict=True))]


def test_paired_comparison_counts_discordant_pairs() -> None:
    champion = _outcomes([True, True, False, False, True], [1.0, 1.0, 0.0, 0.0, 1.0])
    challenger = _outcomes([True, False, True, True, True], [1.0, 0.0, 1.0, 1.0, 2.0])
    result = compare_paired(challenger, champion)
    assert (result.wins, result.losses, result.ties) == (2, 1, 2)
    assert result.success_diff == pytest.approx(0.2) and result.mean_return_diff == pytest.approx(0.4)
    assert not result.beats  # better on five episodes, not beyond their 95% bound (tests/test_paired.py)
    assert sign_test_p(2, 1) == pytest.approx(1.0) and sign_test_p(0, 6) == pytest.approx(2 / 64)
    tie = compare_paired(_outcomes([True, False] * 20, [1.0, 0.5] * 20), _outcomes([False, True] * 20, [0.5, 0.0] * 20))
    assert tie.wins == tie.losses == 20 and tie.beats  # tied on success, a paired return gain on every episode
    same = compare_paired(champion, champion)
    assert not same.beats and same.mean_return_diff == 0.0  # a copy of the champion does not beat it
    with pytest.raises(ValueError, match="not paired"):
        compare_paired(champion, list(reversed(champion)))


def _shards(out: Path, seed: int, rows: int, card: dict[str, str]) -> dict:
    writer = TrajectoryWriter(out, shard_rows=4, card=card, vocabulary=CHECKOUT)
    for i in range(rows):
        row = {name: None for name in schema(CHECKOUT).names}
        row |= {
            "episode_id": f"{seed}-0-{i // 3}",
            "env_id": f"env_{i % 2}",
            "variant_hash": "h",
            "env_version": "1",
            "policy_hash": "p",
            "seed": seed,
            "timestamp": 0.0,
            "step_id": i % 3 + 1,
            "obs": np.zeros(OBS_DIM, np.float32).tolist(),
            "action_mask": [True] * N_ACTIONS,
            "action": 0,
            "explored": False,
            "tokens": [],
            "reward": 0.0,
            "env_reward": 0.0,
            "base_reward": 0.0,
            "shaping_reward": 0.0,
            "terminated": i % 3 == 2,
            "truncated": False,
            "risk": 0.0,
        }
        writer.append(row)
    return writer.close()


def test_append_cycle_keeps_every_shard_and_names_its_cycle(tmp_path: Path) -> None:
    dataset = tmp_path / "trajectories"
    first = _shards(dataset, 0, 9, {"phase": "explore"})
    _shards(tmp_path / "new1", 7, 6, {"phase": "explore", "cycle": "run-a"})
    append_cycle(dataset, tmp_path / "new1", "run-a", 7)
    _shards(tmp_path / "new2", 8, 5, {"phase": "explore", "cycle": "run-b"})
    card = append_cycle(dataset, tmp_path / "new2", "run-b", 8)
    assert card == read_card(dataset)
    assert card["rows"] == 20 == read_steps(dataset, vocabulary=CHECKOUT).num_rows
    assert [c["cycle"] for c in card["cycles"]] == ["initial", "run-a", "run-b"]
    assert [c["rows"] for c in card["cycles"]] == [9, 6, 5] and card["seeds"] == [0, 7, 8]
    assert [s["sha256"] for s in card["shards"][: len(first["shards"])]] == [s["sha256"] for s in first["shards"]]
    assert {s["cycle"] for s in card["shards"]} == {"initial", "run-a", "run-b"}
    assert card["rows_per_env"] == {"env_0": 11, "env_1": 9}
    _shards(tmp_path / "again", 7, 2, {})
    with pytest.raises(ValueError, match="reused a seed"):
        append_cycle(dataset, tmp_path / "again", "run-c", 7)
