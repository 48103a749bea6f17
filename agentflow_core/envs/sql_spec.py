"""The SQL channel's document, checked: tables, seed rows, statements per action, faults, outcomes, terminals.

:mod:`agentflow_core.envs.sql_channel` describes the document and runs it; this module reads it into
frozen records (every error a ConfigError naming the source and key) and prepares every statement on
an empty SQLite copy of the schema, so a typo fails when the registry loads the env config.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentflow_core.envs.machine_spec import MAX_ENTRIES, OUTCOME_KINDS, STEP_NAME, Names, Reward, SpecReader
from agentflow_core.envs.sql_driver import SQLITE
from agentflow_core.errors import ConfigError
from agentflow_core.safe_expr import Condition

RESERVED = "last"
MAX_SQL = 4000
TOP_KEYS = (
    "description",
    "url",
    "schema",
    "params",
    "seed",
    "before",
    "observe",
    "actions",
    "faults",
    "terminals",
    "reward",
    "audit",
)
ACTION_KEYS = ("when", "reason", "cost", "faults", "statements", "outcomes", "retry", "description")
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class SQLFault:
    """A fault: where ``when`` (an expression over the scenario) holds and a draw falls under ``p``, the action is
    lost; its ``statements`` record it (an error row), ``applied`` says whether the step still counts as applied."""

    when: Condition | None
    p: Condition | None
    statements: tuple[str, ...]
    reason: str | None
    applied: bool


@dataclass(frozen=True)
class SQLOutcome:
    """One branch of an action: fires where its query returns a row and a draw falls under ``p``.

    ``applied: false``: the action took no effect (the step reward is still paid); ``applicable: false``:
    the action turned out not applicable (no cost, the inapplicable reward, nothing written).
    """

    when: str | None
    p: Condition | None
    statements: tuple[str, ...]
    reason: str | None
    applied: bool
    applicable: bool


@dataclass(frozen=True)
class SQLAction:
    """One native action: its applicability query, cost, statements, outcomes and whether faults hit it.

    A ``retry`` action re-runs the action a fault lost on the step before (after its own statements).
    """

    name: str
    when: str | None
    reason: str
    cost: Condition | None
    faults: bool
    statements: tuple[str, ...]
    outcomes: tuple[SQLOutcome, ...] = ()
    retry: bool = False


@dataclass(frozen=True)
class SQLTerminal:
    """An ending: where the query returns a row the episode ends as ``outcome``, worth ``value``."""

    when: str
    outcome: str
    value: Condition | None


@dataclass(frozen=True)
class SQLSpec:
    """A checked SQL channel document."""

    url: str
    schema: tuple[str, ...]
    params: tuple[tuple[str, Condition], ...]
    seed: tuple[str, ...]
    before: tuple[str, ...]
    observe: tuple[tuple[str, str], ...]
    actions: Mapping[str, SQLAction]
    faults: tuple[SQLFault, ...]
    terminals: tuple[SQLTerminal, ...]
    reward: Reward


def _statement(reader: SpecReader, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SQL:
        raise reader.fail(key, value, f"an SQL statement of at most {MAX_SQL} characters")
    return value


def _statements(reader: SpecReader, key: str, value: Any) -> tuple[str, ...]:
    return tuple(_statement(reader, f"{key}.{i}", s) for i, s in enumerate(reader.items(key, value)))


def _flag(reader: SpecReader, key: str, value: Any, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise reader.fail(key, value, "true or false")
    return value


def _outcomes(reader: SpecReader, key: str, value: Any) -> tuple[SQLOutcome, ...]:
    out = []
    for i, entry in enumerate(reader.items(key, value)):
        where = f"{key}.{i}"
        item = reader.mapping(where, entry, ("when", "p", "statements", "reason", "applied", "applicable"))
        when = item.get("when")
        applicable = _flag(reader, f"{where}.applicable", item.get("applicable"), True)
        statements = _statements(reader, f"{where}.statements", item.get("statements"))
        if not applicable and statements:
            raise reader.fail(f"{where}.statements", statements, "none on an outcome with applicable: false")
        out.append(
            SQLOutcome(
                None if when is None else _statement(reader, f"{where}.when", when),
                reader.optional_expr(f"{where}.p", item.get("p")),
                statements,
                reader.reason(f"{where}.reason", item.get("reason")),
                _flag(reader, f"{where}.applied", item.get("applied"), True) and applicable,
                applicable,
            )
        )
    return tuple(out)


def _faults(reader: SpecReader, value: Any) -> tuple[SQLFault, ...]:
    out = []
    for i, entry in enumerate(reader.items("faults", value)):
        item = reader.mapping(f"faults.{i}", entry, ("when", "p", "statements", "reason", "applied"))
        out.append(
            SQLFault(
                reader.optional_expr(f"faults.{i}.when", item.get("when")),
                reader.optional_expr(f"faults.{i}.p", item.get("p")),
                _statements(reader, f"faults.{i}.statements", item.get("statements")),
                reader.reason(f"faults.{i}.reason", item.get("reason")),
                _flag(reader, f"faults.{i}.applied", item.get("applied"), True),
            )
        )
    return tuple(out)


def _actions(reader: SpecReader, value: Any) -> dict[str, SQLAction]:
    if not isinstance(value, Mapping) or not value:
        raise reader.fail("actions", value, "a mapping of action name -> {when, statements, ...}")
    out = {}
    for name, entry in value.items():
        key = f"actions.{reader.action_name('actions', name)}"
        item = reader.mapping(key, entry or {}, ACTION_KEYS)
        when = item.get("when")
        retry = _flag(reader, f"{key}.retry", item.get("retry"), False)
        if retry and any(k in item for k in ("when", "cost", "faults", "outcomes")):
            raise reader.fail(key, dict(item), "a retry action with only statements, reason and description")
        out[name] = SQLAction(
            name,
            None if when is None else _statement(reader, f"{key}.when", when),
            reader.reason(f"{key}.reason", item.get("reason"), "not_applicable") or "not_applicable",
            reader.optional_expr(f"{key}.cost", item.get("cost")),
            _flag(reader, f"{key}.faults", item.get("faults"), True),
            _statements(reader, f"{key}.statements", item.get("statements")),
            _outcomes(reader, f"{key}.outcomes", item.get("outcomes")),
            retry,
        )
    return out


def _terminals(reader: SpecReader, value: Any) -> tuple[SQLTerminal, ...]:
    out = []
    for i, entry in enumerate(reader.items("terminals", value)):
        item = reader.mapping(f"terminals.{i}", entry, ("when", "outcome", "value"), ("when", "outcome"))
        if item["outcome"] not in OUTCOME_KINDS:
            raise reader.fail(f"terminals.{i}.outcome", item["outcome"], f"one of {list(OUTCOME_KINDS)}")
        value_expr = reader.optional_expr(f"terminals.{i}.value", item.get("value"))
        out.append(SQLTerminal(_statement(reader, f"terminals.{i}.when", item["when"]), item["outcome"], value_expr))
    if not out:
        raise reader.fail("terminals", value, "at least one terminal query")
    return tuple(out)


def _named(reader: SpecReader, key: str, value: Any) -> dict[str, Any]:
    """A mapping whose keys are the author's names (checked by the caller)."""
    if not isinstance(value, Mapping) or len(value) > MAX_ENTRIES:
        raise reader.fail(key, value, f"a mapping of at most {MAX_ENTRIES} names")
    return dict(value)


