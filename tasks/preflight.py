"""What the configured cycle needs outside Python, checked in seconds before phase 0.

``agentflow validate`` lists every check in its plan tree, and ``agentflow run`` (and the flow itself,
when a deployment starts it) refuses to begin while one fails, one line per failure saying what to
install or change. Without this a missing browser surfaced only in the stress phase, after minutes
of work. What is checked follows the configuration:

* the browser: Chromium at the ``chromium_path`` of every browser env the cycle makes (a training env
  whose class lives in ``agentflow_core.envs.web_browser``, and the real web channel of the stress
  phase's sim-to-real check), plus Playwright, which drives it; the binary must run (``--version``);
* PostgreSQL: the server binaries the ``pgserver`` package ships, wherever an order_db env asks for
  ``url: pgserver`` (the training registry, or the real SQL channel of the sim-to-real check);
* services the configuration names by address (a Prefect API, an MLflow server, the reward-model
  service, an env's ``url``/``server_url``/``base_url``): something must listen there;
* fixed loopback ports (an env's ``port`` kwarg other than 0): free to bind;
* the data and state folders: writable (created where missing, as the cycle would).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import AgentFlowError, RequirementError
from agentflow_core.registry import EnvEntry
from tasks.registry_io import load_registry

BROWSER_MODULE = "agentflow_core.envs.web_browser"
DEFAULT_CHROMIUM = "/usr/bin/chromium"  # agentflow_core.envs.web_browser.DEFAULT_CHROMIUM, without importing the env
REAL_BROWSER_ENV = "web_browser_v1"  # tasks.real_channels.BROWSER_ENV_ID (that module imports torch)
EMBEDDED_POSTGRES = "pgserver"
POSTGRES_BINARIES = ("initdb", "pg_ctl", "postgres")
URL_KWARGS = ("url", "server_url", "base_url")
DEFAULT_PORTS = {"http": 80, "https": 443, "postgresql": 5432}
PROBE_TIMEOUT_S = 2.0
RUN_TIMEOUT_S = 10.0
INSTALL_HINT = "install it (`make install` does as root; or apt-get install -y chromium)"


@dataclass(frozen=True)
class Check:
    """One external requirement of the cycle and, when it is not met, one line saying what to do."""

    requirement: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the requirement is met."""
        return self.problem is None


def preflight(cfg: AgentFlowConfig) -> list[Check]:
    """Every external requirement of the configured cycle, checked (none of them starts a service)."""
    entries = list(_cycle_entries(cfg))
    checks: list[Check] = []
    browsers = _users(entries, _is_browser, _chromium_path)
    for path, users in browsers.items():
        files = sorted({e.source_file for e in entries if _is_browser(e) and _chromium_path(e) == path})
        checks.append(check_browser(path, users, files))
    if browsers:
        checks.append(check_module("playwright", "the browser envs' driver"))
    real = cfg.stress.sim_to_real
    if "stress" in cfg.phases and real.enabled and real.oscar_episodes > 0:
        checks.append(check_module("oscar", "the django-oscar store of the stress phase's sim-to-real run"))
        checks.append(check_oscar_store(cfg))
    postgres = [e.env_id for e in entries if e.kwargs.get("url") == EMBEDDED_POSTGRES]
    if postgres:
        checks.append(check_embedded_postgres(postgres))
    for address, users in _service_addresses(cfg, entries).items():
        checks.append(check_listening(address, users))
    for port, users in _users(entries, lambda e: _fixed_port(e) is not None, lambda e: str(_fixed_port(e))).items():
        checks.append(check_port_free(int(port), users))
    checks.append(check_writable(Path(cfg.base.state_dir), "base.state_dir"))
    checks.append(check_writable(Path(cfg.base.data_dir), "base.data_dir"))
    return checks


def require(cfg: AgentFlowConfig) -> None:
    """Raise :class:`RequirementError` naming every failed check (one line each) before anything runs."""
    problems = [c.problem for c in preflight(cfg) if c.problem is not None]
    if problems:
        raise RequirementError(problems)


