"""The env registry: env configs on disk -> validated, picklable :class:`EnvEntry` records.

Each file in the config directory (``configs/envs/*.yaml``) declares one base env::

    env_id: web_checkout_v2
    process: checkout                 # the business process whose vocabulary and scenario the env speaks
    class_path: agentflow_core.envs.web_checkout:WebCheckoutEnv
    adapter: web                      # template name, or "module:Class"
    mapping: web_checkout_v2.json     # next to the config first, then agentflow_core/mappings/
    params: {card_decline_rate: 0.1}  # scenario values of this env (fields the process declares)
    kwargs: {}                        # optional extra constructor arguments of the family
    spec: channel.yaml                # optional: a channel document (a file beside the config, or inline)

Code never comes from data: a ``class_path`` or explicit adapter path must lie in ``agentflow_core``
or be an entry point a user installed (groups ``agentflow.envs`` / ``agentflow.adapters``), checked
before anything is imported; a ``mapping`` path stays inside the config directory. A data-driven
channel (the state machine, the SQL channel) takes its document as ``spec``: loaded here with the
injected parser (a file inside the config directory, e.g. ``channels/machine.yaml``, or written inline),
checked by the class's ``check_spec(spec, vocabulary, source)`` (and the mapping's native actions by its
``check_native(spec, actions)``) and handed to it as the ``spec`` keyword.

Everything is checked when the file is loaded -- the process, class path, adapter, mapping schema,
scenario params, unknown keys, duplicate ids -- so a typo fails at ``refresh()`` with the file and key,
not in a Ray worker an hour later. The YAML parser is injected (``load``): the core never imports
yaml. An :class:`EnvEntry` holds the loaded mapping, so workers build envs from data alone
(gymnasium's ``EnvSpec`` idea: a spec is data, the factory is a callable).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow_core.adapters import adapter_class, load_object
from agentflow_core.envs.base import Scenario, make_env_id
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import AgentFlowError, MappingError, RegistryError
from agentflow_core.scenario import ScenarioValues
from agentflow_core.semantics import CHECKOUT, Vocabulary

PACKAGED_MAPPINGS_DIR = Path(__file__).resolve().parent / "mappings"
TRUSTED_PACKAGE = "agentflow_core"
ENV_ENTRY_POINTS = "agentflow.envs"
ADAPTER_ENTRY_POINTS = "agentflow.adapters"
MAX_CONFIG_BYTES = 1 << 20
REQUIRED_KEYS = frozenset({"env_id", "process", "class_path", "adapter", "mapping"})
OPTIONAL_KEYS = frozenset({"params", "kwargs", "description", "family", "version", "spec"})
DEFAULT_PROCESS = "checkout"
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

Loader = Callable[[str], Any]


@dataclass(frozen=True)
class EnvEntry:
    """One registered base env, as plain data (frozen and picklable for Ray workers)."""

    env_id: str
    family: str
    version: int
    class_path: str
    params: dict[str, Any] = field(hash=False)
    adapter: str
    mapping_path: str
    mapping: dict[str, Any] = field(hash=False, repr=False)
    source_file: str
    kwargs: dict[str, Any] = field(default_factory=dict, hash=False)
    description: str = ""
    process: str = DEFAULT_PROCESS
    vocabulary: Vocabulary = field(default=CHECKOUT, hash=False, repr=False)

    def build_adapter(self) -> Any:
        """This entry's semantic adapter over its mapping, in its process's vocabulary."""
        cls = adapter_class(self.adapter)
        if self.vocabulary == CHECKOUT:  # adapters written before processes were data take (mapping, source)
            return cls(self.mapping, source=self.mapping_path)
        return cls(self.mapping, source=self.mapping_path, vocabulary=self.vocabulary)

    def scenario(self, overrides: Mapping[str, Any] | None = None) -> ScenarioValues | Scenario:
        """The entry's params with ``overrides`` (a variant's params) on top, as its process's typed scenario.

        Checkout's envs take their :class:`Scenario` (built from the same declared fields); every other
        process's envs take the :class:`~agentflow_core.scenario.ScenarioValues` mapping.
        """
        values = self.vocabulary.scenario.build({**self.params, **dict(overrides or {})})
        return Scenario.from_dict(values) if self.process == DEFAULT_PROCESS else values

    def instance_id(self, suffix: str = "") -> str:
        """``<family>_v<version>_<date>[_<suffix>]``, the env_id a made env reports."""
        return make_env_id(self.family, self.version, suffix=suffix)

    def make(
        self, overrides: Mapping[str, Any] | None = None, env_id: str | None = None, *, suffix: str = ""
    ) -> SemanticEnv:
        """Build physical env + adapter as one :class:`SemanticEnv`.

        ``env_id`` (a variant's full id) takes precedence; otherwise the id is derived from
        family and version plus ``suffix``.
        """
        scenario = self.scenario(overrides)
        physical_cls = load_object(self.class_path)
        physical = physical_cls(scenario, env_id or self.instance_id(suffix), **self.kwargs)
        adapter = self.build_adapter()
        return SemanticEnv(physical, adapter, max_episode_steps=scenario.max_episode_steps)


def installed_class_paths(group: str) -> frozenset[str]:
    """``module:Attr`` values of the entry points installed in ``group`` (code a user chose to install)."""
    from importlib.metadata import entry_points

    return frozenset(ep.value.replace(" ", "") for ep in entry_points(group=group))


def check_trusted(path: str, group: str) -> None:
    """Refuse, before any import, a class path outside ``agentflow_core`` and the installed entry points.

    A config file is data: naming a module must not be enough to run it (importing runs its top level).
    """
    module = path.partition(":")[0]
    if ":" not in path or module == TRUSTED_PACKAGE or module.startswith(TRUSTED_PACKAGE + "."):
        return  # a malformed path is reported by load_object without importing anything
    if path not in installed_class_paths(group):
        raise ImportError(
            f"{path!r} is not allowed: classes come from {TRUSTED_PACKAGE} or from an installed entry point "
            f"of group {group!r} (declare it under [project.entry-points.{group!r}] of your package)"
        )


def resolve_mapping_path(mapping: str, config_dir: Path) -> Path | None:
    """Find a mapping file next to the config file, else in the packaged mappings; never outside those two.

    Absolute paths and ``..`` escapes are refused (a config must not read ``/etc/passwd``).
    """
    candidate = Path(mapping)
    if candidate.is_absolute():
        return None
    for base in (config_dir.resolve(), PACKAGED_MAPPINGS_DIR):
        path = (base / candidate).resolve()
        if path.is_relative_to(base) and path.is_file():
            return path
    return None


def _read_document(path: Path, load: Loader | None) -> Any:
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"larger than {MAX_CONFIG_BYTES} bytes")
    data = path.read_bytes()
    if data.startswith((b"\xff\xfe", b"\xfe\xff")) or b"\x00" in data:
        raise ValueError("binary or UTF-16 content; expected UTF-8 text")
    text = data.decode("utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    if load is None:
        raise RegistryError(str(path), "no YAML loader was injected (pass load=, e.g. tasks.yaml_io.load_yaml_text)")
    return load(text)


def load_mapping(path: Path, load: Loader | None = None) -> dict[str, Any]:
    """Read one mapping document (JSON, or YAML through the injected loader)."""
    try:
        document = _read_document(path, load)
    except (OSError, ValueError, RecursionError) as exc:
        raise MappingError(str(path), "$", f"unreadable: {type(exc).__name__}: {exc}") from None
    if not isinstance(document, dict):
        raise MappingError(str(path), "$", f"expected an object, got {type(document).__name__}")
    return document


def _checked_sections(config: Any, src: str) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The document's shape (known keys, required strings), before anything is imported; its params and kwargs."""
    if not isinstance(config, Mapping):
        raise RegistryError(src, f"expected a mapping at the top level, got {type(config).__name__}")
    unknown = sorted(set(config) - REQUIRED_KEYS - OPTIONAL_KEYS)
    if unknown:
        raise RegistryError(
            src, f"unknown key(s) {unknown}, expected a subset of {sorted(REQUIRED_KEYS | OPTIONAL_KEYS)}"
        )
    missing = sorted(REQUIRED_KEYS - set(config))
    if missing == ["process"]:
        raise RegistryError(src, "process: missing; name the business process the env belongs to (e.g. checkout)")
    if missing:
        raise RegistryError(src, f"missing key(s) {missing}")
    for key in sorted(REQUIRED_KEYS):
        if not isinstance(config[key], str) or not config[key]:
            raise RegistryError(src, f"{key}: got {config[key]!r}, expected a non-empty string")
    params, kwargs = config.get("params") or {}, config.get("kwargs") or {}
    for key, value in (("params", params), ("kwargs", kwargs)):
        if not isinstance(value, Mapping):
            raise RegistryError(src, f"{key}: got {value!r}, expected a mapping")
    return params, kwargs


def entry_from_config(
    config: Any,
    source_file: Path,
    load: Loader | None = None,
    vocabularies: Mapping[str, Vocabulary] | None = None,
) -> EnvEntry:
    """Validate one env config document and return its entry; every error names ``source_file``.

    ``process`` names the business process whose vocabulary the mapping speaks and whose scenario
    fields ``params`` sets; ``vocabularies`` holds the loaded processes by name (checkout's is built in).
    """
    src = str(source_file)
    params, kwargs = _checked_sections(config, src)
    known = {DEFAULT_PROCESS: CHECKOUT, **dict(vocabularies or {})}
    process = config["process"]
    if process not in known:
        raise RegistryError(src, f"process: got {str(process)[:80]!r}, expected one of {sorted(known)}")
    vocabulary = known[process]
    try:
        scenario = vocabulary.scenario.build(params)
        if process == DEFAULT_PROCESS:
            Scenario.from_dict(scenario)
    except (TypeError, ValueError) as exc:
        raise RegistryError(src, f"params: {exc}") from exc
    try:
        check_trusted(config["class_path"], ENV_ENTRY_POINTS)
        physical_cls = load_object(config["class_path"])
    except ImportError as exc:
        raise RegistryError(src, f"class_path: {exc}") from exc
    if not callable(physical_cls):
        raise RegistryError(src, f"class_path: {config['class_path']!r} is not callable")
    try:
        check_trusted(config["adapter"], ADAPTER_ENTRY_POINTS)
        adapter_cls = adapter_class(config["adapter"])
    except (KeyError, ImportError, TypeError) as exc:
        raise RegistryError(src, f"adapter: {exc}") from exc
    kwargs = _with_spec(config, kwargs, physical_cls, source_file, load, vocabulary)
    mapping_path = resolve_mapping_path(config["mapping"], source_file.parent)
    if mapping_path is None:
        raise RegistryError(
            src,
            f"mapping: file {config['mapping']!r} not found inside the config directory or {PACKAGED_MAPPINGS_DIR} "
            "(absolute paths and '..' are refused)",
        )
    mapping = load_mapping(mapping_path, load)
    _check_native(kwargs, mapping, physical_cls, str(mapping_path))
    if vocabulary == CHECKOUT:  # schema + template + per-rule condition checks
        adapter_cls(mapping, source=str(mapping_path))
    else:
        adapter_cls(mapping, source=str(mapping_path), vocabulary=vocabulary)  # type: ignore[call-arg]
    family, version = mapping["family"], int(mapping["version"])
    for key, expected in (("family", family), ("version", version)):
        if key in config and config[key] != expected:
            raise RegistryError(src, f"{key}: got {config[key]!r}, but mapping {mapping_path} declares {expected!r}")
    if not config["env_id"].startswith(f"{family}_v{version}"):
        raise RegistryError(src, f"env_id: got {config['env_id']!r}, expected it to start with '{family}_v{version}'")
    return EnvEntry(
        env_id=config["env_id"],
        family=family,
        version=version,
        class_path=config["class_path"],
        params=dict(params),
        adapter=config["adapter"],
        mapping_path=str(mapping_path),
        mapping=mapping,
        source_file=src,
        kwargs=dict(kwargs),
        description=str(config.get("description", "")),
        process=process,
        vocabulary=vocabulary,
    )


def _with_spec(
    config: Mapping[str, Any],
    kwargs: Mapping[str, Any],
    physical_cls: Any,
    source_file: Path,
    load: Loader | None,
    vocabulary: Vocabulary,
) -> Mapping[str, Any]:
    """``kwargs`` with the config's checked ``spec`` added (unchanged without one)."""
    if "spec" not in config:
        return kwargs
    return {**kwargs, "spec": _channel_spec(config["spec"], physical_cls, source_file, load, vocabulary)}


def _check_native(kwargs: Mapping[str, Any], mapping: Mapping[str, Any], physical_cls: Any, src: str) -> None:
    """A channel document's class checks the mapping's native actions against it (a typo is never issued)."""
    check = getattr(physical_cls, "check_native", None)
    if "spec" not in kwargs or check is None or not isinstance(mapping.get("actions"), Mapping):
        return
    try:
        check(kwargs["spec"], mapping["actions"])
    except ValueError as exc:
        raise RegistryError(src, f"actions: {exc}") from exc


def _channel_spec(spec: Any, physical_cls: Any, source_file: Path, load: Loader | None, vocabulary: Vocabulary) -> Any:
    """The env config's ``spec``: an inline mapping or a file inside the config directory, checked by its class."""
    src, where = str(source_file), str(source_file)
    if isinstance(spec, str):
        path = resolve_mapping_path(spec, source_file.parent)
        if path is None or path.is_relative_to(PACKAGED_MAPPINGS_DIR):
            raise RegistryError(src, f"spec: file {spec!r} not found inside the config directory")
        try:
            spec, where = _read_document(path, load), str(path)
        except (OSError, ValueError, RecursionError) as exc:
            raise RegistryError(str(path), f"unreadable: {type(exc).__name__}: {exc}") from None
    if not isinstance(spec, Mapping):
        raise RegistryError(src, f"spec: got {type(spec).__name__}, expected a mapping or a file name")
    check = getattr(physical_cls, "check_spec", None)
    if check is None:
        raise RegistryError(src, "spec: this class_path takes no channel document (no check_spec)")
    try:
        check(spec, vocabulary, where)
    except (AgentFlowError, ValueError, TypeError) as exc:
        raise RegistryError(src, f"spec: {exc}") from exc
    return dict(spec)


def read_config(path: Path, load: Loader | None = None) -> Any:
    """Parse one config file; parser errors become a RegistryError naming the file."""
    try:
        return _read_document(path, load)
    except RegistryError:
        raise
    except Exception as exc:  # whatever the injected parser raises on malformed input
        raise RegistryError(str(path), f"unreadable: {type(exc).__name__}: {exc}") from None


def is_mapping_document(document: Any) -> bool:
    """Mapping files may sit next to the env configs (``from-openapi`` writes both there)."""
    return isinstance(document, Mapping) and "token_rules" in document


def load_entry(path: Path, load: Loader | None = None) -> EnvEntry:
    """Read and validate one env config file."""
    return entry_from_config(read_config(path, load), path, load)


def config_files(config_dir: Path) -> list[Path]:
    """Candidate env config files of a directory, in a stable order (JSON mappings are skipped later)."""
    return sorted(p for p in Path(config_dir).iterdir() if p.is_file() and p.suffix in CONFIG_SUFFIXES)


class EnvRegistry:
    """Base envs declared in a config directory; ``refresh()`` picks up files added at run time."""

    def __init__(
        self, config_dir: Path | str, load: Loader | None = None, vocabularies: Mapping[str, Vocabulary] | None = None
    ) -> None:
        self.config_dir = Path(config_dir)
        self.load = load
        self.vocabularies = dict(vocabularies or {})
        self._entries: dict[str, EnvEntry] = {}
        self._lock = threading.Lock()
        self.refresh()

    def refresh(self) -> list[str]:
        """Rescan the directory; on any bad file raise and keep the previous entries. Returns new ids."""
        if not self.config_dir.is_dir():
            raise RegistryError(str(self.config_dir), "config directory does not exist")
        entries: dict[str, EnvEntry] = {}
        for path in config_files(self.config_dir):
            document = read_config(path, self.load)
            if path.suffix == ".json" and is_mapping_document(document):
                continue
            entry = entry_from_config(document, path, self.load, self.vocabularies)
            if entry.env_id in entries:
                raise RegistryError(
                    str(path), f"env_id {entry.env_id!r} is already declared in {entries[entry.env_id].source_file}"
                )
            entries[entry.env_id] = entry
        with self._lock:
            added = sorted(set(entries) - set(self._entries))
            self._entries = entries
        return added

    def entries(self) -> list[EnvEntry]:
        """All entries, ordered by env_id."""
        return [self._entries[k] for k in sorted(self._entries)]

    def env_ids(self) -> list[str]:
        """Registered env ids, sorted, without rescanning the config directory."""
        return sorted(self._entries)

    def get(self, env_id: str) -> EnvEntry:
        """The entry of ``env_id``; rescans once on a miss so a newly written config is found."""
        if env_id not in self._entries:
            self.refresh()
        try:
            return self._entries[env_id]
        except KeyError:
            raise RegistryError(
                str(self.config_dir), f"unknown env_id {env_id!r}, registered: {self.env_ids()}"
            ) from None

    def __contains__(self, env_id: object) -> bool:
        return env_id in self._entries

    def __len__(self) -> int:
        return len(self._entries)
