"""The generic SQL channel: a process's tables, seed rows, one statement (or a few) per action, all data.

Registered like any channel (``class_path: agentflow_core.envs.sql_channel:SQLChannelEnv``); the env
config's ``spec:`` names the document::

    url: sqlite                      # default: a private SQLite database in memory; pgserver; a SQLAlchemy URL
    schema:                          # run once per env
      - CREATE TABLE ticket (id INTEGER PRIMARY KEY, status TEXT NOT NULL)
    params: {urgent: 'priority == "high"'}   # optional: numbers computed from the scenario, bound by name
    seed:                            # run at every reset, inside the episode's transaction
      - INSERT INTO ticket VALUES (1, 'open')
    observe:                         # each query returns at most one row -> {name: {column: value}}
      ticket: SELECT status FROM ticket WHERE id = 1
    actions:
      CLOSE:
        when: SELECT 1 FROM ticket WHERE status = 'open'   # applicable where it returns a row
        reason: not_open             # failure reason when not applicable
        cost: "1"                    # business cost (an expression over the scenario)
        statements: ["UPDATE ticket SET status = 'closed' WHERE id = 1"]
        faults: true                 # default; false: the faults below never hit this action
    faults:                          # drawn before an applicable action's statements; the first that fires
      - {p: '0.05 * (network == "packet_loss_5%")', reason: timeout}   # loses the action (its cost is paid)
    terminals:                       # checked in order after every step
      - {when: "SELECT 1 FROM ticket WHERE status = 'closed'", outcome: goal, value: "100"}
    reward: {scale: 0.1}
    audit:                           # labelled raw states for the mapping audit: base rows, then each state's changes
      base: {ticket: {status: open}}
      states:
        - {token: OPEN, set: {}}
        - {token: CLOSED, set: {ticket: {status: closed}}}

Every statement binds the scenario fields and ``params`` by name (``:priority``) and ``step`` (the step
number); nothing from data is formatted into SQL. An action's statements run as one savepoint: one
that the database refuses (a CHECK, a foreign key) undoes the action, whose failure reason is then
``refused``. Expressions (``p``, ``cost``, ``value``, ``params``) are :mod:`agentflow_core.safe_expr`
over the scenario fields and ``params``. The raw observation is the ``observe`` rows plus ``last``
(``failure_reason``, ``applied``), read by the ``db`` mapping template (``ticket.status``). Business
value, reward and ``info`` (``cost``, ``business_value``, ``outcome``) are those of the state-machine
channel (:mod:`agentflow_core.envs.machine_spec`).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.envs.base import StepResult
from agentflow_core.envs.machine_spec import (
    MAX_ENTRIES,
    OUTCOME_KINDS,
    STEP_NAME,
    Names,
    Outcome,
    Reward,
    SpecReader,
    audit_samples,
    check_native_actions,
)
from agentflow_core.envs.sql_driver import SQLITE, Refused, connect
from agentflow_core.envs.state_machine import family_and_version, scenario_fields
from agentflow_core.errors import ConfigError
from agentflow_core.safe_expr import Condition
from agentflow_core.semantics import Vocabulary

NATIVE_TYPE = "sql"
RESERVED = "last"
MAX_SQL = 4000
TOP_KEYS = (
    "description",
    "url",
    "schema",
    "params",
    "seed",
    "observe",
    "actions",
    "faults",
    "terminals",
    "reward",
    "audit",
)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


@dataclass(frozen=True)
class SQLAction:
    """One native action: its applicability query, cost, statements and whether faults hit it."""

    name: str
    when: str | None
    reason: str
    cost: Condition | None
    faults: bool
    statements: tuple[str, ...]


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
    observe: tuple[tuple[str, str], ...]
    actions: Mapping[str, SQLAction]
    faults: tuple[Outcome, ...]
    terminals: tuple[SQLTerminal, ...]
    reward: Reward


def _statement(reader: SpecReader, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_SQL:
        raise reader.fail(key, value, f"an SQL statement of at most {MAX_SQL} characters")
    return value


def _statements(reader: SpecReader, key: str, value: Any) -> tuple[str, ...]:
    return tuple(_statement(reader, f"{key}.{i}", s) for i, s in enumerate(reader.items(key, value)))


def _actions(reader: SpecReader, value: Any) -> dict[str, SQLAction]:
    if not isinstance(value, Mapping) or not value:
        raise reader.fail("actions", value, "a mapping of action name -> {when, statements, ...}")
    out = {}
    for name, entry in value.items():
        key = f"actions.{reader.action_name('actions', name)}"
        item = reader.mapping(key, entry or {}, ("when", "reason", "cost", "faults", "statements", "description"))
        faults = item.get("faults", True)
        if not isinstance(faults, bool):
            raise reader.fail(f"{key}.faults", faults, "true or false")
        when = item.get("when")
        out[name] = SQLAction(
            name,
            None if when is None else _statement(reader, f"{key}.when", when),
            reader.reason(f"{key}.reason", item.get("reason"), "not_applicable") or "not_applicable",
            reader.optional_expr(f"{key}.cost", item.get("cost")),
            faults,
            _statements(reader, f"{key}.statements", item.get("statements")),
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
    faults = reader.outcomes("faults", top.get("faults"), ())
    return SQLSpec(
        url=url,
        schema=_statements(reader, "schema", top["schema"]),
        params=tuple(params),
        seed=_statements(reader, "seed", top.get("seed")),
        observe=tuple((name, _statement(reader, f"observe.{name}", q)) for name, q in observe.items()),
        actions=_actions(reader, top["actions"]),
        faults=faults,
        terminals=_terminals(reader, top["terminals"]),
        reward=reader.reward(top.get("reward")),
    )


def _named(reader: SpecReader, key: str, value: Any) -> dict[str, Any]:
    """A mapping whose keys are the author's names (checked by the caller)."""
    if not isinstance(value, Mapping) or len(value) > MAX_ENTRIES:
        raise reader.fail(key, value, f"a mapping of at most {MAX_ENTRIES} names")
    return dict(value)


