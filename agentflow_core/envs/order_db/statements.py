"""The channel's SQL, written once in SQLAlchemy Core and compiled once per dialect, and the driver
that runs it on the DBAPI cursor (the env's hot path)."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

from sqlalchemy import (
    Connection,
    and_,
    bindparam,
    delete,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.engine.interfaces import Dialect
from sqlalchemy.sql.elements import ReleaseSavepointClause, RollbackToSavepointClause, SavepointClause
from sqlalchemy.sql.expression import BindParameter, ClauseElement

from agentflow_core.envs.order_db.schema import (
    cart_items,
    inventory,
    orders,
    payments,
    products,
    sessions,
    tickets,
    topups,
    users,
)

# ------------------------------------------------------------------------ compiled statements
# Built once as SQLAlchemy Core, compiled once per dialect by :class:`Driver`, so a step only binds parameters.
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
READ_OBS = select(
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


class ObsRow(NamedTuple):
    """One row of ``READ_OBS``, field for column (``test_env_db`` checks the two agree)."""

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


SESSION_STATUS = select(sessions.c.status).where(sessions.c.id == bindparam("b_session"))
USER_STATUS = select(users.c.status).where(users.c.id == bindparam("b_user"))
INSERT_SESSION = insert(sessions).values(
    user_id=bindparam("b_user"), token=bindparam("b_token"), created_step=bindparam("b_step"), status="active"
)
EXPIRE_SESSION = (
    update(sessions)
    .where(and_(sessions.c.id == bindparam("b_session"), sessions.c.status == "active"))
    .values(status="expired")
)
RESERVE_STOCK = (
    update(inventory).where(inventory.c.product_id == bindparam("b_product")).values(stock=inventory.c.stock - 1)
)
ADD_QTY = (
    update(cart_items)
    .where(and_(cart_items.c.cart_id == bindparam("b_cart"), cart_items.c.product_id == bindparam("b_product")))
    .values(qty=cart_items.c.qty + 1)
)
INSERT_ITEM = insert(cart_items).values(cart_id=bindparam("b_cart"), product_id=bindparam("b_product"), qty=1)
CART_LINES = select(cart_items.c.product_id, cart_items.c.qty).where(cart_items.c.cart_id == bindparam("b_cart"))
RELEASE_STOCK = (
    update(inventory)
    .where(inventory.c.product_id == bindparam("b_product"))
    .values(stock=inventory.c.stock + bindparam("b_qty"))
)
EMPTY_CART = delete(cart_items).where(cart_items.c.cart_id == bindparam("b_cart"))
CART_SUBTOTAL = (
    select(func.coalesce(func.sum(cart_items.c.qty * products.c.price), 0.0))
    .select_from(cart_items.join(products, cart_items.c.product_id == products.c.id))
    .where(cart_items.c.cart_id == bindparam("b_cart"))
)
INSERT_ORDER = insert(orders).values(
    user_id=bindparam("b_user"), status="pending", total=bindparam("b_total"), created_step=bindparam("b_step")
)
ORDER_ROW = select(orders.c.status, orders.c.total).where(orders.c.id == bindparam("b_order"))
SET_ORDER_STATUS = (
    update(orders)
    .where(and_(orders.c.id == bindparam("b_order"), orders.c.status == bindparam("b_from")))
    .values(status=bindparam("b_to"))
)
# ``status = a OR status = b`` rather than ``IN (a, b)``: an IN list is an "expanding" parameter that
# SQLAlchemy renders only at execution time, so it could not be compiled once ahead of it.
CANCEL_ORDER = (
    update(orders)
    .where(and_(orders.c.id == bindparam("b_order"), or_(orders.c.status == "pending", orders.c.status == "expired")))
    .values(status="cancelled")
)
INSERT_PAYMENT = insert(payments).values(
    order_id=bindparam("b_order"),
    card=bindparam("b_card"),
    amount=bindparam("b_amount"),
    status="initiated",
    attempt=select(func.coalesce(func.max(payments.c.attempt), 0) + 1)
    .where(payments.c.order_id == bindparam("b_order"))
    .scalar_subquery(),
)
PAYMENT_ROW = select(payments.c.status, payments.c.amount).where(payments.c.id == bindparam("b_payment"))
SET_PAYMENT = (
    update(payments)
    .where(and_(payments.c.id == bindparam("b_payment"), payments.c.status == "initiated"))
    .values(status=bindparam("b_status"), code=bindparam("b_code"))
)
DEBIT = (
    update(users)
    .where(and_(users.c.id == bindparam("b_user"), users.c.balance >= bindparam("b_amount")))
    .values(balance=users.c.balance - bindparam("b_amount"))
)
USER_BALANCE = select(users.c.balance).where(users.c.id == bindparam("b_user"))
VIEWED_STOCK = select(inventory.c.stock).where(inventory.c.product_id == bindparam("b_product"))
CREDIT = update(users).where(users.c.id == bindparam("b_user")).values(balance=users.c.balance + bindparam("b_amount"))
INSERT_TOPUP = insert(topups).values(
    user_id=bindparam("b_user"), payment_id=bindparam("b_payment"), amount=bindparam("b_amount")
)
INSERT_TICKET = insert(tickets).values(
    user_id=bindparam("b_user"), reason=bindparam("b_reason"), created_step=bindparam("b_step")
)


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


class Driver:
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
        """Close the cursor (the connection and its transaction belong to the env)."""
        self._cursor.close()
