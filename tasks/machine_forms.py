"""A machine process's three other raw forms, written from its simulator channel: env configs and mappings.

A process declared as a state machine runs on the simulator channel (``StateMachineEnv``, a ``db``
mapping over ``state.NAME`` and ``last.failure_reason``). The same machine document also runs as a
web form, as SQL rows and behind the machine HTTP service (``agentflow_core/envs/machine_web.py``,
``machine_sql.py``, ``machine_http.py``); this module writes their env configs (the simulator's, with
another ``class_path``, adapter and mapping) and translates the simulator's mapping rule by rule into
each form's raw shape, so the business logic and its reading stay in one place each::

    state.verified  == 1     web:  {"field": "verified", "op": "==", "value": 1}
                             rows: {"column": "machine_variable.verified.value", "op": "==", "value": 1}
                             http: {"json_path": "$.record.verified", "op": "==", "value": 1}
    last.failure_reason = r  web:  the error banner, its text the reason's sentence
                             rows: {"column": "machine_event.reason", "equals": r}
                             http: {"json_path": "$.error.code", "equals": r}

``agentflow process forms NAME`` (and ``agentflow process new NAME --forms``) call :func:`write_forms`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from agentflow_core.atomic import write_text
from agentflow_core.envs.machine_web import RESERVED_NAMES, button_id, reason_text
from tasks.yaml_io import load_yaml_file

MACHINE_CLASS = "agentflow_core.envs.state_machine:StateMachineEnv"
FORMS: dict[str, tuple[str, str, str]] = {  # form -> (class_path, adapter, what it is)
    "web": ("agentflow_core.envs.machine_web:MachineWebEnv", "web", "a web form"),
    "rows": ("agentflow_core.envs.machine_sql:MachineSQLEnv", "db", "SQL rows"),
    "http": ("agentflow_core.envs.machine_http:MachineHttpEnv", "api", "the machine HTTP service"),
}
_SIM_ID = re.compile(r"^(?P<stem>[a-z][a-z0-9_]*)_sim_v(?P<version>\d+)$")
Leaf = Callable[[str, Mapping[str, Any]], dict[str, Any]]


class FormsError(ValueError):
    """The simulator channel cannot be carried over (a rule with no counterpart, a file that exists)."""


def _state_leaf(form: str, name: str, when: Mapping[str, Any]) -> dict[str, Any]:
    if "in" in when:
        return {"any": [_state_leaf(form, name, {"op": "==", "value": v}) for v in when["in"]]}
    if "equals" in when:
        when = {"op": "==", "value": when["equals"]}
    if "op" not in when:
        raise FormsError(f"state.{name}: {dict(when)} has no counterpart on the forms (variables are numbers)")
    op, value = when["op"], when["value"]
    if form == "web":
        return {"field": name, "op": op, "value": value}
    if form == "rows":
        return {"column": f"machine_variable.{name}.value", "op": op, "value": value}
    return {"json_path": f"$.record.{name}", "op": op, "value": value}


def _reason_leaf(form: str, when: Mapping[str, Any]) -> dict[str, Any]:
    if "in" in when:
        return {"any": [_reason_leaf(form, {"equals": r}) for r in when["in"]]}
    if "is_null" in when:
        absent = bool(when["is_null"])
        if form == "web":
            return {"banner": "none" if absent else "error"}
        if form == "rows":
            return {"column": "machine_event.reason", "is_null": absent}
        return {"json_path": "$.error", "exists": not absent}
    if "equals" not in when:
        raise FormsError(f"last.failure_reason: {dict(when)} has no counterpart on the forms")
    reason = str(when["equals"])
    if form == "web":
        return {"all": [{"banner": "error"}, {"text_regex": "(?m)^" + re.escape(reason_text(reason)) + "$"}]}
    if form == "rows":
        return {"column": "machine_event.reason", "equals": reason}
    return {"json_path": "$.error.code", "equals": reason}


def translate_condition(form: str, when: Mapping[str, Any]) -> dict[str, Any]:
    """One condition of the simulator's mapping in the form's raw shape (combinators kept)."""
    for key in ("all", "any"):
        if key in when:
            return {key: [translate_condition(form, item) for item in when[key]]}
    if "not" in when:
        return {"not": translate_condition(form, when["not"])}
    column = str(when.get("column", ""))
    rest = {k: v for k, v in when.items() if k != "column"}
    if column.startswith("state."):
        return _state_leaf(form, column.removeprefix("state."), rest)
    if column == "last.failure_reason":
        return _reason_leaf(form, rest)
    raise FormsError(f"column {column!r}: the forms carry state.NAME and last.failure_reason only")


def translate_source(form: str, source: str) -> str:
    """A feature's source column in the form's raw shape."""
    if not source.startswith("state."):
        raise FormsError(f"feature source {source!r}: the forms carry state.NAME only")
    name = source.removeprefix("state.")
    if form == "web":
        if name in RESERVED_NAMES:
            raise FormsError(f"variable {name!r} is a page key on the web form: rename it")
        return name
    return f"machine_variable.{name}.value" if form == "rows" else f"$.record.{name}"


def translate_action(form: str, native: Mapping[str, Any]) -> dict[str, Any]:
    """A simulator native action (``{"type": "machine", "action": A}``, optional ``requires``) on the form."""
    action = str(native.get("action"))
    if native.get("type") != "machine":
        raise FormsError(f"native action {dict(native)}: expected {{type: machine, action: ...}}")
    if form == "web":
        out: dict[str, Any] = {"type": "click", "target": button_id(action)}
    elif form == "rows":
        out = {"type": "transaction", "action": action}
    else:
        out = {"type": "http", "operation": action}
    if "requires" in native:
        out["requires"] = translate_condition(form, native["requires"])
    return out


def form_mapping(form: str, sim: Mapping[str, Any], family: str) -> dict[str, Any]:
    """The simulator's mapping translated for ``form`` (module docstring), under the family ``family``."""
    out = {k: v for k, v in sim.items() if k not in ("token_rules", "feature_rules", "actions")}
    what = FORMS[form][2]
    out.update(family=family, template=FORMS[form][1], description=f"{what}, translated from {sim.get('family')}")
    out["token_rules"] = [{**r, "when": translate_condition(form, r["when"])} for r in sim.get("token_rules", [])]
    out["feature_rules"] = [{**r, "source": translate_source(form, r["source"])} for r in sim.get("feature_rules", [])]
    out["actions"] = {name: translate_action(form, native) for name, native in (sim.get("actions") or {}).items()}
    return out


