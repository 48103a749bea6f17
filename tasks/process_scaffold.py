"""``agentflow process new NAME``: a working process scaffold written from the templates in ``tasks/scaffold/``.

The scaffold is a small process of its own (subscription cancellation: own tokens, actions, scenario
fields and dimensions, rules, probes) with two channels written as data -- the core's state-machine
simulator and its SQL channel -- their env configs and mappings, and ``params-NAME.yaml`` with small
budgets. ``agentflow run --params params-NAME.yaml`` trains it as it stands (docs/adding-a-process.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agentflow_core.atomic import write_text

TEMPLATES = Path(__file__).resolve().parent / "scaffold"
PLACEHOLDER = "__NAME__"
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{1,30}$")
# template file -> where it goes, relative to the project root ({name} filled in)
LAYOUT = (
    ("process.yaml", "configs/processes/{name}.yaml"),
    ("sim_env.yaml", "configs/{name}/envs/{name}_sim_v1.yaml"),
    ("sim_mapping.json", "configs/{name}/envs/{name}_sim_v1.json"),
    ("machine.yaml", "configs/{name}/envs/channels/machine.yaml"),
    ("db_env.yaml", "configs/{name}/envs/{name}_db_v1.yaml"),
    ("db_mapping.json", "configs/{name}/envs/{name}_db_v1.json"),
    ("sql.yaml", "configs/{name}/envs/channels/sql.yaml"),
    ("params.yaml", "params-{name}.yaml"),
)


class ScaffoldError(ValueError):
    """The name is not usable (malformed, or a process, folder or params file of that name exists)."""


@dataclass(frozen=True)
class Scaffold:
    """The files one scaffold writes, relative to the project root."""

    name: str
    files: tuple[Path, ...]


def check_name(name: str, root: Path) -> None:
    """Refuse a malformed name or one whose files would overwrite something."""
    if not NAME_PATTERN.match(name) or name in ("checkout", "processes", "envs", "real_envs"):
        raise ScaffoldError(
            f"process name {name!r}: expected 2 to 31 lowercase letters, digits and '_', starting with a letter "
            "(not checkout, processes, envs, real_envs)"
        )
    for _, target in LAYOUT:
        path = root / target.format(name=name)
        if path.exists():
            raise ScaffoldError(f"process {name!r} exists already: {path} (choose another name)")
    if (root / "configs" / name).exists():
        raise ScaffoldError(f"process {name!r} exists already: {root / 'configs' / name} (choose another name)")


def write_scaffold(name: str, root: Path = Path()) -> Scaffold:
    """Write the scaffold of process ``name`` under ``root``; a ScaffoldError before anything is written."""
    check_name(name, root)
    written = []
    for template, target in LAYOUT:
        text = (TEMPLATES / template).read_text(encoding="utf-8").replace(PLACEHOLDER, name)
        path = root / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        written.append(Path(target.format(name=name)))
    return Scaffold(name, tuple(written))
