"""A process declared as a state machine, persisted in SQL: the machine's variables are rows of a table.

The business logic is the machine (:mod:`agentflow_core.envs.state_machine` runs it); this channel keeps
its state in a database. ``class_path: agentflow_core.envs.machine_sql:MachineSQLEnv`` with the ``db``
adapter, ``spec:`` naming the same machine document as the simulator channel, and optionally
``kwargs: {url: pgserver}`` (default ``sqlite``: a private in-memory SQLite; see
:mod:`agentflow_core.envs.sql_driver`). Two tables, the same for every machine::

    machine_variable (name TEXT PRIMARY KEY, value DOUBLE PRECISION, hidden INTEGER)   -- one row per variable
    machine_event (step INTEGER PRIMARY KEY, action TEXT, reason TEXT, applied INTEGER, cost DOUBLE PRECISION)

A reset inserts the episode's first values (drawn by the machine); a step reads every variable back
from the table, lets the machine apply the action to them, and writes the new values and the step's
event back in one savepoint of the episode's transaction. The raw observation is what two SELECTs
return -- the visible variables' rows and the last event -- in the shape the ``db`` mapping reads::

    {"machine_variable": {"verified": {"value": 1.0}, "price": {"value": 20.0}},
     "machine_event": {"action": "VERIFY", "reason": "timeout", "applied": 1}}

so a rule reads ``machine_variable.verified.value`` and ``machine_event.reason``. Hidden variables are
rows too (``hidden = 1``) but never selected into the observation. A native action is
``{"type": "transaction", "action": "<machine action>"}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflow_core.envs.base import StepResult
from agentflow_core.envs.machine_form import MachineForm
from agentflow_core.envs.machine_spec import check_native_actions
from agentflow_core.envs.sql_driver import SQLITE, connect
from agentflow_core.envs.state_machine import NATIVE_TYPE, StateMachineEnv

TRANSACTION = "transaction"
SCHEMA = (
    "CREATE TABLE machine_variable (name TEXT PRIMARY KEY, value DOUBLE PRECISION NOT NULL, hidden INTEGER NOT NULL)",
    "CREATE TABLE machine_event (step INTEGER PRIMARY KEY, action TEXT, reason TEXT, applied INTEGER NOT NULL, "
    "cost DOUBLE PRECISION NOT NULL)",
)
INSERT_VARIABLE = "INSERT INTO machine_variable (name, value, hidden) VALUES (:n{i}, :v{i}, :h{i})"
UPDATE_VARIABLE = "UPDATE machine_variable SET value = :v{i} WHERE name = :n{i}"
INSERT_EVENT = (
    "INSERT INTO machine_event (step, action, reason, applied, cost) VALUES (:step, :action, :reason, :applied, :cost)"
)
SELECT_ALL = "SELECT name, value FROM machine_variable"
SELECT_VISIBLE = "SELECT name, value FROM machine_variable WHERE hidden = 0 ORDER BY name"
SELECT_LAST_EVENT = "SELECT action, reason, applied FROM machine_event ORDER BY step DESC LIMIT 1"
NO_EVENT = {"action": None, "reason": None, "applied": 1}


def observation(visible: list[tuple[Any, ...]], event: Mapping[str, Any] | None) -> dict[str, Any]:
    """The raw observation from the rows of the two SELECTs (module docstring)."""
    return {
        "machine_variable": {str(name): {"value": float(value)} for name, value in visible},
        "machine_event": dict(event) if event is not None else dict(NO_EVENT),
    }


class MachineSQLEnv(MachineForm):
    """Physical env: the machine of ``spec`` with its state in SQL tables (see the module docstring)."""

    def __init__(
        self, scenario: Any, env_id: str, spec: Mapping[str, Any], url: str = SQLITE, source: str = "<machine>"
    ) -> None:
        super().__init__(scenario, env_id, spec, source)
        self.db = connect(url, SCHEMA)
        self._names: list[str] = []

    @classmethod
    def check_native(cls, spec: Mapping[str, Any], actions: Mapping[str, Any]) -> None:
        """The mapping's native actions are transactions of this machine's actions."""
        check_native_actions(TRANSACTION, spec.get("actions"), actions)

    @classmethod
    def raw_states(cls, spec: Mapping[str, Any], source: str = "<machine>") -> list[tuple[Any, str]]:
        """The machine's labelled audit states, as the rows the SELECTs would return."""
        out = []
        for raw, token in StateMachineEnv.raw_states(spec, source):
            last = raw["last"]
            event = {"action": None, "reason": last["failure_reason"], "applied": last["applied"]}
            out.append((observation(sorted(raw["state"].items()), event), token))
        return out

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Roll back the last episode and insert the machine's first values of this one."""
        _, info = self.sim.reset(seed)
        machine = self.sim.machine
        self._names = [variable.name for variable in machine.variables]
        visible = set(machine.visible)
        params: dict[str, Any] = {}
        for i, name in enumerate(self._names):
            params.update({f"n{i}": name, f"v{i}": float(self.sim.values[name]), f"h{i}": int(name not in visible)})
        self.db.begin()
        self.db.action([INSERT_VARIABLE.format(i=i) for i in range(len(self._names))], params)
        return self._observe(), info

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Read the state from the table, apply the action by the machine, write it back in one savepoint."""
        stored = {str(name): float(value) for name, value in self.db.rows(SELECT_ALL, {})}
        self.sim.values.update(stored)
        action = native_action.get("action") if native_action.get("type") == TRANSACTION else None
        result = self.sim.step({"type": NATIVE_TYPE, "action": action})
        params: dict[str, Any] = {
            "step": result.info["step_id"],
            "action": action if isinstance(action, str) else None,
            "reason": result.obs["last"]["failure_reason"],
            "applied": result.obs["last"]["applied"],
            "cost": float(result.info["cost"]),
        }
        for i, name in enumerate(self._names):
            params.update({f"n{i}": name, f"v{i}": float(self.sim.values[name])})
        statements = [UPDATE_VARIABLE.format(i=i) for i in range(len(self._names))]
        self.db.action([*statements, INSERT_EVENT], params)
        return StepResult(self._observe(), result.reward, result.terminated, result.truncated, result.info)

    def close(self) -> None:
        """Roll back and release the connection."""
        self.db.close()

    def _observe(self) -> dict[str, Any]:
        return observation(self.db.rows(SELECT_VISIBLE, {}), self.db.row(SELECT_LAST_EVENT, {}))