def check_browser(path: str, users: list[str], configured_in: list[str]) -> Check:
    """Chromium at ``path`` exists, is executable and answers ``--version``.

    ``configured_in``: the registry files whose ``chromium_path`` (or its default) names ``path``.
    """
    who = ", ".join(users)
    requirement = f"Chromium at {path} (for {who})"
    hint = f"{INSTALL_HINT}, or set chromium_path in {', '.join(configured_in)}"
    if not os.path.exists(path):
        return Check(requirement, f"Chromium not found at {path} (needed by {who}): {hint}")
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        return Check(requirement, f"Chromium at {path} is not an executable file (needed by {who}): {hint}")
    try:
        done = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check(requirement, f"Chromium at {path} does not start ({_first_line(str(exc))}): {hint}")
    if done.returncode != 0:
        reason = _first_line(done.stderr or done.stdout) or "no output"
        return Check(requirement, f"Chromium at {path} does not run ({reason}; exit {done.returncode}): {hint}")
    return Check(f"{requirement}: {_first_line(done.stdout)}")


def check_module(module: str, purpose: str) -> Check:
    """A Python package the cycle imports only when it reaches a channel (so its absence would show late)."""
    if importlib.util.find_spec(module) is None:
        return Check(
            f"Python package {module} ({purpose})",
            f"Python package {module} is missing ({purpose}): reinstall the project (make install)",
        )
    return Check(f"Python package {module} ({purpose})")


def check_oscar_store(cfg: AgentFlowConfig) -> Check:
    """The Oscar registry (``stress.sim_to_real.oscar_env_config_dir``) serves the run's process, and the
    machine its store follows (``kwargs.store.machine``) exists."""
    from tasks.oscar_site import site_entry_of

    directory = cfg.stress.sim_to_real.oscar_env_config_dir
    requirement = f"the Oscar store of {directory} serves process {cfg.process}"
    try:
        entry = site_entry_of(Path(directory))
    except AgentFlowError as exc:
        return Check(requirement, f"stress.sim_to_real.oscar_env_config_dir: {exc}")
    if entry.process != cfg.process:
        return Check(
            requirement,
            f"{entry.source_file} serves process {entry.process!r}, the run is {cfg.process!r}: point "
            "stress.sim_to_real.oscar_env_config_dir at the process's Oscar registry (checkout_v2: "
            "configs/checkout_v2/oscar)",
        )
    machine = (entry.kwargs.get("store") or {}).get("machine")
    if machine and not Path(str(machine)).is_file():
        return Check(requirement, f"{entry.source_file}: kwargs.store.machine {machine} is not a file")
    return Check(requirement)


def check_embedded_postgres(users: list[str]) -> Check:
    """The PostgreSQL binaries that ``pgserver`` runs are present and executable (nothing is started)."""
    who = ", ".join(users)
    requirement = f"PostgreSQL binaries of pgserver (url: pgserver in {who})"
    spec = importlib.util.find_spec(EMBEDDED_POSTGRES)
    if spec is None or spec.origin is None:
        return Check(
            requirement, f"Python package pgserver is missing (url: pgserver in {who}): reinstall (make install)"
        )
    bin_dir = Path(spec.origin).parent / "pginstall" / "bin"
    unusable = [name for name in POSTGRES_BINARIES if not os.access(bin_dir / name, os.X_OK)]
    if unusable:
        return Check(
            requirement,
            f"pgserver's PostgreSQL binaries {', '.join(unusable)} are missing or not executable in {bin_dir} "
            f"(url: pgserver in {who}): reinstall pgserver (pip install --force-reinstall -c constraints.txt pgserver)",
        )
    return Check(f"{requirement}: {bin_dir}")


