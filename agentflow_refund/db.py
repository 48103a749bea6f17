"""The refund process's SQL channel: the case lives in SQLite rows, one transaction per episode.

Each step applies the case rules (:mod:`agentflow_refund.case`), writes the case back with
parameterised statements and reads the rows again; the raw observation is that read-back::

    {"session": {"status": "active"}, "account": {"status": "ok"},
     "order": {"id": 1, "amount": 120.0}, "request": {"status": "draft", "evidence": 0, "evidence_required": 1},
     "ticket": {"reason": None}, "error": {"kind": None}, "client": {"retries": 0}}

so the ``db`` mapping template reads it by column (``request.status``). Native actions are
``{"type": "sql", "op": "<case action>"}`` and ``{"type": "retry"}`` (re-run the op that timed out).
An episode's writes are rolled back at the next reset. Nothing here is in ``agentflow_core``: the
class is registered through the ``agentflow.envs`` entry point ``refund_db``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentflow_core.envs.base import StepResult
from agentflow_refund.case import ACTIONS, INAPPLICABLE_REWARD, RefundCase, Scenario, apply, start_case

FAMILY = "refund_db"
VERSION = 1

SCHEMA = (
    "CREATE TABLE sessions (id INTEGER PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('none','active','expired')))",
    "CREATE TABLE accounts (id INTEGER PRIMARY KEY, status TEXT NOT NULL CHECK (status IN ('ok','flagged')))",
    "CREATE TABLE orders (id INTEGER PRIMARY KEY, amount REAL NOT NULL CHECK (amount > 0), found INTEGER NOT NULL)",
    "CREATE TABLE requests (id INTEGER PRIMARY KEY, order_id INTEGER NOT NULL REFERENCES orders(id),"
    " status TEXT NOT NULL CHECK (status IN ('none','draft','submitted','issued','withdrawn')),"
    " evidence INTEGER NOT NULL, evidence_required INTEGER NOT NULL)",
    "CREATE TABLE tickets (id INTEGER PRIMARY KEY, reason TEXT)",
    "CREATE TABLE errors (id INTEGER PRIMARY KEY, kind TEXT)",
)
WRITE = (
    ("UPDATE sessions SET status = ? WHERE id = 1", lambda c: (c.session,)),
    ("UPDATE accounts SET status = ? WHERE id = 1", lambda c: (c.account,)),
    ("UPDATE orders SET found = ? WHERE id = 1", lambda c: (int(c.order_found),)),
    (
        "UPDATE requests SET status = ?, evidence = ?, evidence_required = ? WHERE id = 1",
        lambda c: (c.request, int(c.evidence), int(c.evidence_required)),
    ),
    ("UPDATE tickets SET reason = ? WHERE id = 1", lambda c: ("support" if c.ticket else None,)),
    ("UPDATE errors SET kind = ? WHERE id = 1", lambda c: ("network_timeout" if c.timed_out else None,)),
)
READ = (
    "SELECT s.status, a.status, o.id, o.amount, o.found, r.status, r.evidence, r.evidence_required, t.reason, e.kind"
    " FROM sessions s, accounts a, orders o, requests r, tickets t, errors e"
    " WHERE s.id = 1 AND a.id = 1 AND o.id = 1 AND r.id = 1 AND t.id = 1 AND e.id = 1"
)


class RefundDBEnv:
    """Physical env of the ``refund_db`` family (see the module docstring)."""

    family = FAMILY
    version = VERSION

    def __init__(self, scenario: Scenario, env_id: str) -> None:
        self.scenario, self.env_id = scenario, env_id
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        for statement in SCHEMA:
            self.conn.execute(statement)
        self.np_random = np.random.default_rng()
        self.case = RefundCase()
        self.step_id = 0
        self.retries = 0
        self._last_op: str | None = None
        self._in_episode = False

    def reconfigure(self, scenario: Scenario, env_id: str) -> None:
        """Re-target to another variant; the open episode is rolled back at the next reset."""
        self.scenario, self.env_id = scenario, env_id

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Roll the previous episode back, insert this one's rows, return the read-back."""
        if self._in_episode:
            self.conn.execute("ROLLBACK")
        # The case's generator is seeded like the refund service seeds an episode's: same seed, same case.
        self.np_random = np.random.default_rng(int(np.random.default_rng(seed).integers(0, 2**62)))
        self.case = start_case(self.scenario)
        self.step_id, self.retries, self._last_op = 0, 0, None
        self.conn.execute("BEGIN")
        self._in_episode = True
        c = self.case
        self.conn.execute("INSERT INTO sessions VALUES (1, ?)", (c.session,))
        self.conn.execute("INSERT INTO accounts VALUES (1, ?)", (c.account,))
        self.conn.execute("INSERT INTO orders VALUES (1, ?, ?)", (c.amount, int(c.order_found)))
        self.conn.execute("INSERT INTO requests VALUES (1, 1, ?, ?, 0)", (c.request, int(c.evidence)))
        self.conn.execute("INSERT INTO tickets VALUES (1, NULL)")
        self.conn.execute("INSERT INTO errors VALUES (1, NULL)")
        return self._read(), {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Apply one native action (an op of the case, or a retry of the op that timed out)."""
        self.step_id += 1
        op: str | None = native_action.get("op") if native_action.get("type") == "sql" else None
        if native_action.get("type") == "retry" and self.case.timed_out:
            op, self.retries = self._last_op, self.retries + 1
        reason: str | None
        if op is None or op not in ACTIONS:
            reward, reason, applied = INAPPLICABLE_REWARD, "not_applicable", False
            self.case.steps += 1
        else:
            reward, reason = apply(self.case, op, self.scenario, self.np_random)
            applied = reason is None or reason in ("escalated", "withdrawn")
            self._last_op = op
        for statement, values in WRITE:
            self.conn.execute(statement, values(self.case))
        truncated = not self.case.done and self.step_id >= self.scenario["max_episode_steps"]
        info = {"env_id": self.env_id, "step_id": self.step_id, "failure_reason": reason, "applied": applied}
        if truncated:
            info["failure_reason"] = reason or "max_steps"
        return StepResult(self._read(), float(reward), self.case.done, truncated, info)

    def _read(self) -> dict[str, Any]:
        row = self.conn.execute(READ).fetchone()
        session, account, order_id, amount, found, request, evidence, required, ticket, error = row
        return {
            "session": {"status": session, "active": int(session == "active")},
            "account": {"status": account},
            "order": {"id": order_id if found else None, "amount": amount},
            "request": {"status": request, "evidence": evidence, "evidence_required": required},
            "ticket": {"reason": ticket},
            "error": {"kind": error},
            "client": {"retries": self.retries},
        }

    def close(self) -> None:
        """Roll back and close the connection."""
        if self._in_episode:
            self.conn.execute("ROLLBACK")
            self._in_episode = False
        self.conn.close()


def _rows(case: RefundCase, error: str | None = None) -> dict[str, Any]:
    """The read-back shape of :meth:`RefundDBEnv._read` for a case (labelled audit samples)."""
    return {
        "session": {"status": case.session, "active": int(case.session == "active")},
        "account": {"status": case.account},
        "order": {"id": 1 if case.order_found else None, "amount": case.amount},
        "request": {
            "status": case.request,
            "evidence": int(case.evidence),
            "evidence_required": int(case.evidence_required),
        },
        "ticket": {"reason": "support" if case.ticket else None},
        "error": {"kind": error},
        "client": {"retries": 0},
    }


# Labelled raw states for the mapping audit (agentflow_core/adapters/audit.py): one per meaning.
RAW_STATES: list[tuple[dict[str, Any], str]] = [
    (_rows(RefundCase()), "SIGNED_OUT"),
    (_rows(RefundCase(session="expired", order_found=True)), "SESSION_EXPIRED"),
    (_rows(RefundCase(session="active")), "SIGNED_IN"),
    (_rows(RefundCase(session="active", account="flagged")), "ACCOUNT_FLAGGED"),
    (_rows(RefundCase(session="active", order_found=True)), "ORDER_FOUND"),
    (_rows(RefundCase(session="active", order_found=True, request="draft")), "REQUEST_DRAFT"),
    (
        _rows(RefundCase(session="active", order_found=True, request="draft", evidence_required=True, amount=150.0)),
        "EVIDENCE_REQUIRED",
    ),
    (_rows(RefundCase(session="active", order_found=True, request="draft", evidence=True)), "EVIDENCE_ATTACHED"),
    (_rows(RefundCase(session="active", order_found=True, request="submitted")), "UNDER_REVIEW"),
    (_rows(RefundCase(session="active", order_found=True, request="issued")), "REFUND_ISSUED"),
    (_rows(RefundCase(session="active", order_found=True, request="withdrawn")), "REQUEST_WITHDRAWN"),
    (_rows(RefundCase(session="active", order_found=True), "network_timeout"), "SERVICE_TIMEOUT"),
    (_rows(RefundCase(session="active", account="flagged", ticket=True)), "ESCALATED"),
]
