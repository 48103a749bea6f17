"""``agentflow process``: start a new business process from a working scaffold."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from tasks.machine_forms import FormsError, machine_configs, write_forms
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


@process_app.command("forms")
def forms_command(
    name: str = typer.Argument(..., help="A process with a state-machine simulator channel."),
    env_dir: Path = typer.Option(None, "--env-dir", help="Its env configs (default configs/NAME/envs)."),
) -> None:
    """Write the machine's web-form, SQL-rows and HTTP-service channels beside its simulator channel."""
    folder = env_dir or Path("configs") / name / "envs"
    configs = machine_configs(folder, name) if folder.is_dir() else []
    if not configs:
        err_console.print(f"[bold red]error[/]: no state-machine env config of process {escape(name)} in {folder}")
        raise typer.Exit(code=2)
    try:
        written = [path for config in configs for path in write_forms(config)]
    except FormsError as exc:
        err_console.print(f"[bold red]error[/]: {escape(str(exc))}")
        raise typer.Exit(code=2) from None
    for path in written:
        console.print(f"  wrote {escape(str(path))}")
    console.print("next: add each to the process's channels and to variants.base_envs:")
    for path in written[::2]:
        env_id = path.stem
        family = env_id.rsplit("_v", 1)[0]
        console.print(f"  {escape(family)}: {{env: {escape(env_id)}, mapping: {escape(env_id)}.json}}", soft_wrap=True)
