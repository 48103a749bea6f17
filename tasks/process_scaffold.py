"""``agentflow process new NAME``: a working process scaffold written from the templates in ``tasks/scaffold/``.

The scaffold is a small process of its own (subscription cancellation: own tokens, actions, scenario
fields and dimensions, rules, probes) with two channels written as data -- the core's state-machine
simulator and its SQL channel -- their env configs and mappings, and ``params-NAME.yaml`` with small
budgets. ``agentflow run --params params-NAME.yaml`` trains it as it stands (docs/adding-a-process.md).

With ``forms=True`` (``agentflow process new NAME --forms``) it also writes the machine's three other
raw forms -- a web form, SQL rows and the machine HTTP service -- each an env config naming the same
machine document and a mapping translated from the simulator's (:mod:`tasks.machine_forms`), and adds
them to the process's channels and the catalogue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from agentflow_core.atomic import write_text
from tasks.machine_forms import FORMS, write_forms

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
# the machine's other raw forms (forms=True), written by tasks/machine_forms.py from the simulator channel
FORMS_LAYOUT = tuple(f"configs/{{name}}/envs/{{name}}_{form}_v1.{ext}" for form in FORMS for ext in ("yaml", "json"))
DB_CHANNEL = "  __NAME___db: {env: __NAME___db_v1, mapping: __NAME___db_v1.json}\n"
BASE_ENVS = "base_envs: [__NAME___sim_v1, __NAME___db_v1]"


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
    for target in [t for _, t in LAYOUT] + list(FORMS_LAYOUT):
        path = root / target.format(name=name)
        if path.exists():
            raise ScaffoldError(f"process {name!r} exists already: {path} (choose another name)")
    if (root / "configs" / name).exists():
        raise ScaffoldError(f"process {name!r} exists already: {root / 'configs' / name} (choose another name)")


def with_forms(template: str, text: str) -> str:
    """A template's text with the machine's other raw forms added to the channels and the catalogue."""
    if template == "process.yaml":
        extra = "".join(f"  __NAME___{f}: {{env: __NAME___{f}_v1, mapping: __NAME___{f}_v1.json}}\n" for f in FORMS)
        return text.replace(DB_CHANNEL, DB_CHANNEL + extra)
    if template == "params.yaml":
        return text.replace(BASE_ENVS, BASE_ENVS[:-1] + "".join(f", __NAME___{f}_v1" for f in FORMS) + "]")
    return text


def write_scaffold(name: str, root: Path = Path(), *, forms: bool = False) -> Scaffold:
    """Write the scaffold of process ``name`` under ``root``; a ScaffoldError before anything is written.

    ``forms``: also the machine's web-form, SQL-rows and HTTP-service channels (module docstring).
    """
    check_name(name, root)
    written = []
    for template, target in LAYOUT:
        text = (TEMPLATES / template).read_text(encoding="utf-8")
        text = (with_forms(template, text) if forms else text).replace(PLACEHOLDER, name)
        path = root / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text(path, text)
        written.append(Path(target.format(name=name)))
    if forms:
        sim_config = root / "configs" / name / "envs" / f"{name}_sim_v1.yaml"
        written.extend(path.relative_to(root) for path in write_forms(sim_config))
    return Scaffold(name, tuple(written))
