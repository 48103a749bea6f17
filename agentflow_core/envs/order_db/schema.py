"""The shop schema: tables whose constraints carry the business rules, the engine factory, and the
constraint names a DBAPI error reports."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

# SQLAlchemy imports a dialect on the first create_engine: imported with this module, not inside the first timed reset
import sqlalchemy.dialects.sqlite  # noqa: F401
from sqlalchemy import (
    CheckConstraint,
    Column,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    create_engine,
    event,
)
from sqlalchemy.pool import StaticPool

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
    elif url.startswith("postgresql"):
        # A row another client holds locked fails the statement after the query timeout (an error row,
        # like SQLite's "database is locked") instead of blocking the env.
        lock_ms = int(QUERY_TIMEOUT_S * 1000)
        engine = create_engine(url, connect_args={"options": f"-c lock_timeout={lock_ms}"})
    else:
        engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
    return engine


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
