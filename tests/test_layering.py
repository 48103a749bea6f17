"""The dependency direction flows -> benchmarks -> tasks -> agentflow_core, checked by parsing imports."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN_IN_CORE = {"prefect", "mlflow", "dvc", "yaml", "tasks", "benchmarks", "flows"}
FORBIDDEN_IN_TASKS = {"benchmarks", "flows"}
FORBIDDEN_IN_BENCHMARKS = {"flows"}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def offenders(package: str, forbidden: set[str], repo: Path) -> dict[str, set[str]]:
    found = {}
    for path in sorted((repo / package).rglob("*.py")):
        bad = imported_roots(path) & forbidden
        if bad:
            found[str(path.relative_to(repo))] = bad
    return found


def test_core_imports_no_orchestration_tracking_or_yaml(repo_root: Path) -> None:
    assert offenders("agentflow_core", FORBIDDEN_IN_CORE, repo_root) == {}


def test_tasks_do_not_import_flows(repo_root: Path) -> None:
    assert offenders("tasks", FORBIDDEN_IN_TASKS, repo_root) == {}


def test_benchmarks_do_not_import_flows(repo_root: Path) -> None:
    assert offenders("benchmarks", FORBIDDEN_IN_BENCHMARKS, repo_root) == {}


def test_core_reads_no_environment_and_prints_nothing(repo_root: Path) -> None:
    hits = []
    for path in sorted((repo_root / "agentflow_core").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in {"environ", "getenv"}:
                hits.append(f"{path.name}:{node.lineno} os.{node.attr}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                hits.append(f"{path.name}:{node.lineno} print()")
    assert hits == []


def test_the_checker_catches_a_planted_violation(tmp_path: Path) -> None:
    pkg = tmp_path / "agentflow_core"
    pkg.mkdir()
    (pkg / "bad.py").write_text("import mlflow\nfrom prefect import flow\n")
    assert offenders("agentflow_core", FORBIDDEN_IN_CORE, tmp_path) == {"agentflow_core/bad.py": {"mlflow", "prefect"}}


def test_the_cli_starts_without_importing_torch_mlflow_or_ray(repo_root: Path) -> None:
    """A command reaches its own code in about a second: torch, MLflow, Prefect and Ray are imported
    by the commands that use them (``agentflow train`` starts its Ray before importing torch)."""
    import json
    import subprocess
    import sys

    script = (
        "import json, sys; import flows.cli.app; from flows.cli.common import config_or_exit; "
        "config_or_exit(__import__('pathlib').Path('params.yaml')); "
        "print(json.dumps(sorted(m for m in ('torch', 'mlflow', 'prefect', 'ray') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", script], cwd=repo_root, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_the_core_layers_contract_places_every_core_module(repo_root: Path) -> None:
    """import-linter checks only the modules a layer names: a new top-level module of the core must be
    given its layer in pyproject.toml, or nothing would check which way its imports point."""
    import re
    import tomllib

    contracts = tomllib.loads((repo_root / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers" and c.get("containers") == ["agentflow_core"]]
    placed = [name for layer in layers for name in re.split(r"\s*[|:]\s*", layer)]
    core = repo_root / "agentflow_core"
    modules = {p.stem for p in core.glob("*.py") if p.stem != "__init__"} | {
        p.parent.name for p in core.glob("*/__init__.py")
    }
    assert sorted(placed) == sorted(modules)


def test_no_module_is_over_500_lines(repo_root: Path) -> None:
    """A module that passes 500 lines is split by responsibility before it grows further."""
    packages = ("agentflow_core", "agentflow_refund", "agentflow_oscar", "tasks", "benchmarks", "flows")
    long = {
        str(path.relative_to(repo_root)): lines
        for package in packages
        for path in sorted((repo_root / package).rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 500
    }
    assert long == {}