def parse_sql_spec(document: Any, fields: Mapping[str, Any], source: str = "<sql>") -> SQLSpec:
    """Check a SQL channel document for a scenario with ``fields`` (name -> a value of its type)."""
    first = SpecReader(source, Names.of_scenario(fields))
    top = first.mapping("", document, TOP_KEYS, ("schema", "observe", "actions", "terminals"))
    url = top.get("url", SQLITE)
    if not isinstance(url, str) or not url:
        raise first.fail("url", url, "sqlite, pgserver or a SQLAlchemy URL")
    params = []
    for name, expr in _named(first, "params", top.get("params") or {}).items():
        if not isinstance(name, str) or not _NAME.match(name) or name in fields or name == STEP_NAME:
            raise first.fail(f"params.{name}", expr, "a new lowercase name (not a scenario field nor 'step')")
        params.append((name, first.expr(f"params.{name}", expr)))
    reader = SpecReader(source, Names.of_scenario(fields, [n for n, _ in params]))
    observe = _named(reader, "observe", top["observe"])
    for name in observe:
        if not isinstance(name, str) or not _NAME.match(name) or name == RESERVED:
            raise reader.fail(f"observe.{name}", observe[name], f"a lowercase name other than {RESERVED!r}")
    return SQLSpec(
        url=url,
        schema=_statements(reader, "schema", top["schema"]),
        params=tuple(params),
        seed=_statements(reader, "seed", top.get("seed")),
        before=_statements(reader, "before", top.get("before")),
        observe=tuple((name, _statement(reader, f"observe.{name}", q)) for name, q in observe.items()),
        actions=_actions(reader, top["actions"]),
        faults=_faults(reader, top.get("faults")),
        terminals=_terminals(reader, top["terminals"]),
        reward=reader.reward(top.get("reward")),
    )


def bindings(spec: SQLSpec, fields: Mapping[str, Any]) -> dict[str, Any]:
    """What a statement binds by name: the scenario fields, the ``params`` computed from them, ``step`` (0)."""
    values: dict[str, Any] = dict(fields)
    for name, expr in spec.params:
        values[name] = expr.value(values)
    values[STEP_NAME] = 0
    return values


def _labelled(spec: SQLSpec) -> list[tuple[str, str]]:
    """Every statement and query after the schema, with the key it was written under."""
    named = [(f"seed.{i}", s) for i, s in enumerate(spec.seed)]
    named += [(f"before.{i}", s) for i, s in enumerate(spec.before)]
    named += [(f"observe.{n}", q) for n, q in spec.observe]
    named += [(f"faults.{i}.statements.{j}", s) for i, f in enumerate(spec.faults) for j, s in enumerate(f.statements)]
    for action in spec.actions.values():
        key = f"actions.{action.name}"
        named += [(f"{key}.when", action.when)] if action.when else []
        named += [(f"{key}.statements.{i}", s) for i, s in enumerate(action.statements)]
        for i, outcome in enumerate(action.outcomes):
            named += [(f"{key}.outcomes.{i}.when", outcome.when)] if outcome.when else []
            named += [(f"{key}.outcomes.{i}.statements.{j}", s) for j, s in enumerate(outcome.statements)]
    named += [(f"terminals.{i}.when", t.when) for i, t in enumerate(spec.terminals)]
    return named


def check_statements(spec: SQLSpec, fields: Mapping[str, Any], source: str) -> None:
    """Prepare every statement on an empty SQLite copy of the schema: a typo fails at load, not in a worker."""
    conn = sqlite3.connect(":memory:")
    values = bindings(spec, fields)
    where = "schema"
    try:
        for i, statement in enumerate(spec.schema):
            where = f"schema.{i}"
            conn.execute(statement)
        for label, statement in _labelled(spec):
            where = label
            conn.execute(f"EXPLAIN {statement}", values)
    except sqlite3.Error as exc:
        raise ConfigError(source, where, None, f"a statement SQLite accepts ({exc})") from None
    finally:
        conn.close()
