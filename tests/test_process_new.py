"""``agentflow process new``: the scaffold it writes loads, passes the mapping audit, and its rules reach their ends."""

from __future__ import annotations

import itertools
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from agentflow_core.adapters.audit import audit_entry, errors_only
from agentflow_core.envs.state_machine import StateMachineEnv
from flows.cli.app import app
from tasks.config_io import parse_config
from tasks.process_io import load_process
from tasks.process_scaffold import LAYOUT, ScaffoldError, write_scaffold
from tasks.registry_io import load_registry

NAME = "cancelflow"


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    """An empty project folder as the working directory."""
    before = Path.cwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(before)


def test_process_new_writes_every_file_and_refuses_to_overwrite(project: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["process", "new", NAME])
    assert result.exit_code == 0, result.output
    for _, target in LAYOUT:
        path = project / target.format(name=NAME)
        assert path.is_file() and "__NAME__" not in path.read_text(), path
    again = runner.invoke(app, ["process", "new", NAME])
    assert again.exit_code == 2 and "exists already" in again.output
    for bad in ("Bad", "x", "1abc", "a-b", "checkout", "a" * 40):
        result = runner.invoke(app, ["process", "new", bad])
        assert result.exit_code == 2 and "process name" in result.output, bad


def test_a_partial_leftover_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    (tmp_path / f"params-{NAME}.yaml").write_text("")
    with pytest.raises(ScaffoldError, match="exists already"):
        write_scaffold(NAME, tmp_path)
    assert not (tmp_path / "configs").exists()


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    root = tmp_path_factory.mktemp("scaffold")
    write_scaffold(NAME, root)
    env_dir = root / "configs" / NAME / "envs"
    (env_dir.parent / "processes").mkdir()  # beside the env configs: found without a chdir
    shutil.copy(root / "configs/processes" / f"{NAME}.yaml", env_dir.parent / "processes")
    cfg = parse_config({"process": NAME, "base": {"env_config_dir": str(env_dir)}})
    return load_process(cfg), load_registry(cfg)


def test_the_scaffold_passes_the_mapping_audit_and_gymnasium_s_checks(scaffold: tuple) -> None:
    process, registry = scaffold
    for channel in process.channels:
        entry = registry.get(channel.env)
        env = entry.make({"network": "packet_loss_5%", "plan": "annual"})
        check_env(env, skip_render_check=True)  # spaces, and reset/step deterministic for a seed
        env.close()
        findings = audit_entry(entry)
        assert errors_only(findings) == [], findings
        assert not [f for f in findings if f.kind == "unproducible_token"]  # every token has a labelled state


DIMENSIONS = list(itertools.product(["normal", "packet_loss_5%"], ["monthly", "annual"], ["ok", "disputed"]))


@pytest.mark.parametrize(("network", "plan", "account"), DIMENSIONS)
def test_the_rules_reach_the_goal_or_the_handled_outcome_on_both_channels(
    scaffold: tuple, network: str, plan: str, account: str
) -> None:
    process, registry = scaffold
    expected = ("handled", 34.0) if account == "disputed" else ("goal", 95.0 if plan == "annual" else 97.0)
    for channel in process.channels:
        env = registry.get(channel.env).make({"network": network, "plan": plan, "account": account})
        expert = process.expert(channel.family)
        obs, info = env.reset(seed=3)
        while True:
            obs, _, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
            if terminated or truncated:
                break
        assert info["outcome"] == expected[0], (channel.family, info)
        if network == "normal":  # a lost request costs one more attempt
            assert info["business_value"] == expected[1]
        env.close()


def test_the_scaffold_oracle_acts_from_the_whole_state(scaffold: tuple) -> None:
    process, registry = scaffold
    env = registry.get(f"{NAME}_sim_v1").make({"plan": "annual"})
    physical = env.physical
    assert isinstance(physical, StateMachineEnv)
    env.reset(seed=0)
    names = []
    for _ in range(10):
        name = physical.oracle_action()
        names.append(name)
        *_, terminated, _, info = env.step(process.vocabulary.action_id(name))
        if terminated:
            break
    assert names == ["VERIFY", "FIND_PLAN", "MAKE_OFFER", "CANCEL"] and info["outcome"] == "goal"
