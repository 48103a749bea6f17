"""The SQL-database channel: the online order run as parameterised SQL against a real database.

The channel is a shop backend whose statements are written in SQLAlchemy Core (compiled once
per dialect and run on the DBAPI cursor, see :class:`_Driver`). Business rules live where a real
backend keeps them -- in the schema: ``CHECK (stock >= 0)`` refuses to sell what is not there,
a partial ``UNIQUE`` index allows one pending order per user, ``CHECK (total > 0)`` refuses an
empty checkout, foreign keys tie rows together. A violated rule is an ``IntegrityError``, a held
write lock an ``OperationalError``; both become an ``error`` row in the observation and a step
``failure_reason``, never an exception.

Isolation ("SQL execution + transaction rollback", docs/design.md §2.1): every episode runs inside one transaction opened at
``reset`` and rolled back at the next ``reset``/``close``, each mutating op inside a SAVEPOINT so
a failed statement undoes only itself. The database therefore never changes across episodes.
By default each env owns a private in-memory SQLite (``sqlite://`` + ``StaticPool``); any
SQLAlchemy URL works, the schema and the env's seed rows (keyed by ``env_id``) are created there
when missing.

The DB link is simulated: each step is one round trip whose latency advances ``sim_time_s``
(no sleeping); ``packet_loss_5%`` drops the statement, and latency beyond the 1.0 s query timeout
cancels it -- in both cases the op is not applied and the previous rows are kept.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
from sqlalchemy import (
    CheckConstraint,
    Column,
    Connection,
    CursorResult,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    and_,
    bindparam,
    create_engine,
    delete,
    event,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.pool import StaticPool
from sqlalchemy.sql.elements import ReleaseSavepointClause, RollbackToSavepointClause, SavepointClause
from sqlalchemy.sql.expression import BindParameter, ClauseElement

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

FAMILY = "order_db"
VERSION = 1

ORDER_TTL_STEPS = 15  # a pending order older than this expires
QUERY_TIMEOUT_S = 1.0  # client-side statement timeout on the simulated link
# Exponential latency jitter per network condition; 0.5 + Exp(0.15) passes 1.0 s ~3.6% of the time.
NETWORK_JITTER_S = {"normal": 0.005, "latency_500ms": 0.15, "packet_loss_5%": 0.01}
PAYMENT_ERROR_RATE = 0.02  # processor malfunction (ISO 8583 code 96), independent of the card
BASE_PRICE = 100.0
ALT_PRODUCT_STOCK = 20  # the products after the demo one are always in stock
N_PRODUCTS = 3

# ISO 8583 response codes written into payments.code.
CODE_APPROVED, CODE_DECLINED, CODE_NSF, CODE_MALFUNCTION = "00", "05", "51", "96"

OPS = (
    "login",
    "view_product",
    "add_cart_item",
    "remove_cart_items",
    "create_order",
    "open_payment",
    "charge",
    "top_up",
    "switch_card",
    "cancel_order",
    "escalate",
    "retry",
    "refresh",
)

# ---------------------------------------------------------------------------------------- schema
metadata = MetaData()

users = Table(
    "users",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("name", String(200), nullable=False, unique=True),
    Column("tier", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("balance", Float, nullable=False),
    CheckConstraint("tier IN ('standard', 'vip')", name="ck_users_tier"),
    CheckConstraint("status IN ('active', 'blocked')", name="ck_users_status"),
    CheckConstraint("balance >= 0", name="ck_users_balance_nonneg"),
)
products = Table(
    "products",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("sku", String(200), nullable=False, unique=True),
    Column("price", Float, nullable=False),
    CheckConstraint("price > 0", name="ck_products_price_positive"),
)
inventory = Table(
    "inventory",
    metadata,
    Column("product_id", Integer, ForeignKey("products.id"), primary_key=True),
    Column("stock", Integer, nullable=False),
    CheckConstraint("stock >= 0", name="ck_inventory_stock_nonneg"),
)
sessions = Table(
    "sessions",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False),
    Column("token", String(32), nullable=False, unique=True),
    Column("created_step", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    CheckConstraint("status IN ('active', 'expired')", name="ck_sessions_status"),
)
carts = Table(
    "carts",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False, unique=True),
)
cart_items = Table(
    "cart_items",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("cart_id", Integer, ForeignKey("carts.id"), nullable=False),
    Column("product_id", Integer, ForeignKey("products.id"), nullable=False),
    Column("qty", Integer, nullable=False),
    UniqueConstraint("cart_id", "product_id", name="uq_cart_items_product"),
    CheckConstraint("qty > 0", name="ck_cart_items_qty_positive"),
)
orders = Table(
    "orders",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False),
    Column("status", String(16), nullable=False),
    Column("total", Float, nullable=False),
    Column("created_step", Integer, nullable=False),
    CheckConstraint("status IN ('pending', 'paid', 'cancelled', 'expired')", name="ck_orders_status"),
    CheckConstraint("total > 0", name="ck_orders_total_positive"),
)
# One pending order per user: a second CHECKOUT is refused by the database, not by Python.
Index(
    "uq_orders_one_pending",
    orders.c.user_id,
    unique=True,
    sqlite_where=orders.c.status == "pending",
    postgresql_where=orders.c.status == "pending",
)
payments = Table(
    "payments",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("order_id", Integer, ForeignKey("orders.id"), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("card", String(16), nullable=False),
    Column("amount", Float, nullable=False),
    Column("status", String(24), nullable=False),
    Column("code", String(4)),
    UniqueConstraint("order_id", "attempt", name="uq_payments_attempt"),
    CheckConstraint(
        "status IN ('initiated', 'captured', 'declined', 'insufficient_funds', 'error')", name="ck_payments_status"
    ),
    CheckConstraint("card IN ('primary', 'backup')", name="ck_payments_card"),
)
# Never two captures for one order (a double charge).
Index(
    "uq_payments_one_capture",
    payments.c.order_id,
    unique=True,
    sqlite_where=payments.c.status == "captured",
    postgresql_where=payments.c.status == "captured",
)
topups = Table(
    "topups",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False),
    Column("payment_id", Integer, ForeignKey("payments.id"), nullable=False),
    Column("amount", Float, nullable=False),
    CheckConstraint("amount > 0", name="ck_topups_amount_positive"),
)
tickets = Table(
    "tickets",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("user_id", Integer, ForeignKey("users.id"), nullable=False),
    Column("reason", String(32), nullable=False),
    Column("created_step", Integer, nullable=False),
)

# SQLite reports unique indexes by column; map those messages back to the constraint name.
_UNIQUE_COLUMNS = {
    "orders.user_id": "uq_orders_one_pending",
    "payments.order_id, payments.attempt": "uq_payments_attempt",
    "payments.order_id": "uq_payments_one_capture",
    "cart_items.cart_id, cart_items.product_id": "uq_cart_items_product",
    "sessions.token": "uq_sessions_token",
}
_CONSTRAINT_NAMES = tuple(
    c.name for t in metadata.sorted_tables for c in t.constraints if isinstance(c.name, str)
) + tuple(i.name for t in metadata.sorted_tables for i in t.indexes if isinstance(i.name, str))

# ------------------------------------------------------------------------ compiled statements
# Built once as SQLAlchemy Core, compiled once per dialect by :class:`_Driver`, so a step only binds parameters.
_b_user: BindParameter[Any] = bindparam("b_user")
_b_cart: BindParameter[Any] = bindparam("b_cart")
_b_session: BindParameter[Any] = bindparam("b_session")
_b_product: BindParameter[Any] = bindparam("b_product")
_b_order: BindParameter[Any] = bindparam("b_order")
_b_payment: BindParameter[Any] = bindparam("b_payment")
_b_ticket: BindParameter[Any] = bindparam("b_ticket")
_b_catalog: BindParameter[Any] = bindparam("b_catalog")


def _scalar(column: Any, *where: Any) -> Any:
    return select(column).where(*where).scalar_subquery()


# The observation: every row the client shows, in one statement of scalar subqueries.
_READ_OBS = select(
    _scalar(sessions.c.status, sessions.c.id == _b_session).label("session_status"),
    _scalar(users.c.tier, users.c.id == _b_user).label("user_tier"),
    _scalar(users.c.status, users.c.id == _b_user).label("user_status"),
    _scalar(users.c.balance, users.c.id == _b_user).label("user_balance"),
    _scalar(func.coalesce(func.sum(cart_items.c.qty), 0), cart_items.c.cart_id == _b_cart).label("cart_items"),
    _scalar(inventory.c.stock, inventory.c.product_id == _b_product).label("product_stock"),
    _scalar(products.c.price, products.c.id == _b_product).label("product_price"),
    _scalar(products.c.price, products.c.id == _b_catalog).label("catalog_price"),
    _scalar(orders.c.status, orders.c.id == _b_order).label("order_status"),
    _scalar(orders.c.total, orders.c.id == _b_order).label("order_total"),
    _scalar(payments.c.status, payments.c.id == _b_payment).label("payment_status"),
    _scalar(payments.c.code, payments.c.id == _b_payment).label("payment_code"),
    _scalar(payments.c.card, payments.c.id == _b_payment).label("payment_card"),
    _scalar(func.count(payments.c.id), payments.c.order_id == _b_order).label("payment_attempts"),
    _scalar(topups.c.amount, topups.c.payment_id == _b_payment).label("topup_amount"),
    _scalar(tickets.c.reason, tickets.c.id == _b_ticket).label("ticket_reason"),
)


class _ObsRow(NamedTuple):
    """One row of ``_READ_OBS``, field for column (``test_env_db`` checks the two agree)."""

    session_status: Any
    user_tier: Any
    user_status: Any
    user_balance: Any
    cart_items: Any
    product_stock: Any
    product_price: Any
    catalog_price: Any
    order_status: Any
    order_total: Any
    payment_status: Any
    payment_code: Any
    payment_card: Any
    payment_attempts: Any
    topup_amount: Any
    ticket_reason: Any


_SESSION_STATUS = select(sessions.c.status).where(sessions.c.id == bindparam("b_session"))
_USER_STATUS = select(users.c.status).where(users.c.id == bindparam("b_user"))
_INSERT_SESSION = insert(sessions).values(
    user_id=bindparam("b_user"), token=bindparam("b_token"), created_step=bindparam("b_step"), status="active"
)
_EXPIRE_SESSION = (
    update(sessions)
    .where(and_(sessions.c.id == bindparam("b_session"), sessions.c.status == "active"))
    .values(status="expired")
)
_RESERVE_STOCK = (
    update(inventory).where(inventory.c.product_id == bindparam("b_product")).values(stock=inventory.c.stock - 1)
)
_ADD_QTY = (
    update(cart_items)
    .where(and_(cart_items.c.cart_id == bindparam("b_cart"), cart_items.c.product_id == bindparam("b_product")))
    .values(qty=cart_items.c.qty + 1)
)
_INSERT_ITEM = insert(cart_items).values(cart_id=bindparam("b_cart"), product_id=bindparam("b_product"), qty=1)
_CART_LINES = select(cart_items.c.product_id, cart_items.c.qty).where(cart_items.c.cart_id == bindparam("b_cart"))
_RELEASE_STOCK = (
    update(inventory)
    .where(inventory.c.product_id == bindparam("b_product"))
    .values(stock=inventory.c.stock + bindparam("b_qty"))
)
_EMPTY_CART = delete(cart_items).where(cart_items.c.cart_id == bindparam("b_cart"))
_CART_SUBTOTAL = (
    select(func.coalesce(func.sum(cart_items.c.qty * products.c.price), 0.0))
    .select_from(cart_items.join(products, cart_items.c.product_id == products.c.id))
    .where(cart_items.c.cart_id == bindparam("b_cart"))
)
_INSERT_ORDER = insert(orders).values(
    user_id=bindparam("b_user"), status="pending", total=bindparam("b_total"), created_step=bindparam("b_step")
)
_ORDER_ROW = select(orders.c.status, orders.c.total).where(orders.c.id == bindparam("b_order"))
_SET_ORDER_STATUS = (
    update(orders)
    .where(and_(orders.c.id == bindparam("b_order"), orders.c.status == bindparam("b_from")))
    .values(status=bindparam("b_to"))
)
# ``status = a OR status = b`` rather than ``IN (a, b)``: an IN list is an "expanding" parameter that
# SQLAlchemy renders only at execution time, so it could not be compiled once ahead of it.
_CANCEL_ORDER = (
    update(orders)
    .where(and_(orders.c.id == bindparam("b_order"), or_(orders.c.status == "pending", orders.c.status == "expired")))
    .values(status="cancelled")
)
_INSERT_PAYMENT = insert(payments).values(
    order_id=bindparam("b_order"),
    card=bindparam("b_card"),
    amount=bindparam("b_amount"),
    status="initiated",
    attempt=select(func.coalesce(func.max(payments.c.attempt), 0) + 1)
    .where(payments.c.order_id == bindparam("b_order"))
    .scalar_subquery(),
)
_PAYMENT_ROW = select(payments.c.status, payments.c.amount).where(payments.c.id == bindparam("b_payment"))
_SET_PAYMENT = (
    update(payments)
    .where(and_(payments.c.id == bindparam("b_payment"), payments.c.status == "initiated"))
    .values(status=bindparam("b_status"), code=bindparam("b_code"))
)
_DEBIT = (
    update(users)
    .where(and_(users.c.id == bindparam("b_user"), users.c.balance >= bindparam("b_amount")))
    .values(balance=users.c.balance - bindparam("b_amount"))
)
_USER_BALANCE = select(users.c.balance).where(users.c.id == bindparam("b_user"))
_VIEWED_STOCK = select(inventory.c.stock).where(inventory.c.product_id == bindparam("b_product"))
_CREDIT = update(users).where(users.c.id == bindparam("b_user")).values(balance=users.c.balance + bindparam("b_amount"))
_INSERT_TOPUP = insert(topups).values(
    user_id=bindparam("b_user"), payment_id=bindparam("b_payment"), amount=bindparam("b_amount")
)
_INSERT_TICKET = insert(tickets).values(
    user_id=bindparam("b_user"), reason=bindparam("b_reason"), created_step=bindparam("b_step")
)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # pysqlite defers BEGIN and breaks SAVEPOINT; take transaction control ourselves (SQLAlchemy
    # docs, "Serializable isolation / Savepoints / Transactional DDL") and enforce foreign keys.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    connection.exec_driver_sql("BEGIN")


def make_engine(url: str | None, creator: Callable[[], sqlite3.Connection] | None = None) -> Engine:
    """A private in-memory SQLite (``url=None``) or any SQLAlchemy URL, with working SAVEPOINTs.

    ``creator`` (private SQLite only) supplies the DBAPI connection, e.g. a clone of the template.
    """
    if url is None:
        extra: dict[str, Any] = {"creator": creator} if creator is not None else {}
        engine = create_engine("sqlite://", poolclass=StaticPool, connect_args={"check_same_thread": False}, **extra)
    else:
        engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
    return engine


@dataclass(frozen=True)
class _Compiled:
    """One statement as its dialect's SQL text: bind names in order (positional paramstyles) and the
    literal values Core compiled into it (``status="active"`` is a bound value too)."""

    sql: str
    names: tuple[str, ...] | None  # None: a named paramstyle (PostgreSQL's ``%(name)s``), pass a mapping
    defaults: Mapping[str, Any]
    returns_id: bool  # the dialect returns the new primary key as a row (RETURNING), else ``lastrowid``

    def bind(self, params: Mapping[str, Any]) -> Sequence[Any] | Mapping[str, Any]:
        values = {**self.defaults, **params}
        return values if self.names is None else tuple(values[name] for name in self.names)


def _compile(statement: ClauseElement, dialect: Dialect) -> _Compiled:
    compiled = dialect.statement_compiler(dialect, statement)  # what ``statement.compile(dialect=...)`` builds
    names = tuple(compiled.positiontup) if dialect.positional and compiled.positiontup is not None else None
    defaults = dict(compiled.construct_params(_check=False))  # unbound names map to None until bound
    return _Compiled(compiled.string, names, defaults, bool(compiled.effective_returning))


_COMPILED: dict[Hashable, dict[int, _Compiled]] = {}  # dialect -> id(statement) -> its compiled form
_SAVEPOINT = "agentflow_op"


class _Driver:
    """The env's hot path: its Core statements, compiled once per dialect, run on the DBAPI cursor.

    Why not ``Connection.execute``: per statement, SQLAlchemy Core spent several times SQLite's own
    execute time in cache-key generation, compiled-cache lookup, execution-context setup and events
    (py-spy on a pool of order_db envs: ~60% of env time in Core's Python layers, ~10% in
    ``sqlite3.Cursor.execute``). The SQL text is exactly what Core compiles for this engine's dialect
    (PostgreSQL gets ``%(name)s`` binds and RETURNING), run on the same DBAPI connection, inside the
    transaction ``reset`` opened; errors are PEP 249's exception classes of the dialect's driver, so
    the rules the schema enforces are still the database's. Seeding and the shared-database lookups,
    which run once per env, stay on Core.
    """

    def __init__(self, connection: Connection) -> None:
        dialect = connection.dialect
        key = (dialect.name, dialect.driver, dialect.paramstyle, dialect.server_version_info)
        self._compiled = _COMPILED.setdefault(key, {})
        self._dialect = dialect
        self.dbapi: Any = dialect.loaded_dbapi  # the driver module: IntegrityError, OperationalError, Error
        self._cursor: Any = connection.connection.driver_connection.cursor()  # type: ignore[union-attr]
        self._savepoint, self._release, self._rollback_to = (
            clause(_SAVEPOINT).compile(dialect=dialect).string
            for clause in (SavepointClause, ReleaseSavepointClause, RollbackToSavepointClause)
        )

    def _statement(self, statement: ClauseElement) -> _Compiled:
        compiled = self._compiled.get(id(statement))
        if compiled is None:  # statements are module constants: id() is stable for the process
            compiled = self._compiled[id(statement)] = _compile(statement, self._dialect)
        return compiled

    def execute(self, statement: ClauseElement, params: Mapping[str, Any]) -> Any:
        """Run one statement; returns the DBAPI cursor (``rowcount``, ``fetchone``, ``fetchall``)."""
        compiled = self._statement(statement)
        self._cursor.execute(compiled.sql, compiled.bind(params))
        return self._cursor

    def executemany(self, statement: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
        """One statement over many parameter sets (one driver call instead of one per row)."""
        compiled = self._statement(statement)
        self._cursor.executemany(compiled.sql, [compiled.bind(row) for row in rows])

    def scalar(self, statement: ClauseElement, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, None when there is no row."""
        row = self.execute(statement, params).fetchone()
        return None if row is None else row[0]

    def insert(self, statement: ClauseElement, params: Mapping[str, Any]) -> int:
        """Run an INSERT; returns the new row's primary key."""
        compiled = self._statement(statement)
        self._cursor.execute(compiled.sql, compiled.bind(params))
        key = self._cursor.fetchone()[0] if compiled.returns_id else self._cursor.lastrowid
        if key is None:
            raise RuntimeError("INSERT returned no primary key")
        return int(key)

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        """SAVEPOINT around a block: an exception rolls back to it (and re-raises), else it is released."""
        self._cursor.execute(self._savepoint)
        try:
            yield
        except BaseException:
            self._cursor.execute(self._rollback_to)
            self._cursor.execute(self._release)
            raise
        self._cursor.execute(self._release)

    def close(self) -> None:
        self._cursor.close()


