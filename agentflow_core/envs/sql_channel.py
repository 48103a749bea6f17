"""The generic SQL channel: a process's tables, seed rows, one statement (or a few) per action, all data.

Registered like any channel (``class_path: agentflow_core.envs.sql_channel:SQLChannelEnv``); the env
config's ``spec:`` names the document (or holds it inline; :mod:`agentflow_core.envs.sql_spec` checks it)::

    url: sqlite                      # default: a private SQLite database in memory; pgserver; a SQLAlchemy URL
    schema:                          # run once per env
      - CREATE TABLE ticket (id INTEGER PRIMARY KEY, status TEXT NOT NULL, error TEXT)
    params: {urgent: 'priority == "high"'}   # optional: numbers computed from the scenario, bound by name
    seed:                            # run at every reset, inside the episode's transaction
      - INSERT INTO ticket VALUES (1, 'open', NULL)
    before:                          # optional: run at the start of every declared action's step (a clock)
      - UPDATE ticket SET error = NULL WHERE id = 1
    observe:                         # each query returns at most one row -> {name: {column: value}}
      ticket: SELECT status FROM ticket WHERE id = 1
    actions:
      CLOSE:
        when: SELECT 1 FROM ticket WHERE status = 'open'   # applicable where it returns a row
        reason: not_open             # failure reason when not applicable
        cost: "1"                    # business cost (an expression over the scenario)
        statements: ["UPDATE ticket SET status = 'closed' WHERE id = 1"]
        faults: true                 # default; false: the faults below never hit this action
      CHECK:                         # outcomes: ordered, chosen on the state the action meets; the first fires
        outcomes:
          - {when: "SELECT 1 FROM ticket WHERE status <> 'closed'", reason: not_closed, applicable: false}
          - {p: "0.3", reason: pending, applied: false}            # a draw under p: no effect this time
          - {statements: ["UPDATE ticket SET status = 'archived' WHERE id = 1"]}
      RETRY: {retry: true}           # re-runs the action a fault lost on the step before (else not applicable)
    faults:                          # drawn after an applicable action's query; the first that fires loses it
      - {p: '0.05 * (network == "packet_loss_5%")', reason: timeout,   # its cost is paid
         statements: ["UPDATE ticket SET error = 'timeout' WHERE id = 1"], applied: false}
    terminals:                       # checked in order after every step
      - {when: "SELECT 1 FROM ticket WHERE status = 'closed'", outcome: goal, value: "100"}
    reward: {scale: 0.1}             # optional: step, inapplicable, terminal (the step reward of an ending step)
    audit:                           # labelled raw states for the mapping audit: base rows, then each state's changes
      base: {ticket: {status: open}}
      states:
        - {token: OPEN, set: {}}
        - {token: CLOSED, set: {ticket: {status: closed}}}

Every statement binds the scenario fields and ``params`` by name (``:priority``) and ``step`` (the step
number); nothing from data is formatted into SQL. An action's statements and its outcome's run as one
savepoint: one that the database refuses (a CHECK, a foreign key) undoes the action, whose failure
reason is then ``refused``. Expressions (``p``, ``cost``, ``value``, ``params``, a fault's ``when``) are
:mod:`agentflow_core.safe_expr` over the scenario fields and ``params``. A ``p`` draws one number from the
episode's generator every time it is checked, whatever its value, so variants that differ only in a
rate meet the same random numbers; the generator is seeded like the HTTP channel seeds a service's
episode (one 62-bit draw from ``default_rng(seed)``), so a process's SQL and service channels draw the
same numbers for one seed. The raw observation is the ``observe`` rows plus ``last``
(``failure_reason``, ``applied``), read by the ``db`` mapping template (``ticket.status``). Business
value, reward and ``info`` (``cost``, ``business_value``, ``outcome``) are those of the state-machine
channel (:mod:`agentflow_core.envs.machine_spec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.envs.base import StepResult
from agentflow_core.envs.machine_spec import STEP_NAME, audit_samples, check_native_actions
from agentflow_core.envs.sql_driver import SQLITE, Refused, connect
from agentflow_core.envs.sql_spec import (
    RESERVED,
    SQLAction,
    SQLOutcome,
    bindings,
    check_statements,
    parse_sql_spec,
)
from agentflow_core.envs.state_machine import family_and_version, scenario_fields
from agentflow_core.semantics import Vocabulary

NATIVE_TYPE = "sql"
SEED_HIGH = 2**62  # the episode seed a service channel's reset sends (agentflow_core.envs.http_channel)

__all__ = ["NATIVE_TYPE", "SQLChannelEnv", "check_statements", "parse_sql_spec"]


@dataclass(frozen=True)
class Attempt:
    """What one step did: its cost, failure reason, whether it took effect and whether it was applicable."""

    cost: float = 0.0
    reason: str | None = None
    applied: bool = True
    applicable: bool = True


class SQLChannelEnv:
    """Physical env of a SQL channel written as data (see the module docstring).

    ``url`` (optional) replaces the document's: the same channel on another database (sim-to-real runs a
    SQLite-trained channel on PostgreSQL this way).
    """

    def __init__(
        self, scenario: Any, env_id: str, spec: Mapping[str, Any], source: str = "<sql>", url: str | None = None
    ) -> None:
        self.document, self.source = spec, source
        fields = scenario_fields(scenario)
        self.spec = parse_sql_spec(spec, fields, source)
        self.db = connect(url or self.spec.url, self.spec.schema)
        self.np_random = np.random.default_rng()
        self._lost: SQLAction | None = None
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
        self.values = bindings(self.spec, fields)
        self.max_steps = int(fields.get("max_episode_steps", 200))
        self.step_id, self.business_value = 0, 0.0

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Roll the previous episode back, seed this one's rows, return the observation."""
        self.np_random = np.random.default_rng(int(np.random.default_rng(seed).integers(0, SEED_HIGH)))
        self.step_id, self.business_value, self._lost = 0, 0.0, None
        self.values[STEP_NAME] = 0
        self.db.begin()
        self.db.action(self.spec.seed, self.values)
        return self._observation(None, True), {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Apply one native action (faults, outcomes, statements), then check the terminals."""
        spec, values = self.spec, self.values
        self.step_id += 1
        values[STEP_NAME] = self.step_id
        name = native_action.get("action") if native_action.get("type") == NATIVE_TYPE else None
        action = spec.actions.get(name) if isinstance(name, str) else None
        if action is None:
            attempt = Attempt(reason="unknown_action", applied=False, applicable=False)
        elif action.retry:
            attempt = self._retry(action)
        else:
            attempt = self._execute(action)
        delta, outcome = -attempt.cost, None
        for terminal in spec.terminals:
            if self._holds(terminal.when):
                outcome = terminal.outcome
                delta += terminal.value.value(values) if terminal.value is not None else 0.0
                break
        terminated = outcome is not None
        truncated = not terminated and self.step_id >= self.max_steps
        self.business_value += delta
        reward = spec.reward.scale * delta + spec.reward.base(attempt.applicable, terminated)
        reason = attempt.reason
        info = {
            "env_id": self.env_id,
            "step_id": self.step_id,
            "failure_reason": reason if not truncated else reason or "max_steps",
            "applied": attempt.applied,
            "cost": attempt.cost,
            "business_value": self.business_value,
            "outcome": "truncated" if truncated else outcome,
        }
        return StepResult(self._observation(reason, attempt.applied), float(reward), terminated, truncated, info)

    def close(self) -> None:
        """Roll back and release the connection (and this env's schema on a server)."""
        self.db.close()

    # ------------------------------------------------------------------ helpers
    def _retry(self, action: SQLAction) -> Attempt:
        """Re-run the action a fault lost on the step before (its own statements first: a retry counter)."""
        lost = self._lost
        if lost is None:
            return Attempt(reason=action.reason, applied=False, applicable=False)
        self.db.action(action.statements, self.values)
        return self._execute(lost)

    def _execute(self, action: SQLAction) -> Attempt:
        """``before``, applicability, faults, then the chosen outcome with the action's statements."""
        self._lost = None
        self.db.action(self.spec.before, self.values)
        if action.when is not None and not self._holds(action.when):
            return Attempt(reason=action.reason, applied=False, applicable=False)
        cost = action.cost.value(self.values) if action.cost is not None else 0.0
        if action.faults:
            for fault in self.spec.faults:
                if fault.when is not None and not fault.when.value(self.values):
                    continue
                if fault.p is None or self._draw(fault.p.value(self.values)):
                    self.db.action(fault.statements, self.values)
                    self._lost = action
                    return Attempt(cost, fault.reason or "fault", fault.applied)
        chosen = self._outcome(action.outcomes)
        if chosen is not None and not chosen.applicable:
            return Attempt(reason=chosen.reason, applied=False, applicable=False)
        try:
            self.db.action(action.statements + (chosen.statements if chosen else ()), self.values)
        except Refused:
            return Attempt(cost, "refused")
        return Attempt(cost, chosen.reason, chosen.applied) if chosen else Attempt(cost)

    def _outcome(self, outcomes: tuple[SQLOutcome, ...]) -> SQLOutcome | None:
        """The first outcome whose query returns a row and whose draw falls under its ``p``."""
        for outcome in outcomes:
            if outcome.when is not None and not self._holds(outcome.when):
                continue
            if outcome.p is None or self._draw(outcome.p.value(self.values)):
                return outcome
        return None

    def _draw(self, p: float) -> bool:
        """One number from the episode's generator, under ``p`` or not (drawn whatever ``p`` is)."""
        return bool(self.np_random.random() < p)

    def _holds(self, query: str) -> bool:
        rows = self.db.rows(query, self.values)
        return bool(rows) and bool(rows[0][0])

    def _observation(self, reason: str | None, applied: bool) -> dict[str, Any]:
        raw: dict[str, Any] = {name: self.db.row(query, self.values) or {} for name, query in self.spec.observe}
        raw[RESERVED] = {"failure_reason": reason, "applied": int(applied)}
        return raw