def _bindings(spec: SQLSpec, fields: Mapping[str, Any]) -> dict[str, Any]:
    values: dict[str, Any] = dict(fields)
    for name, expr in spec.params:
        values[name] = expr.value(values)
    values[STEP_NAME] = 0
    return values


def check_statements(spec: SQLSpec, fields: Mapping[str, Any], source: str) -> None:
    """Prepare every statement on an empty SQLite copy of the schema: a typo fails at load, not in a worker."""
    conn = sqlite3.connect(":memory:")
    values = _bindings(spec, fields)
    where = "schema"
    try:
        for i, statement in enumerate(spec.schema):
            where = f"schema.{i}"
            conn.execute(statement)
        named = [(f"seed.{i}", s) for i, s in enumerate(spec.seed)]
        named += [(f"observe.{n}", q) for n, q in spec.observe]
        for action in spec.actions.values():
            named += [(f"actions.{action.name}.when", action.when)] if action.when else []
            named += [(f"actions.{action.name}.statements.{i}", s) for i, s in enumerate(action.statements)]
        named += [(f"terminals.{i}.when", t.when) for i, t in enumerate(spec.terminals)]
        for label, statement in named:
            where = label
            conn.execute(f"EXPLAIN {statement}", values)
    except sqlite3.Error as exc:
        raise ConfigError(source, where, None, f"a statement SQLite accepts ({exc})") from None
    finally:
        conn.close()


