"""The order-process env over a SQL database: one transaction per episode, one SAVEPOINT per op."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlalchemy import (
    Connection,
)

from agentflow_core.envs.base import (
    BLOCKED_ESCALATION_REWARD,
    CANCEL_REWARD,
    INAPPLICABLE_REWARD,
    NETWORK_DROP_RATE,
    NETWORK_LATENCY_S,
    STEP_REWARD,
    SUCCESS_REWARD,
    WRONG_ESCALATION_REWARD,
    Scenario,
    StepResult,
)
from agentflow_core.envs.order_db import statements as sql
from agentflow_core.envs.order_db.client import Client, Keys, read_rows, round_trip
from agentflow_core.envs.order_db.fixtures import (
    _align_seed_rows,
    _clone_template,
    _delete_seed_rows,
    _insert_seed_rows,
    _template,
)
from agentflow_core.envs.order_db.postgres import EMBEDDED_POSTGRES, acquire_embedded, release_embedded
from agentflow_core.envs.order_db.raw_states import _blank_obs, _error_row
from agentflow_core.envs.order_db.schema import (
    CODE_APPROVED,
    CODE_DECLINED,
    CODE_MALFUNCTION,
    CODE_NSF,
    FAMILY,
    N_PRODUCTS,
    NETWORK_JITTER_S,
    OPS,
    ORDER_TTL_STEPS,
    PAYMENT_ERROR_RATE,
    VERSION,
    _constraint_name,
    make_engine,
    metadata,
)


@dataclass(frozen=True)
class _Outcome:
    """What one op did to the business process."""

    applied: bool
    reward: float = STEP_REWARD
    terminated: bool = False
    failure_reason: str | None = None


_NOT_APPLIED = _Outcome(applied=False, reward=INAPPLICABLE_REWARD)
_APPLIED = _Outcome(applied=True)


class OrderDBEnv:
    """Order process over a real SQL database; native actions are ``{"type": "sql", "op": ...}``."""

    family = FAMILY
    version = VERSION

    def __init__(self, scenario: Scenario, env_id: str, url: str | None = None) -> None:
        self.scenario = scenario
        self.env_id = env_id
        # A private database is a clone of the process template (schema + placeholder rows) whose
        # rows are then re-keyed to this env: ~0.5 ms instead of CREATE TABLE + INSERTs per env.
        self._private = url is None
        self._embedded = url == EMBEDDED_POSTGRES
        if self._embedded:
            url = acquire_embedded()
        # In a shared database this env's committed rows carry its own key, so two live envs of one
        # variant never touch (or lock) each other's rows; close() deletes them.
        self._rows_key = f"{env_id}#{uuid.uuid4().hex[:12]}"
        self._seeded: tuple[int, int, list[int]] | None = None
        self.engine = make_engine(url, creator=_clone_template if self._private else None)
        if not self._private:
            metadata.create_all(self.engine)
        self._conn: Connection | None = self.engine.connect()
        self._driver = sql.Driver(self._conn)
        self._txn: Any = None
        self._configure()

    def reconfigure(self, scenario: Scenario, env_id: str) -> None:
        """Re-target this env to another variant of its base env; afterwards it behaves exactly like
        ``OrderDBEnv(scenario, env_id, url)`` built fresh (the open episode is rolled back first)."""
        if self._conn is None:
            raise RuntimeError(f"env {self.env_id}: reconfigure after close")
        if self._txn is not None:
            self._txn.rollback()
            self._txn = None
        self.scenario, self.env_id = scenario, env_id
        self._configure()

    def _configure(self) -> None:
        """Seed rows (committed) and per-scenario constants; the next ``reset`` starts an episode."""
        with self.conn.begin():
            self._user_id, self._cart_id, self._product_ids = self._seed(self.conn)
        scenario = self.scenario
        self._discount = scenario.vip_discount if scenario.user_tier == "vip" else 1.0
        self._latency = NETWORK_LATENCY_S[scenario.network]
        self._jitter = NETWORK_JITTER_S[scenario.network]
        self._drop_rate = NETWORK_DROP_RATE[scenario.network]
        self._rng = np.random.default_rng()
        self._new_episode_state()

    # ------------------------------------------------------------------------------- seeding
    def _seed(self, conn: Connection) -> tuple[int, int, list[int]]:
        """This env's customer and catalog rows, aligned with the scenario (inside the caller's transaction).

        A private database holds exactly one env's rows (the template's, at fixed ids): they are
        re-keyed in place, so a fresh and a reconfigured env see the same ids and values. In a shared
        database the env inserts its rows once, under its own key, and re-aligns them to each scenario.
        """
        if self._private:
            # A private database keeps the template's committed rows; ``reset`` aligns them to this
            # env's keys and scenario inside the episode transaction, so re-targeting costs no SQL
            # and the rollback at the next reset restores the template exactly.
            template = _template()
            return template.user_id, template.cart_id, list(template.product_ids)
        if self._seeded is None:
            self._seeded = _insert_seed_rows(conn, self.scenario, self._rows_key)
        else:
            _align_seed_rows(self.db, self.scenario, self._rows_key, self._seeded[0], self._seeded[2])
        return self._seeded

    # ------------------------------------------------------------------------------- episode
    def _new_episode_state(self) -> None:
        self._step = 0
        self._sim_time = 0.0
        self._c = Client()
        self._retry_op: str | None = None
        self._retries = 0  # RETRY actions that re-issued a lost or refused statement
        self._obs = _blank_obs()

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Roll back the previous episode, open a fresh transaction, set up ``start_stage``."""
        if self._conn is None:
            raise RuntimeError(f"env {self.env_id}: reset after close")
        if self._txn is not None:
            self._txn.rollback()
        self._txn = self._conn.begin()
        if self._private:
            _align_seed_rows(self._driver, self.scenario, self.env_id, self._user_id, self._product_ids)
        self._rng = np.random.default_rng(seed)
        self._new_episode_state()
        error = self._setup(self.scenario.start_stage)
        self._obs = self._read(error)
        return self._obs, self._info(None, error, "reset", True)

    def _setup(self, stage: str) -> dict[str, Any] | None:
        """Drive the funnel to ``start_stage`` with the same ops an agent would use."""
        plan = {
            "login": (),
            "product_detail": ("login", "view_product"),
            "checkout": ("login", "view_product", "add_cart_item"),
            "payment": ("login", "view_product", "add_cart_item", "create_order", "open_payment"),
        }[stage]
        for op in plan:
            if op == "add_cart_item" and self._viewed_stock() == 0:
                self._c.product_idx = 1  # the demo product is sold out: take the next one, as a user would
            outcome, error = self._execute(op)
            if error is not None or not outcome.applied:
                return error
        return None

    def _viewed_stock(self) -> int | None:
        if self._c.product_idx is None:
            return None
        pid = self._product_ids[self._c.product_idx]
        return self.db.scalar(sql.VIEWED_STOCK, {"b_product": pid})  # type: ignore[no-any-return]

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Send one op over the simulated link, apply it in a SAVEPOINT, read the rows back."""
        requested = self._parse(native_action)
        self._step += 1
        op = self._retry_op if requested == "retry" else requested  # None: RETRY with nothing owed
        if requested == "retry" and op is not None:
            self._retries += 1
        error = self._network_fault()
        if error is not None:
            outcome = _Outcome(applied=False)
            self._retry_op = op  # nothing reached the server: the same op is still owed
            self._obs = dict(self._obs, error=error, sim_time_s=round(self._sim_time, 6), step=self._step)
        else:
            outcome, error = _NOT_APPLIED, None
            if op is not None:
                outcome, error = self._execute(op)
            self._retry_op = op if error is not None and error["kind"] != "constraint" else None
            error = error or self._expire_due()
            self._obs = self._read(error)
        terminated = outcome.terminated
        truncated = not terminated and self._step >= self.scenario.max_episode_steps
        failure = outcome.failure_reason or (None if error is None else _ERROR_FAILURE[error["kind"]])
        if truncated:
            failure = "max_steps"
        info = self._info(failure, error, op or requested, outcome.applied)
        return StepResult(self._obs, outcome.reward, terminated, truncated, info)

    def close(self) -> None:
        """Roll back the open episode and release the connection and engine."""
        if self._conn is None:
            return
        try:
            if self._txn is not None:
                self._txn.rollback()
                self._txn = None
            if not self._private and self._seeded is not None:
                with self._conn.begin():
                    _delete_seed_rows(self._conn, self._seeded[0], self._seeded[1], self._seeded[2])
            self._driver.close()
            self._conn.close()
        finally:  # a server that died under the env fails the rollback: the env's share of it is released anyway
            self._conn = None
            self.engine.dispose()
            if self._embedded:
                release_embedded()

    # ------------------------------------------------------------------------------- link
    def _network_fault(self) -> dict[str, Any] | None:
        """Advance the simulated clock by one round trip; a drop or a timeout loses the statement."""
        elapsed, error = round_trip(self._rng, self._latency, self._jitter, self._drop_rate)
        self._sim_time += elapsed
        return error

    def _parse(self, native_action: Mapping[str, Any]) -> str:
        kind = native_action.get("type")
        if kind == "noop":  # a semantic action the mapping does not translate
            return "noop"
        op = native_action.get("op")
        if kind != "sql" or op not in OPS:
            raise ValueError(
                f"env {self.env_id}: native action {dict(native_action)!r}, expected "
                f"{{'type': 'sql', 'op': one of {OPS}}} or {{'type': 'noop'}}"
            )
        return str(op)

    # ------------------------------------------------------------------------------- execution
    def _execute(self, op: str) -> tuple[_Outcome, dict[str, Any] | None]:
        """Run one op inside a SAVEPOINT; database errors become an error row, not an exception."""
        handler: Callable[[], _Outcome] = getattr(self, f"_op_{op}")
        self._c.product_shown = False  # any op leaves the product page; view_product opens it again
        if op in _READ_ONLY_OPS:
            return handler(), None
        return self._guarded(handler)

    def _guarded(self, handler: Callable[[], _Outcome]) -> tuple[_Outcome, dict[str, Any] | None]:
        snapshot = replace(self._c)  # a rolled-back savepoint must not leave dangling row ids behind
        dbapi = self.db.dbapi
        try:
            with self.db.savepoint():
                return handler(), None
        except dbapi.IntegrityError as exc:  # a schema rule refused the op: the action did not apply
            self._c = snapshot
            return _NOT_APPLIED, _error_row("constraint", str(exc), _constraint_name(exc))
        except dbapi.OperationalError as exc:  # "database is locked", lock timeouts: transient, RETRY helps
            self._c = snapshot
            message = str(exc)
            kind = "lock_timeout" if any(w in message.lower() for w in ("lock", "busy")) else "db_error"
            return _Outcome(applied=False), _error_row(kind, message)
        except dbapi.Error as exc:
            self._c = snapshot
            return _Outcome(applied=False), _error_row("db_error", str(exc))

    def _expire_due(self) -> dict[str, Any] | None:
        """Server-side timers: expire an old session and an old pending order (only when due)."""
        c = self._c
        session_due = c.session_id is not None and self._step - c.session_step > self.scenario.session_timeout_steps
        order_due = c.order_id is not None and self._step - c.order_step > ORDER_TTL_STEPS
        if not (session_due or order_due):
            return None

        def expire() -> _Outcome:
            if session_due:
                self.db.execute(sql.EXPIRE_SESSION, {"b_session": c.session_id})
            if order_due:
                self.db.execute(sql.SET_ORDER_STATUS, {"b_order": c.order_id, "b_from": "pending", "b_to": "expired"})
            return _APPLIED

        return self._guarded(expire)[1]

    @property
    def conn(self) -> Connection:
        """The env's one connection (the episode transaction lives on it)."""
        if self._conn is None:
            raise RuntimeError(f"env {self.env_id}: used after close")
        return self._conn

    @property
    def db(self) -> sql.Driver:
        """The compiled statements on this env's connection (the hot path of every op)."""
        if self._conn is None:
            raise RuntimeError(f"env {self.env_id}: used after close")
        return self._driver

    def _session_active(self) -> bool:
        if self._c.session_id is None:
            return False
        return bool(self.db.scalar(sql.SESSION_STATUS, {"b_session": self._c.session_id}) == "active")

    # ------------------------------------------------------------------------------- ops
    def _op_refresh(self) -> _Outcome:
        return _APPLIED  # a plain read of the rows

    def _op_noop(self) -> _Outcome:
        return _NOT_APPLIED

    def _op_login(self) -> _Outcome:
        db = self.db
        self._c.user_seen = True
        if self._session_active():
            return _NOT_APPLIED
        if db.scalar(sql.USER_STATUS, {"b_user": self._user_id}) == "blocked":
            return _APPLIED  # authentication answered "blocked"; no session row
        token = self._rng.bytes(12).hex()
        self._c.session_id = db.insert(
            sql.INSERT_SESSION, {"b_user": self._user_id, "b_token": token, "b_step": self._step}
        )
        self._c.session_step = self._step
        return _APPLIED

    def _op_view_product(self) -> _Outcome:
        if not self._session_active():
            return _NOT_APPLIED
        self._c.product_idx = 0 if self._c.product_idx is None else (self._c.product_idx + 1) % N_PRODUCTS
        self._c.product_shown = True
        return _APPLIED

    def _op_add_cart_item(self) -> _Outcome:
        db = self.db
        if not self._session_active() or self._c.product_idx is None:
            return _NOT_APPLIED
        params = {"b_cart": self._cart_id, "b_product": self._product_ids[self._c.product_idx]}
        db.execute(sql.RESERVE_STOCK, params)  # CHECK (stock >= 0) refuses a sold-out product
        if db.execute(sql.ADD_QTY, params).rowcount == 0:
            db.insert(sql.INSERT_ITEM, params)
        return _APPLIED

    def _op_remove_cart_items(self) -> _Outcome:
        db = self.db
        if not self._session_active():
            return _NOT_APPLIED
        lines = db.execute(sql.CART_LINES, {"b_cart": self._cart_id}).fetchall()
        if not lines:
            return _NOT_APPLIED
        db.executemany(sql.RELEASE_STOCK, [{"b_product": pid, "b_qty": qty} for pid, qty in lines])
        db.execute(sql.EMPTY_CART, {"b_cart": self._cart_id})
        return _APPLIED

    def _op_create_order(self) -> _Outcome:
        db = self.db
        if not self._session_active():
            return _NOT_APPLIED
        subtotal = float(db.scalar(sql.CART_SUBTOTAL, {"b_cart": self._cart_id}))
        total = round(subtotal * self._discount, 2)
        # CHECK (total > 0) refuses an empty cart; the partial unique index a second pending order.
        self._c.order_id = db.insert(
            sql.INSERT_ORDER, {"b_user": self._user_id, "b_total": total, "b_step": self._step}
        )
        self._c.order_step = self._step
        self._c.payment_id = None
        return _APPLIED

    def _pending_total(self) -> float | None:
        """The total of the current order if it is still pending (None otherwise)."""
        if self._c.order_id is None:
            return None
        status, total = self.db.execute(sql.ORDER_ROW, {"b_order": self._c.order_id}).fetchone()
        return float(total) if status == "pending" else None

    def _payment(self) -> tuple[str, float] | None:
        if self._c.payment_id is None:
            return None
        status, amount = self.db.execute(sql.PAYMENT_ROW, {"b_payment": self._c.payment_id}).fetchone()
        return status, float(amount)

    def _new_attempt(self, total: float) -> int:
        self._c.payment_id = self.db.insert(
            sql.INSERT_PAYMENT, {"b_order": self._c.order_id, "b_card": self._c.card, "b_amount": total}
        )
        return self._c.payment_id

    def _op_open_payment(self) -> _Outcome:
        total = self._pending_total()
        payment = self._payment()
        if not self._session_active() or total is None or (payment is not None and payment[0] == "initiated"):
            return _NOT_APPLIED
        self._new_attempt(total)
        return _APPLIED

    def _op_charge(self) -> _Outcome:
        db = self.db
        total, payment = self._pending_total(), self._payment()
        if not self._session_active() or total is None or payment is None or payment[0] != "initiated":
            return _NOT_APPLIED
        amount = payment[1]
        declined = self._c.card == "primary" and self._rng.random() < self.scenario.card_decline_rate
        malfunction = self._rng.random() < PAYMENT_ERROR_RATE
        if declined:
            status, code = "declined", CODE_DECLINED
        elif malfunction:
            status, code = "error", CODE_MALFUNCTION
        elif db.execute(sql.DEBIT, {"b_user": self._user_id, "b_amount": amount}).rowcount == 0:
            status, code = "insufficient_funds", CODE_NSF
        else:
            status, code = "captured", CODE_APPROVED
        db.execute(sql.SET_PAYMENT, {"b_payment": self._c.payment_id, "b_status": status, "b_code": code})
        if status != "captured":
            return _APPLIED
        db.execute(sql.SET_ORDER_STATUS, {"b_order": self._c.order_id, "b_from": "pending", "b_to": "paid"})
        db.execute(sql.EMPTY_CART, {"b_cart": self._cart_id})
        return _Outcome(applied=True, reward=SUCCESS_REWARD, terminated=True)

    def _op_top_up(self) -> _Outcome:
        db = self.db
        total, payment = self._pending_total(), self._payment()
        if total is None or payment is None or payment[0] != "insufficient_funds":
            return _NOT_APPLIED
        balance = float(db.scalar(sql.USER_BALANCE, {"b_user": self._user_id}))
        amount = float(max(50.0, 50.0 * math.ceil((total - balance) / 50.0)))  # the shortfall, in 50s
        db.execute(sql.CREDIT, {"b_user": self._user_id, "b_amount": amount})
        payment_id = self._new_attempt(total)
        db.insert(sql.INSERT_TOPUP, {"b_user": self._user_id, "b_payment": payment_id, "b_amount": amount})
        return _APPLIED

    def _op_switch_card(self) -> _Outcome:
        total, payment = self._pending_total(), self._payment()
        if total is None or payment is None or payment[0] not in ("declined", "error"):
            return _NOT_APPLIED
        self._c.card = "backup"
        self._new_attempt(total)
        return _APPLIED

    def _op_cancel_order(self) -> _Outcome:
        if self._c.order_id is None:
            return _NOT_APPLIED
        if self.db.execute(sql.CANCEL_ORDER, {"b_order": self._c.order_id}).rowcount == 0:
            return _NOT_APPLIED
        return _Outcome(applied=True, reward=CANCEL_REWARD, terminated=True, failure_reason="order_cancelled")

    def _op_escalate(self) -> _Outcome:
        db = self.db
        blocked = self._c.user_seen and db.scalar(sql.USER_STATUS, {"b_user": self._user_id}) == "blocked"
        reason = "user_blocked" if blocked else "manual"
        self._c.ticket_id = db.insert(
            sql.INSERT_TICKET, {"b_user": self._user_id, "b_reason": reason, "b_step": self._step}
        )
        if blocked:
            return _Outcome(
                applied=True, reward=BLOCKED_ESCALATION_REWARD, terminated=True, failure_reason="user_blocked"
            )
        return _Outcome(applied=True, reward=WRONG_ESCALATION_REWARD, terminated=True, failure_reason="escalated")

    # ------------------------------------------------------------------------------- observation
    def _read(self, error: dict[str, Any] | None) -> dict[str, Any]:
        """One SELECT of scalar subqueries: the rows this client can see (see :func:`read_rows`)."""
        return read_rows(
            self.db,
            self._c,
            Keys(self._user_id, self._cart_id, tuple(self._product_ids)),
            self._discount,
            self._retries,
            error,
            (round(self._sim_time, 6), self._step),
        )

    def _info(self, failure: str | None, error: dict[str, Any] | None, op: str, applied: bool) -> dict[str, Any]:
        return {
            "env_id": self.env_id,
            "step_id": self._step,
            "failure_reason": failure,
            "sim_time_s": round(self._sim_time, 6),
            "op": op,
            "applied": applied,
            "error": error,
        }


_READ_ONLY_OPS = frozenset({"view_product", "refresh", "noop"})
_ERROR_FAILURE = {
    "constraint": "constraint_violation",
    "lock_timeout": "lock_timeout",
    "db_error": "db_error",
    "network_timeout": "network_timeout",
    "query_timeout": "query_timeout",
}