def machine_configs(env_dir: Path, process: str) -> list[Path]:
    """The simulator env configs of ``process`` in ``env_dir`` (state machines with a ``<stem>_sim_vN`` id)."""
    found = []
    for path in sorted(env_dir.glob("*_sim_v*.yaml")):
        config = load_yaml_file(path)
        if (
            isinstance(config, Mapping)
            and config.get("class_path") == MACHINE_CLASS
            and config.get("process") == process
        ):
            found.append(path)
    return found


def write_forms(sim_config: Path) -> list[Path]:
    """Write the three forms' env configs and mappings beside a simulator env config (``<stem>_sim_vN.yaml``)."""
    config: dict[str, Any] = load_yaml_file(sim_config)
    match = _SIM_ID.match(str(config.get("env_id", "")))
    if config.get("class_path") != MACHINE_CLASS or match is None:
        raise FormsError(f"{sim_config}: expected a state-machine env config with env_id <stem>_sim_v<N>")
    folder, stem, version = sim_config.parent, match["stem"], match["version"]
    sim = json.loads((folder / str(config["mapping"])).read_text(encoding="utf-8"))
    planned: dict[Path, str] = {}
    for form, (class_path, adapter, what) in FORMS.items():
        env_id = f"{stem}_{form}_v{version}"
        mapping = form_mapping(form, sim, f"{stem}_{form}")
        env = {**config, "env_id": env_id, "class_path": class_path, "adapter": adapter, "mapping": f"{env_id}.json"}
        env["description"] = f"{config.get('description', stem)}, as {what}"
        header = f"# {what.capitalize()}: the state machine of {config['spec']} in another raw form (tasks/machine_forms.py).\n"
        planned[folder / f"{env_id}.yaml"] = header + yaml.safe_dump(env, sort_keys=False)
        planned[folder / f"{env_id}.json"] = json.dumps(mapping, indent=1) + "\n"
    existing = [str(p) for p in planned if p.exists()]
    if existing:
        raise FormsError(f"exists already: {existing[0]} (remove it to write the forms again)")
    for path, text in planned.items():
        write_text(path, text)
    return list(planned)
