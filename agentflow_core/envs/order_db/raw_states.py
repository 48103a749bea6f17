"""The raw observation: its blank form, and every raw state the channel produces with the token it means
(the input of the mapping audit)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflow_core.envs.order_db.schema import CODE_APPROVED, CODE_DECLINED, CODE_MALFUNCTION, CODE_NSF


def _error_row(kind: str | None, message: str | None = None, constraint: str | None = None) -> dict[str, Any]:
    return {"kind": kind, "constraint": constraint, "message": message}


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
    (_raw(session=_ACTIVE, product={"id": 1, "stock": 20, "price": 100.0, "shown": 1}), "PRODUCT_VIEWED"),
    (_raw(session=_ACTIVE, product={"id": 1, "stock": 0, "price": 100.0, "shown": 1}), "OUT_OF_STOCK"),
    (
        _raw(
            session=_ACTIVE,
            product={"id": 1, "stock": 0, "price": 100.0, "shown": 1},
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