@dataclass(frozen=True)
class _Template:
    """A private database with the schema and one placeholder env's seed rows, built once per process."""

    connection: sqlite3.Connection
    user_id: int
    cart_id: int
    product_ids: tuple[int, ...]
    lock: threading.Lock


_TEMPLATE: list[_Template] = []  # filled on first use, never at import time
_TEMPLATE_LOCK = threading.Lock()
_TEMPLATE_ENV_ID = "__template__"


def _template() -> _Template:
    """The process's template database: ``CREATE TABLE`` and the seed INSERTs run once, not per env."""
    with _TEMPLATE_LOCK:
        if not _TEMPLATE:
            raw = sqlite3.connect(":memory:", check_same_thread=False)
            engine = make_engine(None, creator=lambda: raw)
            metadata.create_all(engine)
            with engine.begin() as conn:
                user_id, cart_id, product_ids = _insert_seed_rows(conn, Scenario(), _TEMPLATE_ENV_ID)
            _TEMPLATE.append(_Template(raw, user_id, cart_id, tuple(product_ids), threading.Lock()))
        return _TEMPLATE[0]


def _clone_template() -> sqlite3.Connection:
    """A new in-memory database holding a page-for-page copy of the template (sqlite3 backup API)."""
    template = _template()
    clone = sqlite3.connect(":memory:", check_same_thread=False)
    with template.lock:
        template.connection.backup(clone)
    return clone


