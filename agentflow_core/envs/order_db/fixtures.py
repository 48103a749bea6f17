"""Seed rows: the process-wide template database each env clones, and the rows a scenario puts in it."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Connection,
    CursorResult,
    bindparam,
    delete,
    insert,
    select,
    update,
)

from agentflow_core.envs.base import (
    Scenario,
)
from agentflow_core.envs.order_db.schema import (
    ALT_PRODUCT_STOCK,
    BASE_PRICE,
    N_PRODUCTS,
    carts,
    inventory,
    make_engine,
    metadata,
    products,
    users,
)
from agentflow_core.envs.order_db.statements import Driver


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


def _new_id(result: CursorResult[Any]) -> int:
    key = result.inserted_primary_key
    if key is None:
        raise RuntimeError("INSERT returned no primary key")
    return int(key[0])


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


def _delete_seed_rows(conn: Connection, user_id: int, cart_id: int, product_ids: Sequence[int]) -> None:
    """Remove one env's committed rows from a shared database (episodes roll back; only these persist)."""
    conn.execute(delete(inventory).where(inventory.c.product_id.in_(list(product_ids))))
    conn.execute(delete(products).where(products.c.id.in_(list(product_ids))))
    conn.execute(delete(carts).where(carts.c.id == cart_id))
    conn.execute(delete(users).where(users.c.id == user_id))


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


def _align_seed_rows(db: Driver, scenario: Scenario, env_id: str, user_id: int, product_ids: Sequence[int]) -> None:
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
