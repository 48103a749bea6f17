"""The env registry at the edge: the core's registry with the YAML parser injected."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agentflow_core.config import AgentFlowConfig
from agentflow_core.registry import EnvRegistry
from tasks.yaml_io import load_yaml_text


def yaml_load(text: str) -> object:
    """The registry's injected parser: the limited loader of :mod:`tasks.yaml_io` (no alias bombs, no duplicates)."""
    return load_yaml_text(text)


def load_registry(cfg: AgentFlowConfig | None = None, config_dir: Path | None = None) -> EnvRegistry:
    """The registry of ``base.env_config_dir`` (or ``config_dir``), knowing every shipped process's vocabulary."""
    from tasks.process_io import known_vocabularies

    directory = config_dir or Path(cfg.base.env_config_dir if cfg else "configs/envs")
    return EnvRegistry(directory, load=yaml_load, vocabularies=known_vocabularies(directory))


def configure_adapter_debug() -> None:
    """``DEBUG_ADAPTER=1`` logs every mapping decision (raw value, rule, token) to stderr."""
    if os.environ.get("DEBUG_ADAPTER") == "1":
        logger = logging.getLogger("agentflow.adapter")
        logger.setLevel(logging.DEBUG)
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s adapter %(message)s"))
            logger.addHandler(handler)
