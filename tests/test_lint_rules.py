"""The lint gate docs/usage.md describes: docstrings for public names and McCabe complexity <= 12 are on."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PUBLIC_DOCSTRINGS = {"D101", "D102", "D103", "D104", "D106"}


def test_ruff_config_turns_on_docstring_and_complexity_rules() -> None:
    lint = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["lint"]
    assert PUBLIC_DOCSTRINGS | {"C901"} <= set(lint["select"])
    assert not {"D105", "D107"} & set(lint["select"])
    assert lint["mccabe"]["max-complexity"] == 12
    assert "D" in lint["per-file-ignores"]["tests/**"]


def _ruff(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(REPO / "pyproject.toml"), *args]
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True)


def test_library_tasks_and_flows_pass_the_rules() -> None:
    result = _ruff("agentflow_core", "tasks", "flows")
    assert result.returncode == 0, result.stdout + result.stderr


def test_an_undocumented_public_function_fails_the_gate(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text('"""A module."""\n\n\ndef public() -> None:\n    pass\n')
    result = _ruff("--output-format", "concise", str(module))
    assert result.returncode == 1
    assert "D103" in result.stdout
