"""Load ``params.yaml`` once, at the edge, into the typed :class:`AgentFlowConfig`.

Every failure becomes one :class:`ConfigError` naming the file, the key path, the bad value and
what was expected; the CLI turns it into exit code 2 before anything is written.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import ConfigError, shown
from tasks.yaml_io import YamlLimitError, load_yaml_file

DEFAULT_PARAMS = Path("params.yaml")


def _key_path(loc: tuple[Any, ...]) -> str:
    parts = (str(part) if str(part).isidentifier() or isinstance(part, int) else shown(part, 80) for part in loc)
    return ".".join(parts) or "<root>"


def _lookup(data: Any, loc: tuple[Any, ...]) -> Any:
    for part in loc:
        if (
            isinstance(data, dict)
            and part in data
            or isinstance(data, list)
            and isinstance(part, int)
            and part < len(data)
        ):
            data = data[part]
        else:
            return None
    return data


def _process_context(data: dict[str, Any]) -> dict[str, Any] | None:
    """Validation context naming the selected process's vocabulary (token and feature names in rewards).

    None for checkout (its names are the core's defaults), for a value the ``process`` field refuses anyway and
    for a missing process file (``load_process`` reports it).
    """
    from tasks.process_io import process_path, read_process

    name, base = data.get("process", "checkout"), data.get("base")
    env_dir = base.get("env_config_dir", "configs/envs") if isinstance(base, dict) else "configs/envs"
    if name == "checkout" or not isinstance(name, str) or not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", name):
        return None
    path = process_path(name, str(env_dir))
    return {"vocabulary": read_process(path).vocabulary} if path.is_file() else None  # load_process names it


def parse_config(data: Any, source: str = "<params>") -> AgentFlowConfig:
    """Validate an already-parsed mapping; the first problem becomes a :class:`ConfigError`."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            source,
            "<root>",
            data,
            "a mapping with sections base, calibrate, variants, pool, explore, train, stress, report",
        )
    try:
        return AgentFlowConfig.model_validate(data, context=_process_context(data))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden":
            expected = (
                "no such key (unknown keys are rejected; check the spelling against params.yaml's documented sections)"
            )
            value = _lookup(data, loc)
        else:
            expected = err["msg"].removeprefix("Value error, ")
            # Model-level validators report at the section; the input is the section then.
            value = err.get("input", _lookup(data, loc))
        raise ConfigError(source, _key_path(loc), value, expected) from None


def load_config(path: str | Path = DEFAULT_PARAMS) -> AgentFlowConfig:
    """Read and validate ``params.yaml``. A missing file, malformed YAML or bad value raises ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), "<file>", None, "an existing params.yaml (create one or pass --params)")
    try:
        data = load_yaml_file(path)
    except YamlLimitError as exc:
        raise ConfigError(
            str(path), exc.where, exc.reason, "well-formed YAML (UTF-8, within the loader's limits)"
        ) from None
    except OSError as exc:
        raise ConfigError(str(path), "<file>", exc.strerror, "a readable params.yaml") from None
    return parse_config(data, str(path))


def flatten_params(cfg: AgentFlowConfig) -> dict[str, str]:
    """``section.key.sub`` → value strings, for experiment trackers."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}.{key}" if prefix else str(key), sub)
        else:
            out[prefix] = str(value)

    walk("", cfg.model_dump(mode="json"))
    return out
