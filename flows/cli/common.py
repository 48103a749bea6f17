"""What every CLI command shares: the params option, the configuration-error exit (code 2), phase progress bars."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from agentflow_core.config import AgentFlowConfig
from agentflow_core.errors import ConfigError, MappingError
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.determinism import make_deterministic
from tasks.process_io import load_process

err_console = Console(stderr=True, soft_wrap=True)
PARAMS_OPTION = typer.Option(Path("params.yaml"), "--params", "-p", help="The run configuration (params.yaml).")


def one_line(exc: BaseException) -> str:
    """An error message as one line of plain text: user text is escaped, never read as rich markup."""
    return escape(" ".join(str(exc).splitlines()))


def config_or_exit(params: Path) -> AgentFlowConfig:
    """Load params.yaml, or exit 2 with one message naming the file, key, value and expectation."""
    try:
        cfg = load_config(params)
        load_process(cfg)  # the selected process and its channels' mappings, checked before anything runs
        return cfg
    except (ConfigError, MappingError) as exc:
        err_console.print(f"[bold red]configuration error[/]: {one_line(exc)}")
        raise typer.Exit(code=2) from None


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
