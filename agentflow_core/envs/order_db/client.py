"""The client's side of one order-db episode: the row handles it holds and the rows it reads back.

Every statement crosses a simulated link first (:func:`round_trip`). The app keeps row ids the way a web app keeps a session token (:class:`Client`); after every op it
reads one row of scalar subqueries (:func:`read_rows`) into the raw observation the mapping reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from agentflow_core.envs.order_db import statements as sql
from agentflow_core.envs.order_db.raw_states import _error_row
from agentflow_core.envs.order_db.schema import QUERY_TIMEOUT_S


class Keys(NamedTuple):
    """This env's seeded rows: the customer, the cart and the catalog."""

    user_id: int
    cart_id: int
    product_ids: tuple[int, ...]


@dataclass
class Client:
    """The client-side handles of one episode (row ids, as an app keeps its session token)."""

    session_id: int | None = None
    session_step: int = 0
    user_seen: bool = False
    product_idx: int | None = None
    product_shown: bool = False  # the last op showed the product (the app's product page is open)
    order_id: int | None = None
    order_step: int = 0
    payment_id: int | None = None
    card: str = "primary"
    ticket_id: int | None = None


def read_rows(
    db: sql.Driver,
    c: Client,
    keys: Keys,
    discount: float,
    retries: int,
    error: dict[str, Any] | None,
    clock: tuple[float, int],
) -> dict[str, Any]:
    """The raw observation: what client ``c`` can see of its rows, ``error`` of the last op, ``clock`` (sim s, step)."""
    product_id = None if c.product_idx is None else keys.product_ids[c.product_idx]
    row = db.execute(
        sql.READ_OBS,
        {
            "b_user": keys.user_id,
            "b_cart": keys.cart_id,
            "b_session": c.session_id,
            "b_product": product_id,
            "b_catalog": keys.product_ids[0],
            "b_order": c.order_id,
            "b_payment": c.payment_id,
            "b_ticket": c.ticket_id,
        },
    ).fetchone()
    row = sql.ObsRow._make(row)
    seen = c.user_seen
    balance = float(row.user_balance) if seen else None
    attempts = int(row.payment_attempts) if c.order_id is not None else 0
    # What the customer owes: the pending order, else the cart (at least one unit) at their price.
    unit = round(float(row.catalog_price) * discount, 2)
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
        "product": {
            "id": product_id,
            "stock": row.product_stock,
            "price": row.product_price,
            "shown": int(c.product_shown),
        },
        "catalog": {"price": float(row.catalog_price)},
        "order": {"id": c.order_id, "status": row.order_status, "total": row.order_total},
        "payment": {
            "status": row.payment_status,
            "code": row.payment_code,
            "card": row.payment_card,
            "open": int(row.payment_status == "initiated"),
            "attempts": attempts,
        },
        "client": {"retries": retries},
        "topup": {"amount": row.topup_amount},
        "ticket": {"reason": row.ticket_reason},
        "error": error or _error_row(None),
        "sim_time_s": clock[0],
        "step": clock[1],
    }


def round_trip(
    rng: np.random.Generator, latency: float, jitter: float, drop_rate: float
) -> tuple[float, dict[str, Any] | None]:
    """One round trip over the link: (simulated seconds it took, the error row when the statement was lost)."""
    dropped = rng.random() < drop_rate
    took = latency + float(rng.exponential(jitter))
    if dropped:
        return QUERY_TIMEOUT_S, _error_row("network_timeout", "no response from database")
    if took > QUERY_TIMEOUT_S:
        return QUERY_TIMEOUT_S, _error_row(
            "query_timeout", f"statement cancelled after {QUERY_TIMEOUT_S:.1f}s (latency {took:.3f}s)"
        )
    return took, None