def check_listening(address: str, users: list[str]) -> Check:
    """Something accepts TCP connections at ``address`` (a configured service the cycle talks to)."""
    parsed = urlparse(address)
    scheme = parsed.scheme.split("+")[0]
    who = ", ".join(users)
    requirement = f"service at {address} (for {who})"
    try:
        port = parsed.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        port = None
    if not parsed.hostname or port is None:
        return Check(requirement, f"{who}: {address!r} names no host and port")
    try:
        socket.create_connection((parsed.hostname, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as exc:
        return Check(
            requirement,
            f"nothing answers at {parsed.hostname}:{port} ({who}: {address}; {_first_line(str(exc))}): "
            "start that service or change the setting",
        )
    return Check(requirement)


def check_port_free(port: int, users: list[str]) -> Check:
    """A fixed loopback port the cycle will bind is free now."""
    who = ", ".join(users)
    requirement = f"loopback port {port} free (for {who})"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            return Check(
                requirement,
                f"port 127.0.0.1:{port} is taken ({_first_line(str(exc))}; needed by {who}): "
                "stop what holds it or set port: 0",
            )
    return Check(requirement)


def check_writable(folder: Path, key: str) -> Check:
    """``folder`` (or, where it does not exist yet, the nearest existing folder above it) takes a new file."""
    requirement = f"{key} {folder} writable"
    existing = folder.resolve()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return Check(requirement, f"{key}: {existing} is not a folder: point {key} at a folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return Check(requirement, f"{key}: cannot write in {existing} ({_first_line(str(exc))}): fix its permissions")
    return Check(requirement)


def _cycle_entries(cfg: AgentFlowConfig) -> Iterator[EnvEntry]:
    """The registry entries the configured cycle makes envs from: the training catalogue's and the real ones."""
    registry = load_registry(cfg)
    base: list[EnvEntry] = []
    for env_id in cfg.variants.base_envs:
        try:
            base.append(registry.get(env_id))
        except AgentFlowError:
            continue  # an unknown base env is the configuration check's to report
    yield from base
    real = cfg.stress.sim_to_real
    if "stress" not in cfg.phases or not real.enabled:
        return
    from tasks.process_io import load_process
    from tasks.real_channels import sim_to_real_families

    if real.oscar_episodes > 0:  # the Oscar store's browser (its registry is checked by check_oscar_store)
        from tasks.oscar_site import site_entry_of

        with suppress(AgentFlowError):
            oscar = site_entry_of(Path(real.oscar_env_config_dir))
            yield _with_kwargs(oscar, f"{oscar.env_id} (stress sim-to-real on Oscar)")
    process = load_process(cfg)
    declared = {r.family: r for r in process.real_channels}
    families = {e.family: e for e in base}
    for family in sim_to_real_families(cfg, process):
        if family not in families:
            continue  # the stress sample holds no variant of it: its real channel is never opened
        if family in declared:
            spec = declared[family]
            entry = registry.get(spec.env) if spec.env is not None and spec.env in registry else families[family]
            yield _with_kwargs(entry, f"{entry.env_id} (stress sim-to-real)", **dict(spec.kwargs))
        elif family == "web_checkout":
            entry = load_registry(config_dir=Path(real.env_config_dir)).get(REAL_BROWSER_ENV)
            yield _with_kwargs(entry, f"{entry.env_id} (stress sim-to-real)")
        elif family == "order_db":
            entry = families[family]
            yield _with_kwargs(entry, f"{entry.env_id} (stress sim-to-real)", url=EMBEDDED_POSTGRES)


def _with_kwargs(entry: EnvEntry, env_id: str, **kwargs: object) -> EnvEntry:
    return dataclasses.replace(entry, env_id=env_id, kwargs={**entry.kwargs, **kwargs})


def _is_browser(entry: EnvEntry) -> bool:
    return entry.class_path.split(":")[0] == BROWSER_MODULE or "chromium_path" in entry.kwargs


def _chromium_path(entry: EnvEntry) -> str:
    return str(entry.kwargs.get("chromium_path", DEFAULT_CHROMIUM))


def _fixed_port(entry: EnvEntry) -> int | None:
    port = entry.kwargs.get("port")
    return port if isinstance(port, int) and not isinstance(port, bool) and port > 0 else None


def _users(
    entries: Iterable[EnvEntry], needs: Callable[[EnvEntry], bool], key: Callable[[EnvEntry], object]
) -> dict[str, list[str]]:
    """``key(entry)`` -> the env ids that need it, for the entries where ``needs(entry)``."""
    found: dict[str, list[str]] = {}
    for entry in entries:
        if needs(entry):
            found.setdefault(str(key(entry)), []).append(entry.env_id)
    return found


def _service_addresses(cfg: AgentFlowConfig, entries: list[EnvEntry]) -> dict[str, list[str]]:
    """Network addresses of services the configuration points at (file and embedded stores excluded)."""
    named: list[tuple[str | None, str]] = [
        (os.environ.get("PREFECT_API_URL") or cfg.base.tracking.prefect_api_url, "Prefect API"),
        (os.environ.get("MLFLOW_TRACKING_URI") or cfg.base.tracking.mlflow_uri, "MLflow tracking"),
    ]
    if cfg.train.reward.mode == "model":
        named.append((cfg.train.reward.model_url, "train.reward.model_url"))
    for entry in entries:
        named += [(entry.kwargs.get(key), f"{entry.env_id} {key}") for key in URL_KWARGS]
    found: dict[str, list[str]] = {}
    for address, who in named:
        if isinstance(address, str) and urlparse(address).scheme.split("+")[0] in DEFAULT_PORTS:
            found.setdefault(address, []).append(who)
    return found


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:200] if lines else ""
