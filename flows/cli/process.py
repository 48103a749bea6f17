"""``agentflow process``: start a new business process from a working scaffold."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from tasks.process_scaffold import ScaffoldError, write_scaffold

process_app = typer.Typer(help="Start a new business process (docs/adding-a-process.md).", no_args_is_help=True)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


@process_app.command("new")
def new_command(
    name: str = typer.Argument(..., help="The process name: lowercase letters, digits and '_'."),
    forms: bool = typer.Option(
        False, "--forms", help="Also the machine as a web form, SQL rows and an HTTP service (three more channels)."
    ),
) -> None:
    """Write a working process scaffold: the process file, two channels as data, their mappings, params-NAME.yaml."""
    try:
        scaffold = write_scaffold(name, Path(), forms=forms)
    except ScaffoldError as exc:
        err_console.print(f"[bold red]error[/]: {escape(str(exc))}")
        raise typer.Exit(code=2) from None
    for path in scaffold.files:
        console.print(f"  wrote {escape(str(path))}")
    console.print(f"[green]process {escape(name)} written[/]; next:")
    console.print(f"  agentflow validate --params params-{escape(name)}.yaml")
    console.print(f"  agentflow run --params params-{escape(name)}.yaml")