def dump_tables(connection: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, ordered by primary key: the before/after image of isolation tests."""
    return {
        t.name: [tuple(r) for r in connection.execute(select(t).order_by(*t.primary_key.columns))]
        for t in metadata.sorted_tables
    }


def _error_row(kind: str | None, message: str | None = None, constraint: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "constraint": constraint, "message": message}


def _new_id(result: CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None:
        raise RuntimeError("INSERT returned no primary key")
    return int(key[0])


def _constraint_name(exc: Exception) -> str:
    """The schema rule a DBAPI ``IntegrityError`` reports."""
    diag = getattr(getattr(exc, "diag", None), "constraint_name", None)  # PostgreSQL names it directly
    if diag:
        return str(diag)
    message = str(exc)
    for name in _CONSTRAINT_NAMES:
        if name in message:
            return name
    for columns, name in sorted(_UNIQUE_COLUMNS.items(), key=lambda kv: -len(kv[0])):
        if message.rstrip().endswith(columns):
            return name
    return "foreign_key" if "FOREIGN KEY" in message.upper() else "unknown"


def _seed_values(scenario: Scenario) -> tuple[str, str, float, list[int]]:
    """(tier, status, price, stocks) of a scenario's seed rows."""
    tier, status = ("standard", "blocked") if scenario.user_tier == "blocked" else (scenario.user_tier, "active")
    price = round(BASE_PRICE * scenario.price_factor, 2)
    return tier, status, price, [scenario.inventory] + [ALT_PRODUCT_STOCK] * (N_PRODUCTS - 1)


def _insert_seed_rows(conn: Connection, scenario: Scenario, env_id: str) -> tuple[int, int, list[int]]:
    """Insert one env's customer, cart, products and stock; returns (user_id, cart_id, product_ids)."""
    tier, status, price, stocks = _seed_values(scenario)
    user_id = _new_id(
        conn.execute(
            insert(users).values(name=f"customer@{env_id}", tier=tier, status=status, balance=scenario.balance)
        )
    )
    cart_id = _new_id(conn.execute(insert(carts).values(user_id=user_id)))
    product_ids = []
    for i, stock in enumerate(stocks):
        pid = _new_id(conn.execute(insert(products).values(sku=f"{env_id}/sku-{i}", price=price)))
        conn.execute(insert(inventory).values(product_id=pid, stock=stock))
        product_ids.append(pid)
    return user_id, cart_id, product_ids


_ALIGN_USER = (
    update(users)
    .where(users.c.id == bindparam("b_user"))
    .values(
        name=bindparam("b_name"), tier=bindparam("b_tier"), status=bindparam("b_status"), balance=bindparam("b_balance")
    )
)
_ALIGN_PRODUCT = (
    update(products).where(products.c.id == bindparam("pid")).values(sku=bindparam("sku"), price=bindparam("price"))
)
_ALIGN_STOCK = update(inventory).where(inventory.c.product_id == bindparam("pid")).values(stock=bindparam("stock"))


def _align_seed_rows(db: _Driver, scenario: Scenario, env_id: str, user_id: int, product_ids: Sequence[int]) -> None:
    """Set existing seed rows (by id) to ``env_id``'s keys and the scenario's values."""
    tier, status, price, stocks = _seed_values(scenario)
    db.execute(
        _ALIGN_USER,
        {
            "b_user": user_id,
            "b_name": f"customer@{env_id}",
            "b_tier": tier,
            "b_status": status,
            "b_balance": scenario.balance,
        },
    )
    # executemany: one round trip per table instead of one per product
    db.executemany(
        _ALIGN_PRODUCT,
        [{"pid": pid, "sku": f"{env_id}/sku-{i}", "price": price} for i, pid in enumerate(product_ids)],
    )
    db.executemany(_ALIGN_STOCK, [{"pid": pid, "stock": stock} for pid, stock in zip(product_ids, stocks, strict=True)])


@dataclass(frozen=True)
class _Outcome:
    """What one op did to the business process."""

    applied: bool
    reward: float = STEP_REWARD
    terminated: bool = False
    failure_reason: str | None = None


@dataclass
class _Client:
    """The client-side handles of one episode (row ids, as an app keeps its session token)."""

    session_id: int | None = None
    session_step: int = 0
    user_seen: bool = False
    product_idx: int | None = None
    order_id: int | None = None
    order_step: int = 0
    payment_id: int | None = None
    card: str = "primary"
    ticket_id: int | None = None


_NOT_APPLIED = _Outcome(applied=False, reward=INAPPLICABLE_REWARD)
_APPLIED = _Outcome(applied=True)


def _blank_obs() -> dict[str, Any]:
    return {
        "session": {"status": None, "active": 0},
        "user": {"tier": None, "status": None, "balance": None, "vip": 0},
        "wallet": {"balance_ratio": None},
        "cart": {"items": 0},
        "product": {"id": None, "stock": None, "price": None},
        "catalog": {"price": None},
        "order": {"id": None, "status": None, "total": None},
        "payment": {"status": None, "code": None, "card": None, "open": 0, "attempts": 0},
        "client": {"retries": 0},
        "topup": {"amount": None},
        "ticket": {"reason": None},
        "error": _error_row(None),
        "sim_time_s": 0.0,
        "step": 0,
    }


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
        self.engine = make_engine(url, creator=_clone_template if self._private else None)
        if not self._private:
            metadata.create_all(self.engine)
        self._conn: Connection | None = self.engine.connect()
        self._driver = _Driver(self._conn)
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
        re-keyed in place, so a fresh and a reconfigured env see the same ids and values. A shared
        database keys rows by ``env_id``: they are inserted when missing, else aligned.
        """
        if self._private:
            # A private database keeps the template's committed rows; ``reset`` aligns them to this
            # env's keys and scenario inside the episode transaction, so re-targeting costs no SQL
            # and the rollback at the next reset restores the template exactly.
            template = _template()
            return template.user_id, template.cart_id, list(template.product_ids)
        name = f"customer@{self.env_id}"
        user_id = conn.execute(select(users.c.id).where(users.c.name == name)).scalar()
        if user_id is None:
            return _insert_seed_rows(conn, self.scenario, self.env_id)
        product_ids = [
            int(conn.execute(select(products.c.id).where(products.c.sku == f"{self.env_id}/sku-{i}")).scalar_one())
            for i in range(N_PRODUCTS)
        ]
        _align_seed_rows(self.db, self.scenario, self.env_id, int(user_id), product_ids)
        cart_id = conn.execute(select(carts.c.id).where(carts.c.user_id == user_id)).scalar_one()
        return int(user_id), int(cart_id), product_ids

    # ------------------------------------------------------------------------------- episode
    def _new_episode_state(self) -> None:
        self._step = 0
        self._sim_time = 0.0
        self._c = _Client()
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
        return self.db.scalar(_VIEWED_STOCK, {"b_product": pid})  # type: ignore[no-any-return]

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
        if self._txn is not None:
            self._txn.rollback()
            self._txn = None
        self._driver.close()
        self._conn.close()
        self._conn = None
        self.engine.dispose()

    # ------------------------------------------------------------------------------- link
    def _network_fault(self) -> dict[str, Any] | None:
        """Advance the simulated clock by one round trip; a drop or a timeout loses the statement."""
        dropped = self._rng.random() < self._drop_rate
        latency = self._latency + float(self._rng.exponential(self._jitter))
        if dropped:
            self._sim_time += QUERY_TIMEOUT_S
            return _error_row("network_timeout", "no response from database")
        if latency > QUERY_TIMEOUT_S:
            self._sim_time += QUERY_TIMEOUT_S
            return _error_row(
                "query_timeout", f"statement cancelled after {QUERY_TIMEOUT_S:.1f}s (latency {latency:.3f}s)"
            )
        self._sim_time += latency
        return None

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
                self.db.execute(_EXPIRE_SESSION, {"b_session": c.session_id})
            if order_due:
                self.db.execute(_SET_ORDER_STATUS, {"b_order": c.order_id, "b_from": "pending", "b_to": "expired"})
            return _APPLIED

        return self._guarded(expire)[1]

    @property
    def conn(self) -> Connection:
        """The env's one connection (the episode transaction lives on it)."""
        if self._conn is None:
            raise RuntimeError(f"env {self.env_id}: used after close")
        return self._conn

    @property
    def db(self) -> _Driver:
        """The compiled statements on this env's connection (the hot path of every op)."""
        if self._conn is None:
            raise RuntimeError(f"env {self.env_id}: used after close")
        return self._driver

    def _session_active(self) -> bool:
        if self._c.session_id is None:
            return False
        return bool(self.db.scalar(_SESSION_STATUS, {"b_session": self._c.session_id}) == "active")

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
        if db.scalar(_USER_STATUS, {"b_user": self._user_id}) == "blocked":
            return _APPLIED  # authentication answered "blocked"; no session row
        token = self._rng.bytes(12).hex()
        self._c.session_id = db.insert(
            _INSERT_SESSION, {"b_user": self._user_id, "b_token": token, "b_step": self._step}
        )
        self._c.session_step = self._step
        return _APPLIED

    def _op_view_product(self) -> _Outcome:
        if not self._session_active():
            return _NOT_APPLIED
        self._c.product_idx = 0 if self._c.product_idx is None else (self._c.product_idx + 1) % N_PRODUCTS
        return _APPLIED

    def _op_add_cart_item(self) -> _Outcome:
        db = self.db
        if not self._session_active() or self._c.product_idx is None:
            return _NOT_APPLIED
        params = {"b_cart": self._cart_id, "b_product": self._product_ids[self._c.product_idx]}
        db.execute(_RESERVE_STOCK, params)  # CHECK (stock >= 0) refuses a sold-out product
        if db.execute(_ADD_QTY, params).rowcount == 0:
            db.insert(_INSERT_ITEM, params)
        return _APPLIED

    def _op_remove_cart_items(self) -> _Outcome:
        db = self.db
        if not self._session_active():
            return _NOT_APPLIED
        lines = db.execute(_CART_LINES, {"b_cart": self._cart_id}).fetchall()
        if not lines:
            return _NOT_APPLIED
        db.executemany(_RELEASE_STOCK, [{"b_product": pid, "b_qty": qty} for pid, qty in lines])
        db.execute(_EMPTY_CART, {"b_cart": self._cart_id})
        return _APPLIED

    def _op_create_order(self) -> _Outcome:
        db = self.db
        if not self._session_active():
            return _NOT_APPLIED
        subtotal = float(db.scalar(_CART_SUBTOTAL, {"b_cart": self._cart_id}))
        total = round(subtotal * self._discount, 2)
        # CHECK (total > 0) refuses an empty cart; the partial unique index a second pending order.
        self._c.order_id = db.insert(_INSERT_ORDER, {"b_user": self._user_id, "b_total": total, "b_step": self._step})
        self._c.order_step = self._step
        self._c.payment_id = None
        return _APPLIED

    def _pending_total(self) -> float | None:
        """The total of the current order if it is still pending (None otherwise)."""
        if self._c.order_id is None:
            return None
        status, total = self.db.execute(_ORDER_ROW, {"b_order": self._c.order_id}).fetchone()
        return float(total) if status == "pending" else None

    def _payment(self) -> tuple[str, float] | None:
        if self._c.payment_id is None:
            return None
        status, amount = self.db.execute(_PAYMENT_ROW, {"b_payment": self._c.payment_id}).fetchone()
        return status, float(amount)

    def _new_attempt(self, total: float) -> int:
        self._c.payment_id = self.db.insert(
            _INSERT_PAYMENT, {"b_order": self._c.order_id, "b_card": self._c.card, "b_amount": total}
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
        elif db.execute(_DEBIT, {"b_user": self._user_id, "b_amount": amount}).rowcount == 0:
            status, code = "insufficient_funds", CODE_NSF
        else:
            status, code = "captured", CODE_APPROVED
        db.execute(_SET_PAYMENT, {"b_payment": self._c.payment_id, "b_status": status, "b_code": code})
        if status != "captured":
            return _APPLIED
        db.execute(_SET_ORDER_STATUS, {"b_order": self._c.order_id, "b_from": "pending", "b_to": "paid"})
        db.execute(_EMPTY_CART, {"b_cart": self._cart_id})
        return _Outcome(applied=True, reward=SUCCESS_REWARD, terminated=True)

    def _op_top_up(self) -> _Outcome:
        db = self.db
        total, payment = self._pending_total(), self._payment()
        if total is None or payment is None or payment[0] != "insufficient_funds":
            return _NOT_APPLIED
        balance = float(db.scalar(_USER_BALANCE, {"b_user": self._user_id}))
        amount = float(max(50.0, 50.0 * math.ceil((total - balance) / 50.0)))  # the shortfall, in 50s
        db.execute(_CREDIT, {"b_user": self._user_id, "b_amount": amount})
        payment_id = self._new_attempt(total)
        db.insert(_INSERT_TOPUP, {"b_user": self._user_id, "b_payment": payment_id, "b_amount": amount})
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
        if self.db.execute(_CANCEL_ORDER, {"b_order": self._c.order_id}).rowcount == 0:
            return _NOT_APPLIED
        return _Outcome(applied=True, reward=CANCEL_REWARD, terminated=True, failure_reason="order_cancelled")

    def _op_escalate(self) -> _Outcome:
        db = self.db
        blocked = self._c.user_seen and db.scalar(_USER_STATUS, {"b_user": self._user_id}) == "blocked"
        reason = "user_blocked" if blocked else "manual"
        self._c.ticket_id = db.insert(
            _INSERT_TICKET, {"b_user": self._user_id, "b_reason": reason, "b_step": self._step}
        )
        if blocked:
            return _Outcome(
                applied=True, reward=BLOCKED_ESCALATION_REWARD, terminated=True, failure_reason="user_blocked"
            )
        return _Outcome(applied=True, reward=WRONG_ESCALATION_REWARD, terminated=True, failure_reason="escalated")

    # ------------------------------------------------------------------------------- observation
    def _read(self, error: dict[str, Any] | None) -> dict[str, Any]:
        """One SELECT of scalar subqueries: the rows this client can see."""
        product_id = None if self._c.product_idx is None else self._product_ids[self._c.product_idx]
        row = self.db.execute(
            _READ_OBS,
            {
                "b_user": self._user_id,
                "b_cart": self._cart_id,
                "b_session": self._c.session_id,
                "b_product": product_id,
                "b_catalog": self._product_ids[0],
                "b_order": self._c.order_id,
                "b_payment": self._c.payment_id,
                "b_ticket": self._c.ticket_id,
            },
        ).fetchone()
        row = _ObsRow._make(row)
        seen = self._c.user_seen
        balance = float(row.user_balance) if seen else None
        attempts = int(row.payment_attempts) if self._c.order_id is not None else 0
        # What the customer owes: the pending order, else the cart (at least one unit) at their price.
        unit = round(float(row.catalog_price) * self._discount, 2)
        due = float(row.order_total) if row.order_status == "pending" else unit * max(int(row.cart_items), 1)
        return {
            "session": {"status": row.session_status, "active": int(row.session_status == "active")},
            "user": {
                "tier": row.user_tier if seen else None,
                "status": row.user_status if seen else None,
                "balance": balance,
                "vip": int(seen and row.user_tier == "vip"),
            },
            "wallet": {"balance_ratio": None if balance is None else round(balance / due, 4)},
            "cart": {"items": int(row.cart_items)},
            "product": {"id": product_id, "stock": row.product_stock, "price": row.product_price},
            "catalog": {"price": float(row.catalog_price)},
            "order": {"id": self._c.order_id, "status": row.order_status, "total": row.order_total},
            "payment": {
                "status": row.payment_status,
                "code": row.payment_code,
                "card": row.payment_card,
                "open": int(row.payment_status == "initiated"),
                "attempts": attempts,
            },
            "client": {"retries": self._retries},
            "topup": {"amount": row.topup_amount},
            "ticket": {"reason": row.ticket_reason},
            "error": error or _error_row(None),
            "sim_time_s": round(self._sim_time, 6),
            "step": self._step,
        }

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


def _raw(**parts: Mapping[str, Any]) -> dict[str, Any]:
    obs = _blank_obs()
    for key, values in parts.items():
        obs[key] = {**obs[key], **values}
    return obs


_ACTIVE = {"status": "active", "active": 1}
_PENDING = {"id": 1, "status": "pending", "total": 100.0}
# Every raw state the channel produces, with the token it means (input of the mapping audit).
RAW_STATES: list[tuple[dict[str, Any], str]] = [
    (_raw(), "LOGGED_OUT"),
    (_raw(session=_ACTIVE), "LOGGED_IN"),
    (_raw(session=_ACTIVE), "CART_EMPTY"),
    (_raw(session=_ACTIVE, user={"tier": "vip", "status": "active", "balance": 500.0, "vip": 1}), "VIP_USER"),
    (_raw(user={"tier": "standard", "status": "blocked", "balance": 500.0}), "USER_BLOCKED"),
    (_raw(session={"status": "expired", "active": 0}), "SESSION_EXPIRED"),
    (_raw(session={"status": "expired", "active": 0}), "LOGGED_OUT"),
    (_raw(session=_ACTIVE, product={"id": 1, "stock": 20, "price": 100.0}), "PRODUCT_VIEWED"),
    (_raw(session=_ACTIVE, product={"id": 1, "stock": 0, "price": 100.0}), "OUT_OF_STOCK"),
    (
        _raw(
            session=_ACTIVE,
            product={"id": 1, "stock": 0, "price": 100.0},
            error={
                "kind": "constraint",
                "constraint": "ck_inventory_stock_nonneg",
                "message": "CHECK constraint failed",
            },
        ),
        "OUT_OF_STOCK",
    ),
    (_raw(session=_ACTIVE, cart={"items": 2}), "CART_FILLED"),
    (
        _raw(
            session=_ACTIVE, error={"kind": "constraint", "constraint": "ck_orders_total_positive", "message": "CHECK"}
        ),
        "CART_EMPTY",
    ),
    (_raw(session=_ACTIVE, cart={"items": 1}, order=_PENDING), "CHECKOUT_STARTED"),
    (_raw(session=_ACTIVE, cart={"items": 1}, order=_PENDING), "ORDER_PENDING"),
    (
        _raw(
            session=_ACTIVE,
            cart={"items": 1},
            order=_PENDING,
            error={"kind": "constraint", "constraint": "uq_orders_one_pending", "message": "UNIQUE"},
        ),
        "ORDER_PENDING",
    ),
    (_raw(session=_ACTIVE, order=_PENDING, payment={"status": "initiated", "open": 1, "attempts": 1}), "PAYMENT_PAGE"),
    (
        _raw(
            session=_ACTIVE,
            order={"id": 1, "status": "paid", "total": 100.0},
            payment={"status": "captured", "code": CODE_APPROVED, "attempts": 1},
        ),
        "PAYMENT_SUCCESS",
    ),
    (
        _raw(session=_ACTIVE, order=_PENDING, payment={"status": "declined", "code": CODE_DECLINED, "attempts": 1}),
        "INVALID_CARD",
    ),
    (
        _raw(
            session=_ACTIVE, order=_PENDING, payment={"status": "insufficient_funds", "code": CODE_NSF, "attempts": 1}
        ),
        "INSUFFICIENT_FUNDS",
    ),
    (
        _raw(session=_ACTIVE, order=_PENDING, payment={"status": "error", "code": CODE_MALFUNCTION, "attempts": 1}),
        "PAYMENT_FAILED",
    ),
    (
        _raw(
            session=_ACTIVE,
            order=_PENDING,
            payment={"status": "initiated", "open": 1, "attempts": 2},
            topup={"amount": 50.0},
        ),
        "FUNDS_TOPPED_UP",
    ),
    (_raw(error={"kind": "network_timeout", "message": "no response"}), "NETWORK_TIMEOUT"),
    (_raw(error={"kind": "query_timeout", "message": "statement cancelled"}), "NETWORK_TIMEOUT"),
    (_raw(error={"kind": "lock_timeout", "message": "database is locked"}), "SERVER_ERROR"),
    (_raw(error={"kind": "db_error", "message": "disk I/O error"}), "SERVER_ERROR"),
    (_raw(session=_ACTIVE, order={"id": 1, "status": "cancelled", "total": 100.0}), "ORDER_CANCELLED"),
    (_raw(session=_ACTIVE, cart={"items": 1}, order={"id": 1, "status": "expired", "total": 100.0}), "ORDER_EXPIRED"),
    (_raw(session=_ACTIVE, ticket={"reason": "manual"}), "ESCALATED"),
]
