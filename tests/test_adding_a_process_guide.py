"""docs/adding-a-process.md, followed verbatim: its shell blocks run in a temporary copy of the project.

The guide's commands write the scaffold, validate it and run the whole cycle with the scaffold's own
budgets; the trained policy must then reach what the rules reach on the test split: the goal on every
account that can be cancelled and the handled outcome (escalation) on every disputed one -- and the same
on the real system the process file names (its SQL channel on PostgreSQL), per dimension value.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs/adding-a-process.md"
BLOCK = re.compile(r"^```bash\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def guide_commands() -> list[str]:
    """The guide's shell commands, in order."""
    return [line for m in BLOCK.finditer(GUIDE.read_text()) for line in m["body"].splitlines() if line.strip()]


def project_copy(root: Path) -> Path:
    """The tracked and unignored files of this checkout, copied; the shared virtual environment linked."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, root / name)
    (root / ".venv").symlink_to((REPO / ".venv").resolve())
    return root


def test_the_guide_names_a_scaffold_validate_run_and_report() -> None:
    commands = guide_commands()
    assert commands[0].startswith("bin/agentflow process new ")
    assert any(" validate " in c for c in commands) and any(" run " in c for c in commands)
    assert all(c.startswith(("bin/agentflow ", "cat ")) for c in commands), commands


@pytest.mark.slow
def test_following_the_guide_trains_a_policy_as_good_as_the_rules(tmp_path: Path) -> None:
    project = project_copy(tmp_path / "project")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MLFLOW_TRACKING", "RAY_ADDRESS"))}
    env |= {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1"}
    for command in guide_commands():
        done = subprocess.run(
            ["bash", "-c", command], cwd=project, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    name = guide_commands()[0].split()[-1]
    metrics = json.loads((project / "data" / name / "metrics/train.json").read_text())
    assert metrics["test/process_success"] == 1.0
    goal = "test/goal_success"  # the goal token's success
    assert metrics[f"{goal}/account/ok"] == 1.0 and metrics[f"{goal}/account/disputed"] == 0.0
    assert metrics["test/process_success/account/disputed"] == 1.0  # escalated: the handled outcome
    report = (project / "data" / name / "reports/report.md").read_text()
    # the guide's last command retrains from the champion: a decision, promote or keep, with its reason
    champion = json.loads((project / "data" / name / "reports/report.json").read_text())["champion"]
    assert isinstance(champion["promote"], bool) and champion["reason"] and champion["model_version"] >= 2
    assert "CANCELLED" in report
    # sim-to-real: the SQL channel on PostgreSQL, as the process file names it (real success, gap, per dimension)
    stress = json.loads((project / "data" / name / "metrics/stress.json").read_text())
    assert stress[f"real_process_success_{name}_db"] == 1.0 and stress["sim_to_real_max_gap"] == 0.0
    assert stress["sim_to_real_gap/account/disputed"] == 0.0 == stress["sim_to_real_gap/account/ok"]
    assert stress["sim_to_real_real_process_success/plan/annual"] == 1.0
    assert "Sim-to-real by dimension value" in report and "on PostgreSQL (pgserver)" in report
