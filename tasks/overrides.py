"""Overrides of any ``params.yaml`` key for one cycle: ``--set train.total_steps=4096`` or a Prefect parameter.

An override is a dotted key path and a value. The overrides are applied to the parsed
``params.yaml`` mapping and the result goes through the same validation as the file itself
(:func:`tasks.config_io.parse_config`), so a misspelt key or a bad value fails at once with the
usual one-line :class:`~agentflow_core.errors.ConfigError` naming the key. The validated result is
written once, content-addressed, to ``<base.state_dir>/params/<sha256>.yaml``: every task of the
cycle, the MLflow parent run (as its ``config`` artifact) and a later ``agentflow reproduce`` read
that one file, so what ran is what was recorded.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from agentflow_core.atomic import write_text
from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import ConfigError
from tasks.config_io import parse_config
from tasks.yaml_io import YamlLimitError, load_yaml_file, load_yaml_text

SOURCE_SUFFIX = " + overrides"


def parse_set(items: Iterable[str]) -> dict[str, Any]:
    """``["train.total_steps=4096", "report.formats=[md]"]`` → ``{"train.total_steps": 4096, ...}``.

    Values are YAML scalars or flow collections read by the project's limited loader (``4096`` is
    an int, ``0.5`` a float, ``true`` a bool, ``[md, json]`` a list, anything else a string).
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError("--set", item, item, "KEY=VALUE with a dotted key path, e.g. train.total_steps=4096")
        try:
            out[key] = load_yaml_text(text) if text.strip() else ""
        except YamlLimitError as exc:
            raise ConfigError("--set", key, text, f"a YAML value ({exc.reason})") from None
    return out


def apply_overrides(data: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``data`` with each dotted key set; a path through a non-mapping is a ConfigError."""
    merged: dict[str, Any] = copy.deepcopy(dict(data))
    for dotted, value in overrides.items():
        parts = str(dotted).split(".")
        if not all(parts):
            raise ConfigError("overrides", str(dotted), value, "a dotted key path such as train.total_steps")
        node: dict[str, Any] = merged
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise ConfigError("overrides", str(dotted), value, f"a key inside a mapping, but {where} is a value")
            node = child
        node[parts[-1]] = value
    return merged


def overridden_config(params_path: str | Path, overrides: Mapping[str, Any]) -> tuple[AgentFlowConfig, dict[str, Any]]:
    """The validated config of ``params_path`` with ``overrides`` applied, and the merged mapping."""
    path = Path(params_path)
    try:
        data = load_yaml_file(path) if path.is_file() else None
    except YamlLimitError as exc:
        raise ConfigError(str(path), exc.where, exc.reason, "well-formed YAML") from None
    if data is None and not path.is_file():
        raise ConfigError(str(path), "<file>", None, "an existing params.yaml (create one or pass --params)")
    merged = apply_overrides(data or {}, overrides)
    return parse_config(merged, f"{path}{SOURCE_SUFFIX}"), merged


def resolve_params(params_path: str | Path, overrides: Mapping[str, Any] | None) -> str:
    """``params_path`` itself without overrides; else the validated, overridden copy under ``state_dir/params``."""
    if not overrides:
        return str(params_path)
    cfg, merged = overridden_config(params_path, overrides)
    text = f"# {params_path} with overrides {json.dumps(dict(overrides), default=str)}\n" + yaml.safe_dump(
        merged, sort_keys=False
    )
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
    out = Path(cfg.base.state_dir) / "params" / f"{digest}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        write_text(out, text)
    return str(out)
