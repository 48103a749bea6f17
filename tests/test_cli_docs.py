"""The CLI reference (docs/cli.md) names exactly the commands ``agentflow --help`` has.

The help side is the typer app's command tree walked programmatically (every leaf command, a
group's subcommands included); the docs side is the first column of docs/cli.md's table, where a
row may name several subcommands of one group (``agentflow bench train / pool / ppo``). A command
added without a row, or a row naming a command that is gone, fails here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.tiny import REPO

CLI_DOC = REPO / "docs" / "cli.md"
ROW = re.compile(r"^\|\s*`agentflow (?P<usage>[^`]+)`\s*\|", re.MULTILINE)


def help_tree(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every leaf command under ``command`` as its words after ``agentflow`` (groups are walked, not listed)."""
    subcommands = getattr(command, "commands", None)
    if subcommands is None:
        yield path
        return
    for name, sub in subcommands.items():
        if not getattr(sub, "hidden", False):
            yield from help_tree(sub, (*path, name))


def cli_commands() -> set[tuple[str, ...]]:
    """The commands ``agentflow --help`` lists, through its nested groups."""
    import typer.main

    from flows.cli.app import app

    return set(help_tree(typer.main.get_command(app)))


def documented_commands(text: str) -> set[tuple[str, ...]]:
    """The commands the table's first column names: the words before the first option or argument.

    ``envs list / check / from-openapi`` is the group ``envs`` with three subcommands; options
    (``[--repeat N]``, ``--pool NAME``) and arguments in capitals (``RUN_ID``) end the command words.
    """
    found: set[tuple[str, ...]] = set()
    for match in ROW.finditer(text):
        words: list[str] = []
        for token in match["usage"].split():
            if token.startswith(("[", "-", '"')) or token.isupper():
                break
            words.append(token)
        head, *alternatives = " ".join(words).split(" / ")
        first = tuple(head.split())
        found.add(first)
        found.update((*first[:-1], alt.strip()) for alt in alternatives)
    return found


def test_the_parser_reads_groups_options_and_arguments() -> None:
    table = "\n".join(
        [
            "| command | what it does |",
            "|---|---|",
            "| `agentflow run [--resume] [--set KEY=VALUE]…` | x |",
            "| `agentflow reproduce RUN_ID` | x |",
            "| `agentflow deploy --pool NAME [--cron …]` | x |",
            "| `agentflow envs list / check / from-openapi` | x |",
            "| `agentflow bench train / pool [--repeat N]` | x |",
        ]
    )
    assert documented_commands(table) == {
        ("run",),
        ("reproduce",),
        ("deploy",),
        ("envs", "list"),
        ("envs", "check"),
        ("envs", "from-openapi"),
        ("bench", "train"),
        ("bench", "pool"),
    }


def test_the_help_tree_walks_into_groups() -> None:
    commands = cli_commands()
    assert ("validate",) in commands and ("bench", "pool") in commands and ("envs", "list") in commands
    assert ("bench",) not in commands  # a group is not a command of its own


def test_docs_cli_names_exactly_the_commands_of_agentflow_help() -> None:
    documented, actual = documented_commands(CLI_DOC.read_text(encoding="utf-8")), cli_commands()
    undocumented = sorted(" ".join(c) for c in actual - documented)
    gone = sorted(" ".join(c) for c in documented - actual)
    assert not undocumented, f"commands missing from {CLI_DOC.relative_to(REPO)}: {undocumented}"
    assert not gone, f"{CLI_DOC.relative_to(REPO)} names commands agentflow --help does not have: {gone}"


def test_readme_sends_readers_to_the_cli_reference() -> None:
    assert "(docs/cli.md)" in Path(REPO / "README.md").read_text(encoding="utf-8")
