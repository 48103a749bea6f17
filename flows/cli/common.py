"""What every CLI command shares: the params option, the configuration-error exit (code 2), phase progress bars."""

from __future__ import annotations

import errno
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import ConfigError, MappingError, RegistryError
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.determinism import make_deterministic
from tasks.preflight import Check, preflight
from tasks.process_io import check_config, load_process

err_console = Console(stderr=True, soft_wrap=True)
PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")


def one_line(exc: BaseException) -> str:
    """An error message as one line of plain text: user text is escaped, never read as rich markup."""
    return escape(" ".join(str(exc).splitlines()))


def os_error_line(exc: OSError) -> str:
    """An OS error as one escaped line naming the path(s), the errno's name and the system's reason."""
    code = errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno is not None else type(exc).__name__
    paths = " -> ".join(str(p) for p in (exc.filename, exc.filename2) if p is not None) or "<no path>"
    return escape(" ".join(f"{paths}: {code} ({exc.strerror or exc})".splitlines()))


def config_or_exit(params: Path) -> AgentFlowConfig:
    """Load params.yaml, or exit 2 with one message naming the file, key, value and expectation."""
    try:
        cfg = load_config(params)
        load_process(cfg)  # the selected process and its channels' mappings, checked before anything runs
        check_config(cfg, str(params))  # and what later phases would refuse: dimensions, env configs, channels
        return cfg
    except (ConfigError, MappingError, RegistryError) as exc:
        err_console.print(f"[bold red]configuration error[/]: {one_line(exc)}")
        raise typer.Exit(code=2) from None


def requirements_or_exit(cfg: AgentFlowConfig) -> list[Check]:
    """The cycle's external requirements (:mod:`tasks.preflight`); any unmet: one line each on stderr, exit 2."""
    checks = preflight(cfg)
    exit_on_unmet(checks)
    return checks


def exit_on_unmet(checks: list[Check]) -> None:
    """Print each unmet requirement as one line on stderr and exit 2; nothing when all are met."""
    failed = [c.problem for c in checks if c.problem is not None]
    for problem in failed:
        err_console.print(f"[bold red]missing requirement[/]: {escape(problem)}")
    if failed:
        raise typer.Exit(code=2)


def phase_config_or_exit(params: Path) -> AgentFlowConfig:
    """:func:`config_or_exit` for a command that runs a phase: also makes the process deterministic."""
    cfg = config_or_exit(params)
    make_deterministic(cfg.base.seed)
    return cfg


def phase_context_or_exit(params: Path) -> PhaseContext:
    """The phase context of a command that runs a phase, built once (:func:`phase_config_or_exit` first)."""
    return PhaseContext.of(phase_config_or_exit(params))


def phase_progress(phase: str, console: Console) -> Progress:
    """A progress bar for a long phase: name, bar, done/total, a ``status`` field, elapsed and remaining time."""
    return Progress(
        TextColumn(f"[bold]{phase}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
