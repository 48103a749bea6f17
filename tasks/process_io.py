"""Business processes at the edge: ``configs/processes/<name>.yaml`` -> the core's frozen :class:`ProcessSpec`.

The YAML is read by the limited loader of :mod:`tasks.yaml_io`; the core validates the document.
Beyond the document itself, every channel's mapping file is checked against the process's
vocabulary (each token it emits, feature it fills and action it translates must be declared), so
a mapping written for another process fails here with the mapping file and key, not in a worker.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import ConfigError, MappingError
from agentflow_core.process import ProcessSpec
from agentflow_core.registry import load_mapping, resolve_mapping_path
from agentflow_core.semantics import Vocabulary
from tasks.yaml_io import YamlLimitError, load_yaml_file, load_yaml_text

PROCESS_DIR = Path("configs/processes")
SHIPPED_PROCESS_DIR = Path(__file__).resolve().parents[1] / PROCESS_DIR


def process_path(name: str, env_config_dir: Path | str = "configs/envs") -> Path:
    """The file of process ``name``: ``processes/`` beside the env config directory, else the shipped one.

    ``name`` is a bare name (the config's pattern refuses paths), so the file never lies outside the two.
    """
    beside = Path(env_config_dir).parent / "processes" / f"{name}.yaml"
    return beside if beside.is_file() else SHIPPED_PROCESS_DIR / f"{name}.yaml"


def read_process(path: Path) -> ProcessSpec:
    """Parse and validate one process file (without its channels' mapping files)."""
    if not path.is_file():
        raise ConfigError(str(path), "<file>", None, f"an existing process file (processes live in {PROCESS_DIR})")
    try:
        document = load_yaml_file(path)
    except YamlLimitError as exc:
        raise ConfigError(
            str(path), exc.where, exc.reason, "well-formed YAML (UTF-8, within the loader's limits)"
        ) from None
    return ProcessSpec.from_document(document, str(path))


def _declared(mapping: dict[str, Any]) -> tuple[set[str], set[str], set[str]]:
    tokens = {t for rule in mapping.get("token_rules", []) for t in rule.get("emit", [])}
    features = {rule.get("feature") for rule in mapping.get("feature_rules", [])}
    return tokens, {str(f) for f in features}, set(mapping.get("actions", {}))


def check_channels(process: ProcessSpec, env_config_dir: Path) -> None:
    """Every channel's mapping names only the process's tokens, features and actions; its family matches."""
    vocab = process.vocabulary
    for channel in process.channels:
        path = resolve_mapping_path(channel.mapping, Path(env_config_dir))
        if path is None:
            raise ConfigError(
                process.source,
                f"channels.{channel.family}.mapping",
                channel.mapping,
                f"a mapping file in {env_config_dir}",
            )
        mapping = load_mapping(path, load_yaml_text)
        if mapping.get("family") != channel.family:
            raise MappingError(
                str(path), "$.family", f"got {mapping.get('family')!r}, the process declares {channel.family!r}"
            )
        tokens, features, actions = _declared(mapping)
        for where, used, known in (
            ("token_rules", tokens, vocab.tokens),
            ("feature_rules", features, vocab.features),
            ("actions", actions, vocab.actions),
        ):
            unknown = sorted(used - set(known))
            if unknown:
                raise MappingError(
                    str(path), f"$.{where}", f"{unknown[0]!r} is not in process {process.name!r} ({process.source})"
                )


@functools.cache
def _cached(path: str, env_config_dir: str) -> ProcessSpec:
    process = read_process(Path(path))
    check_channels(process, Path(env_config_dir))
    return process


def load_process(cfg: AgentFlowConfig | None = None, *, name: str | None = None) -> ProcessSpec:
    """The process ``params.yaml`` selects (``process:``), validated with its channels; parsed once per file."""
    chosen = name or (cfg.process if cfg is not None else "checkout")
    env_dir = cfg.base.env_config_dir if cfg is not None else "configs/envs"
    return _cached(str(process_path(chosen, env_dir)), str(env_dir))


def check_config(cfg: AgentFlowConfig, source: str = "params.yaml") -> None:
    """What later phases would refuse, refused now: the config against its process and every env config.

    Every env config under ``base.env_config_dir`` must load (each names its process, and its mapping and
    params are checked against that process); the base envs must belong to the selected process; the
    variant dimensions and perturbations must be scenario fields the process declares in that role;
    ``stress.coverage_group`` a declared dimension; each sim-to-real family a channel of the process
    with a real counterpart.
    """
    from agentflow_core.errors import AgentFlowError
    from agentflow_core.variants import validate_generator
    from tasks.real_channels import real_channel_names
    from tasks.registry_io import load_registry

    process, v = load_process(cfg), cfg.variants
    scenario = process.vocabulary.scenario
    registry = load_registry(cfg)
    for i, env_id in enumerate(v.base_envs):
        try:
            entry = registry.get(env_id)
        except AgentFlowError:
            raise ConfigError(
                source, f"variants.base_envs.{i}", env_id, f"an env of {cfg.base.env_config_dir}"
            ) from None
        if entry.process != process.name:
            raise ConfigError(source, f"variants.base_envs.{i}", env_id, f"an env of process {process.name!r}")
    validate_generator(v.dimensions, v.perturbations, v.samples_per_combination, source, scenario=scenario)
    group = cfg.stress.coverage_group
    if group not in scenario.with_role("dimension"):
        expected = f"a dimension of process {process.name!r} ({list(scenario.with_role('dimension'))})"
        raise ConfigError(source, "stress.coverage_group", group, expected)
    if cfg.stress.sim_to_real.enabled:
        real = real_channel_names(process)
        for i, family in enumerate(cfg.stress.sim_to_real.families or ()):
            if family not in real:
                raise ConfigError(
                    source,
                    f"stress.sim_to_real.families.{i}",
                    family,
                    f"a channel of process {process.name!r} with a real counterpart ({sorted(real)})",
                )
        for channel in process.real_channels:
            if channel.env is not None and channel.env not in registry:
                raise ConfigError(process.source, f"real_channels.{channel.family}.env", channel.env, "an env id")


def known_vocabularies(env_config_dir: Path | str = "configs/envs") -> dict[str, Vocabulary]:
    """Process name -> vocabulary, for every process file beside ``env_config_dir`` and shipped (env configs name one)."""
    found: dict[str, Vocabulary] = {}
    for directory in (SHIPPED_PROCESS_DIR, Path(env_config_dir).parent / "processes"):
        if directory.is_dir():
            for path in sorted(directory.glob("*.yaml")):
                found[path.stem] = _read_cached(str(path.resolve())).vocabulary
    return found


@functools.cache
def _read_cached(path: str) -> ProcessSpec:
    return read_process(Path(path))
