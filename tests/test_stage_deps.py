"""Every DVC stage's deps cover the code it runs: derived from the import graph of its entry point.

A stage runs ``bin/agentflow <phase>``: ``flows/cli/app.py`` (and everything it imports at module level)
plus the phase's command function, the same-module helpers it calls, and from there every import
of every module reached (module-level and inside functions: an over-approximation outside the
CLI modules, whose other commands do not run). A stage whose deps miss one of those files would
let DVC skip a rerun that the code change requires.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tasks.stages import REPO_ROOT, Stage, load_stages

PACKAGES = ("agentflow_core", "tasks", "benchmarks", "flows")
ENTRIES = {
    "calibrate": ("flows.cli.calibrate", "calibrate_command"),
    "variants": ("flows.cli.variants", "variants"),
    "explore": ("flows.cli.explore", "explore_command"),
    "offline": ("flows.cli.offline", "offline_command"),
    "export-minari": ("flows.cli.offline", "export_minari_command"),
    "validator": ("flows.cli.validator", "validator_command"),
    "tune": ("flows.cli.tune", "tune_command"),
    "train": ("flows.cli.train", "train_command"),
    "stress": ("flows.cli.stress", "stress_command"),
    "report": ("flows.cli.stress", "report_command"),
}


def module_file(module: str) -> Path | None:
    """The source file of a project module (package ``__init__`` or ``.py``), None for anything else."""
    if module.split(".")[0] not in PACKAGES:
        return None
    base = REPO_ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def imported_modules(nodes: list[ast.stmt] | list[ast.AST]) -> set[str]:
    """Project modules named by the import statements under ``nodes`` (``from a import b`` may name module a.b)."""
    found: set[str] = set()
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    out = set()
    for name in found:
        parts = name.split(".")
        out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1) if module_file(".".join(parts[:i])))
    return out


def entry_imports(module: str, function: str) -> set[str]:
    """Module-level imports of a CLI module plus those inside ``function`` and the module's functions it calls."""
    path = module_file(module)
    assert path is not None, module
    tree = ast.parse(path.read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    body_level = [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)]
    todo, seen = [function], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in functions:
            continue
        seen.add(name)
        todo += [
            c.func.id for c in ast.walk(functions[name]) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
        ]
    return imported_modules(body_level) | imported_modules([functions[n] for n in seen])


def is_cli(module: str) -> bool:
    return module == "flows.cli" or module.startswith("flows.cli.")


def stage_code(stage: str) -> set[Path]:
    """Every project source file the stage's command can run."""
    entry_module, entry_function = ENTRIES[stage]
    todo = (
        entry_imports("flows.cli.app", "main")
        | entry_imports(entry_module, entry_function)
        | {"flows.cli.app", entry_module}
    )
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = module_file(module)
        assert path is not None
        tree = ast.parse(path.read_text())
        nodes = (
            [n for n in tree.body if not isinstance(n, ast.FunctionDef | ast.ClassDef)] if is_cli(module) else [tree]
        )
        todo |= imported_modules(nodes)
        parts = module.split(".")
        todo |= {".".join(parts[:i]) for i in range(1, len(parts))}  # importing a.b runs a/__init__.py
    return {module_file(m) for m in seen}  # type: ignore[misc]


def uncovered(stage: Stage, files: set[Path]) -> list[str]:
    deps = [REPO_ROOT / d for d in stage.deps]
    return sorted(str(f.relative_to(REPO_ROOT)) for f in files if not any(f == d or d in f.parents for d in deps))


@pytest.mark.parametrize("name", list(ENTRIES))
def test_stage_deps_cover_the_code_the_stage_runs(name: str) -> None:
    stage = load_stages()[name]
    missing = uncovered(stage, stage_code(name))
    assert not missing, f"dvc.yaml stage {name!r} runs code its deps do not cover: {missing}"


@pytest.mark.parametrize("name", list(ENTRIES))
def test_no_stage_runs_or_depends_on_the_benchmarks(name: str) -> None:
    """The benchmarks are reached only through ``agentflow bench`` (imported inside its commands)."""
    stage = load_stages()[name]
    assert not [d for d in stage.deps if d.split("/")[0] == "benchmarks"], stage.deps
    benchmarks = REPO_ROOT / "benchmarks"
    assert not [str(f) for f in stage_code(name) if benchmarks in f.parents], name


def test_an_incomplete_stage_is_caught() -> None:
    stage = load_stages()["train"]
    files = stage_code("train")
    narrowed = tuple("agentflow_core/rl" if d == "agentflow_core" else d for d in stage.deps)  # the old, narrower deps
    missing = uncovered(Stage(stage.name, stage.cmd, narrowed, (), ()), files)
    assert {"agentflow_core/semantics.py", "agentflow_core/variants.py", "agentflow_core/config/__init__.py"} <= set(
        missing
    )


def test_every_stage_has_an_entry_and_a_path_independent_command() -> None:
    stages = load_stages()
    assert set(stages) == set(ENTRIES)
    for stage in stages.values():
        assert stage.cmd.startswith(f"bin/agentflow {stage.name} "), stage.cmd
