"""``agentflow envs``: list the registered envs, check them, and generate one from an OpenAPI spec.

Edge code: this module parses YAML (injected into the core registry), reads ``DEBUG_ADAPTER``
and writes files. ``DEBUG_ADAPTER=1`` logs every adapter decision (rule fired, tokens emitted)
on the ``agentflow.adapter`` logger.
"""

from __future__ import annotations

import json
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import typer
import yaml
from gymnasium.utils.env_checker import check_env
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agentflow_core.adapters.audit import AuditFinding, audit_entry, audit_mapping
from agentflow_core.atomic import write_text
from agentflow_core.errors import AgentFlowError, RegistryError, RequirementError
from agentflow_core.registry import (
    EnvEntry,
    EnvRegistry,
    config_files,
    entry_from_config,
    is_mapping_document,
    read_config,
)
from flows.cli.common import one_line
from tasks.process_io import known_vocabularies
from tasks.registry_io import configure_adapter_debug, load_registry, yaml_load
from tasks.yaml_io import YamlLimitError, load_yaml_file

envs_app = typer.Typer(
    help="Env registry: list, check, generate from OpenAPI.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

CONFIG_DIR_OPTION = typer.Option(Path("configs/envs"), "--config-dir", "-c", help="Directory of env configs (*.yaml).")


def open_registry(config_dir: Path) -> EnvRegistry:
    """The env registry of a config directory, with the YAML parser injected."""
    return load_registry(config_dir=config_dir)


@envs_app.callback()
def _envs_root() -> None:
    """Env registry commands (set DEBUG_ADAPTER=1 to log adapter decisions)."""
    configure_adapter_debug()


def _registry_or_exit(config_dir: Path) -> EnvRegistry:
    """The registry, or exit 2 (a configuration error) with one line naming the file."""
    try:
        return open_registry(config_dir)
    except AgentFlowError as exc:
        err_console.print(f"[bold red]registry error[/]: {one_line(exc)}")
        raise typer.Exit(code=2) from None


@envs_app.command("list")
def list_envs(config_dir: Path = CONFIG_DIR_OPTION) -> None:
    """Show every registered base env."""
    registry = _registry_or_exit(config_dir)
    table = Table(title=escape(f"envs in {config_dir}"))
    for column in ("env_id", "family", "version", "adapter", "mapping", "class"):
        table.add_column(column)
    for e in registry.entries():
        cells = (e.env_id, e.family, str(e.version), e.adapter, _short_path(e.mapping_path), e.class_path)
        table.add_row(*map(escape, cells))
    console.print(table)


def _short_path(path: str) -> str:
    try:
        return str(Path(path).relative_to(Path.cwd()))
    except ValueError:
        return path


@dataclass
class EnvCheck:
    """The outcome of checking one env config file."""

    source: str
    env_id: str
    loaded: bool = True
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    findings: list[AuditFinding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No load or check errors and no error-level audit finding (warnings do not fail a check)."""
        return not self.errors and not any(f.severity == "error" for f in self.findings)


def check_entry(entry: EnvEntry, raw_states: list[tuple[Any, str]] | None = None) -> EnvCheck:
    """gymnasium's check_env on a made env plus the mapping audit (against ``raw_states`` when given, else
    the family module's ``RAW_STATES``)."""
    result = EnvCheck(entry.source_file, entry.env_id)
    try:
        env = entry.make()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env, skip_render_check=True)
        result.warnings.extend(str(w.message) for w in caught)
        env.close()
    except Exception as exc:  # report every failure of every env, not just the first
        hint = f" (info keys differing for one seed: {nondeterministic_info_keys(entry)})" if "info" in str(exc) else ""
        result.errors.append(f"check_env: {type(exc).__name__}: {exc}{hint}")
    try:
        if raw_states is None:
            result.findings = audit_entry(entry)
        else:
            result.findings = audit_mapping(entry.build_adapter(), raw_states, entry.mapping_path)
    except AgentFlowError as exc:
        result.errors.append(f"audit: {exc}")
    return result


def nondeterministic_info_keys(entry: EnvEntry, seed: int = 123) -> list[str]:
    """Info keys that differ between two envs reset with the same seed and given the same action."""
    infos = []
    for _ in range(2):
        env = entry.make()
        env.reset(seed=seed)
        infos.append(env.step(0)[4])
        env.close()
    first, second = infos
    return sorted(k for k in set(first) | set(second) if repr(first.get(k)) != repr(second.get(k)))


def check_config_dir(config_dir: Path) -> list[EnvCheck]:
    """Check each config file on its own, so one bad file does not hide the others."""
    if not Path(config_dir).is_dir():  # as `envs list` says it (exit 2), not a FileNotFoundError traceback
        raise RegistryError(str(config_dir), "config directory does not exist")
    results: list[EnvCheck] = []
    seen: dict[str, str] = {}
    for path in config_files(config_dir):
        document: Any = None
        try:
            document = read_config(path, yaml_load)
            if path.suffix == ".json" and is_mapping_document(document):
                continue
            entry = entry_from_config(document, path, yaml_load, known_vocabularies(config_dir))
        except AgentFlowError as exc:
            env_id = document.get("env_id", path.stem) if isinstance(document, dict) else path.stem
            results.append(EnvCheck(str(path), str(env_id), loaded=False, errors=[str(exc)]))
            continue
        result = check_site_entry(entry, config_dir) if "site_spec" in entry.kwargs else check_entry(entry)
        if entry.env_id in seen:
            result.errors.append(f"env_id {entry.env_id!r} is already declared in {seen[entry.env_id]}")
        seen.setdefault(entry.env_id, str(path))
        results.append(result)
    return results


def check_site_entry(entry: EnvEntry, config_dir: Path) -> EnvCheck:
    """A site channel's entry on a live site (``kwargs.base_url``, else the project's Oscar store started here),
    audited against the site's recorded pages; what the machine lacks for it raises one line (exit 2)."""
    from tasks.oscar_site import live_site, site_needs, site_raw_states

    need = site_needs(entry)
    if need is not None:
        raise RequirementError([need])
    raw_states = site_raw_states(entry, config_dir)
    try:
        with live_site(entry, config_dir) as bound:
            return check_entry(bound, raw_states)
    except RequirementError:
        raise
    except AgentFlowError as exc:  # the store did not start: say so, as for a missing binary
        raise RequirementError([f"{entry.env_id}: the site did not start: {one_line(exc)}"]) from None


INFO_OPTION = typer.Option(False, "--info", help="Also list info findings (tokens a channel never emits).")


@envs_app.command("check")
def check(config_dir: Path = CONFIG_DIR_OPTION, show_info: bool = INFO_OPTION) -> None:
    """check_env + mapping audit for every registered env; exit 1 on any error."""
    results = check_config_dir(config_dir)
    table = Table(title=escape(f"env check: {config_dir}"))
    for column in ("env_id", "config", "check_env", "audit errors", "audit info", "status"):
        table.add_column(column)
    for r in results:
        n_err = sum(f.severity == "error" for f in r.findings)
        env_check = "config error" if not r.loaded else "fail" if r.errors else f"ok ({len(r.warnings)} warnings)"
        table.add_row(
            escape(r.env_id),
            escape(_short_path(r.source)),
            env_check,
            str(n_err),
            str(len(r.findings) - n_err),
            "[green]ok[/]" if r.ok else "[bold red]FAIL[/]",
        )
    console.print(table)
    for r in results:
        for message in r.errors:
            console.print(f"[bold red]error[/] {escape(r.env_id)}: {escape(message)}")
        for message in r.warnings:
            console.print(f"[yellow]warning[/] {escape(r.env_id)}: {escape(message)}")
        for finding in r.findings:
            if finding.severity == "error" or show_info:
                style = "bold red" if finding.severity == "error" else "dim"
                console.print(
                    f"[{style}]{finding.severity}[/] {escape(r.env_id)}: {finding.kind}: rule(s) "
                    f"{escape(str(finding.rule))}: {escape(finding.detail)}",
                    markup=True,
                    highlight=False,
                )
    if not results:
        err_console.print(f"[bold red]no env configs in {escape(str(config_dir))}[/]")
        raise typer.Exit(code=1)
    if not all(r.ok for r in results):
        raise typer.Exit(code=1)
    console.print(f"[green]{len(results)} env(s) ok[/]")


def write_generated_env(
    env_config: dict[str, Any], mapping: dict[str, Any], out_dir: Path, force: bool = False
) -> tuple[Path, Path]:
    """Validate a generated env config + mapping as a registry entry, then write both atomically."""
    env_id = str(env_config.get("env_id", ""))
    if not env_id:
        raise typer.BadParameter("the generated env config has no env_id")
    mapping_name = Path(
        str(env_config.get("mapping") or f"{mapping.get('family')}_v{mapping.get('version')}.json")
    ).name
    config = {**env_config, "mapping": mapping_name}
    config_path, mapping_path = out_dir / f"{env_id}.yaml", out_dir / mapping_name
    existing = [p for p in (config_path, mapping_path) if p.exists()]
    if existing and not force:
        raise FileExistsError(f"refusing to overwrite {', '.join(map(str, existing))} (use --force)")
    config_text = yaml.safe_dump(config, sort_keys=False)
    mapping_text = json.dumps(mapping, indent=2) + "\n"
    with tempfile.TemporaryDirectory() as staging:  # validate exactly what will be written
        (Path(staging) / mapping_name).write_text(mapping_text)
        (Path(staging) / config_path.name).write_text(config_text)
        entry_from_config(yaml_load(config_text), Path(staging) / config_path.name, yaml_load, known_vocabularies())
    for path in config_files(out_dir) if out_dir.is_dir() else []:
        if path != config_path:
            other = read_config(path, yaml_load)
            if isinstance(other, dict) and not is_mapping_document(other) and other.get("env_id") == env_id:
                raise FileExistsError(f"env_id {env_id!r} is already declared in {path}")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(mapping_path, mapping_text)
    write_text(config_path, config_text)
    return config_path, mapping_path


SPEC_ARGUMENT = typer.Argument(..., exists=True, dir_okay=False, help="OpenAPI 3 spec (YAML or JSON).")
FAMILY_OPTION = typer.Option(..., "--family", help="Family name of the new env (lower_snake_case).")
OUT_DIR_OPTION = typer.Option(Path("configs/envs"), "--out-dir", help="Where to write the env YAML and mapping JSON.")
FORCE_OPTION = typer.Option(False, "--force", help="Overwrite existing files.")
PROCESS_OPTION = typer.Option("checkout", "--process", help="Business process the mapping speaks (configs/processes).")
ENV_CLASS_OPTION = typer.Option(
    None,
    "--env-class",
    help="Installed env (entry point of group agentflow.envs) that drives the API; default: the demo API env for "
    "checkout, the generic HTTP channel (configured by the spec's x-agentflow-channel) for any other process.",
)
BASE_URL_OPTION = typer.Option(None, "--base-url", help="URL of the running service (written to the env's kwargs).")


def env_class_path(name: str | None, process: str = "checkout") -> str:
    """The class path of an installed env entry point (the CLI user chooses code; a spec never does)."""
    from importlib.metadata import entry_points

    from agentflow_core.adapters.openapi import DEFAULT_CLASS_PATH, HTTP_CHANNEL_CLASS_PATH

    if name is None:
        return DEFAULT_CLASS_PATH if process == "checkout" else HTTP_CHANNEL_CLASS_PATH
    found = {ep.name: ep.value.replace(" ", "") for ep in entry_points(group="agentflow.envs")}
    if name not in found:
        raise typer.BadParameter(
            f"--env-class: {name!r} is not an installed agentflow.envs entry point: {sorted(found)}"
        )
    return found[name]


@envs_app.command("from-openapi")
def from_openapi(
    spec: Path = SPEC_ARGUMENT,
    family: str = FAMILY_OPTION,
    out_dir: Path = OUT_DIR_OPTION,
    force: bool = FORCE_OPTION,
    process: str = PROCESS_OPTION,
    env_class: str | None = ENV_CLASS_OPTION,
    base_url: str | None = BASE_URL_OPTION,
) -> None:
    """Generate an API env config + mapping from an OpenAPI spec and add it to the registry."""
    from agentflow_core.adapters.openapi import generate_from_openapi

    vocabularies = known_vocabularies()
    if process not in vocabularies:
        err_console.print(f"[bold red]error[/]: --process: {escape(process)!r} is not one of {sorted(vocabularies)}")
        raise typer.Exit(code=2)
    class_path = env_class_path(env_class, process)

    try:
        document = load_yaml_file(spec)
    except (YamlLimitError, OSError) as exc:
        err_console.print(f"[bold red]OpenAPI spec error[/]: {escape(str(spec))}: {one_line(exc)}")
        raise typer.Exit(code=2) from None
    if not isinstance(document, dict):
        err_console.print(f"[bold red]OpenAPI spec error[/]: {escape(str(spec))}: <root>: expected a mapping")
        raise typer.Exit(code=2) from None
    try:
        env_config, mapping = generate_from_openapi(
            document,
            family,
            process=process,
            vocabulary=vocabularies[process],
            class_path=class_path,
            base_url=base_url,
        )
        config_path, mapping_path = write_generated_env(dict(env_config), dict(mapping), out_dir, force)
        entry = open_registry(out_dir).get(str(env_config["env_id"]))
    except AgentFlowError as exc:
        err_console.print(f"[bold red]error[/]: {escape(str(spec))}: {one_line(exc)}")
        raise typer.Exit(code=2) from None
    except (FileExistsError, ValueError) as exc:
        err_console.print(f"[bold red]error[/]: {one_line(exc)}")
        raise typer.Exit(code=1) from None
    console.print(f"wrote [bold]{escape(str(config_path))}[/] and [bold]{escape(str(mapping_path))}[/]")
    console.print(
        f"registered {entry.env_id} ({entry.family} v{entry.version}, {len(entry.mapping['token_rules'])} token rules)"
    )
