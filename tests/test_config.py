"""params.yaml loading: the single source of configuration, with one clear error per bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import ConfigError
from tasks.config_io import flatten_params, load_config, parse_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_shipped_params_load_and_are_frozen(repo_root: Path) -> None:
    cfg = load_config(repo_root / "params.yaml")
    assert cfg.train.clip_range == 0.1
    assert cfg.train.n_epochs == 4
    assert cfg.phases == ("calibrate", "variants", "explore", "offline", "train", "stress", "report")
    with pytest.raises(ValidationError, match="frozen"):
        cfg.train.clip_range = 0.2  # type: ignore[misc]


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "train: [\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(path) in str(err.value)
    assert "line 2" in err.value.key
    assert "well-formed YAML" in str(err.value)


def test_unknown_key_is_rejected_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "train:\n  clip_rnge: 0.1\n"))
    assert err.value.key == "train.clip_rnge"
    assert err.value.value == 0.1


def test_wrong_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "train:\n  n_epochs: ten\n"))
    assert err.value.key == "train.n_epochs"
    assert err.value.value == "ten"
    assert "integer" in err.value.expected


def test_out_of_range_clip_range(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "train:\n  clip_range: 0\n"))
    assert err.value.key == "train.clip_range"
    assert err.value.value == 0
    assert "greater than 0" in err.value.expected


def test_nested_key_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "base:\n  ray:\n    num_cpus: -1\n"))
    assert err.value.key == "base.ray.num_cpus"


def test_bad_range_names_the_perturbation(tmp_path: Path) -> None:
    text = "variants:\n  perturbations:\n    price_factor: {kind: uniform, low: 2, high: 1}\n"
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    assert err.value.key == "variants.perturbations.price_factor"
    assert "must not exceed" in err.value.expected


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "nope.yaml")
    assert "nope.yaml" in str(err.value)


def test_root_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config([1, 2], "x.yaml")
    assert err.value.file == "x.yaml"


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == AgentFlowConfig()


def test_flatten_params_keys() -> None:
    flat = flatten_params(AgentFlowConfig())
    assert flat["train.clip_range"] == "0.08"
    assert flat["base.ray.num_cpus"] == "2"


def test_cli_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    bad = write(tmp_path, "train:\n  clip_range: 0\nbase:\n  state_dir: " + str(tmp_path / "state") + "\n")
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "validate", "--params", str(bad)],
        capture_output=True,
        text=True,
        cwd=tmp_path.parent,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "train.clip_range" in proc.stderr and "greater than 0" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]