class SQLChannelEnv:
    """Physical env of a SQL channel written as data (see the module docstring)."""

    def __init__(self, scenario: Any, env_id: str, spec: Mapping[str, Any], source: str = "<sql>") -> None:
        self.document, self.source = spec, source
        fields = scenario_fields(scenario)
        self.spec = parse_sql_spec(spec, fields, source)
        self.db = connect(self.spec.url, self.spec.schema)
        self.np_random = np.random.default_rng()
        self.reconfigure(scenario, env_id)

    @classmethod
    def check_spec(cls, spec: Any, vocabulary: Vocabulary, source: str = "<sql>") -> None:
        """Check the document for ``vocabulary``'s scenario; on SQLite, prepare every statement too."""
        fields = {f.name: f.default for f in vocabulary.scenario.fields}
        fields = {k: (v if isinstance(v, str) else float(v)) for k, v in fields.items()}
        parsed = parse_sql_spec(spec, fields, source)
        if parsed.url == SQLITE:
            check_statements(parsed, fields, source)
        cls.raw_states(spec, source)

    @classmethod
    def check_native(cls, spec: Mapping[str, Any], actions: Mapping[str, Any]) -> None:
        """The mapping's native actions name this document's actions (a ValueError names the first that does not)."""
        check_native_actions(NATIVE_TYPE, spec.get("actions"), actions)

    @classmethod
    def raw_states(cls, spec: Mapping[str, Any], source: str = "<sql>") -> list[tuple[Any, str]]:
        """The labelled raw states of the document's ``audit`` section (the mapping audit's samples)."""
        return audit_samples(spec.get("audit"), {}, source, nested=True)

    def reconfigure(self, scenario: Any, env_id: str) -> None:
        """Re-target to another variant; the next ``reset`` starts its first episode (as if built fresh)."""
        self.scenario, self.env_id = scenario, env_id
        self.family, self.version = family_and_version(env_id)
        fields = scenario_fields(scenario)
        self.values = _bindings(self.spec, fields)
        self.max_steps = int(fields.get("max_episode_steps", 200))
        self.step_id, self.business_value = 0, 0.0

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Roll the previous episode back, seed this one's rows, return the observation."""
        self.np_random = np.random.default_rng(seed)
        self.step_id, self.business_value = 0, 0.0
        self.values[STEP_NAME] = 0
        self.db.begin()
        self.db.action(self.spec.seed, self.values)
        return self._observation(None, True), {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Apply one native action (its statements, unless a fault loses it), then check the terminals."""
        spec, values = self.spec, self.values
        self.step_id += 1
        values[STEP_NAME] = self.step_id
        name = native_action.get("action") if native_action.get("type") == NATIVE_TYPE else None
        action = spec.actions.get(name) if isinstance(name, str) else None
        cost, reason, applied = 0.0, None, False
        if action is None:
            reason = "unknown_action"
        elif action.when is not None and not self._holds(action.when):
            reason = action.reason
        else:
            applied = True
            cost = action.cost.value(values) if action.cost is not None else 0.0
            reason = self._apply(action)
        delta, outcome = -cost, None
        for terminal in spec.terminals:
            if self._holds(terminal.when):
                outcome = terminal.outcome
                delta += terminal.value.value(values) if terminal.value is not None else 0.0
                break
        terminated = outcome is not None
        truncated = not terminated and self.step_id >= self.max_steps
        self.business_value += delta
        reward = spec.reward.scale * delta + (spec.reward.step if applied else spec.reward.inapplicable)
        info = {
            "env_id": self.env_id,
            "step_id": self.step_id,
            "failure_reason": reason if not truncated else reason or "max_steps",
            "applied": applied,
            "cost": cost,
            "business_value": self.business_value,
            "outcome": "truncated" if truncated else outcome,
        }
        return StepResult(self._observation(reason, applied), float(reward), terminated, truncated, info)

    def close(self) -> None:
        """Roll back and release the connection (and this env's schema on a server)."""
        self.db.close()

    # ------------------------------------------------------------------ helpers
    def _apply(self, action: Any) -> str | None:
        """Draw the faults, else run the statements; the failure reason (None on success)."""
        if action.faults:
            for fault in self.spec.faults:
                if fault.when is not None and not fault.when.value(self.values):
                    continue
                p = fault.p.value(self.values) if fault.p is not None else 1.0
                if p >= 1.0 or (p > 0.0 and self.np_random.random() < p):
                    return fault.reason or "fault"
        try:
            self.db.action(action.statements, self.values)
        except Refused:
            return "refused"
        return None

    def _holds(self, query: str) -> bool:
        rows = self.db.rows(query, self.values)
        return bool(rows) and bool(rows[0][0])

    def _observation(self, reason: str | None, applied: bool) -> dict[str, Any]:
        raw: dict[str, Any] = {name: self.db.row(query, self.values) or {} for name, query in self.spec.observe}
        raw[RESERVED] = {"failure_reason": reason, "applied": int(applied)}
        return raw
