"""Loopback control endpoints of the checkout_v2 store: reset to a scenario and seed, read the outcome.

``reset`` restores the template database, sets what the scenario changes in Oscar (the featured
product's price from ``order_value``, whether the customer has an account and a saved address, the
voucher) and draws the episode's world (:mod:`.world`) from the scenario and the posted ``seed``.
``order`` reads the customer's order back from Oscar's tables and checks it, with the world's outcome
and business value.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from agentflow_oscar import control as base_control
from agentflow_oscar import store
from agentflow_oscar.checkout_v2.panel import FEATURED_UPC, ORDER_QUANTITY
from agentflow_oscar.checkout_v2.views import VOUCHER_CODE
from agentflow_oscar.checkout_v2.world import world

VOUCHER_OFF = Decimal("10.00")  # the voucher's value: the machine's APPLY_VOUCHER cost


@csrf_exempt
@transaction.non_atomic_requests
@require_POST
def reset(request: HttpRequest) -> HttpResponse:
    """Restore the template, apply the posted scenario in Oscar, draw the world with the posted seed."""
    body = base_control.posted_object(request)
    if isinstance(body, HttpResponse):
        return body
    seed = body.pop("seed", None)
    with base_control._lock, world().lock:
        store.restore(base_control._state["template"], base_control._state["live_db"])
        with transaction.atomic():
            apply_scenario(body)
        world().reset(body, None if seed is None else int(seed))
        base_control._state["scenario"] = body
    return JsonResponse({"reset": True})


def apply_scenario(scenario: dict[str, Any]) -> None:
    """The featured product priced so that the customer's order is ``order_value``; the account; the voucher."""
    from django.contrib.auth import get_user_model
    from oscar.apps.address.models import Country, UserAddress
    from oscar.apps.partner.models import StockRecord

    data = store.catalogue()
    unit = (Decimal(str(scenario.get("order_value", 120.0))) / ORDER_QUANTITY).quantize(store.CENT)
    StockRecord.objects.filter(partner_sku=FEATURED_UPC).update(price=unit, num_in_stock=100)
    users = get_user_model().objects.filter(email=data["customer"]["email"])
    if scenario.get("customer") == "new":
        users.delete()  # a new customer has no account
    else:
        address = data["shipping_address"]
        country = Country.objects.get(iso_3166_1_a2=data["country"]["code"])
        for user in users:
            UserAddress.objects.create(user=user, country=country, **address)
    _create_voucher()


def _create_voucher() -> None:
    from django.utils import timezone
    from oscar.apps.offer.models import Benefit, Condition, ConditionalOffer, Range
    from oscar.apps.voucher.models import Voucher

    everything = Range.objects.get_or_create(name="Everything", defaults={"includes_all_products": True})[0]
    benefit = Benefit.objects.create(range=everything, type=Benefit.FIXED, value=VOUCHER_OFF)
    condition = Condition.objects.create(range=everything, type=Condition.COUNT, value=1)
    offer = ConditionalOffer.objects.create(
        name="Welcome voucher", offer_type=ConditionalOffer.VOUCHER, benefit=benefit, condition=condition
    )
    now = timezone.now()
    voucher = Voucher.objects.create(
        name="Welcome voucher",
        code=VOUCHER_CODE,
        start_datetime=now - timedelta(days=1),
        end_datetime=now + timedelta(days=3650),
    )
    voucher.offers.add(offer)


@require_GET
def order(request: HttpRequest) -> HttpResponse:
    """The last order from Oscar's tables, checked; the world's outcome and business value."""
    refused = base_control._refused(request)
    if refused is not None:
        return refused
    return JsonResponse({**placed_order(), "outcome": world().outcome, "business_value": world().business_value})


def placed_order() -> dict[str, Any]:
    """The last order: ``verified`` when it is confirmed, its total is its lines less discounts plus shipping,
    and its stock was allocated."""
    from oscar.apps.order.models import Order
    from oscar.apps.partner.models import StockRecord

    placed = Order.objects.order_by("-id").first()
    if placed is None:
        return {"orders": 0, "verified": 0}
    lines = list(placed.lines.all())
    discounts = sum((d.amount for d in placed.discounts.all()), Decimal("0"))
    expected = sum((line.line_price_before_discounts_incl_tax for line in lines), Decimal("0"))
    expected = expected - discounts + Decimal(placed.shipping_incl_tax)
    allocated = all(StockRecord.objects.get(partner_sku=line.upc).num_allocated >= line.quantity for line in lines)
    verified = bool(lines) and placed.status == "Confirmed" and Decimal(placed.total_incl_tax) == expected
    return {
        "orders": Order.objects.count(),
        "number": placed.number,
        "status": placed.status,
        "lines": [{"upc": line.upc, "quantity": line.quantity} for line in lines],
        "total_incl_tax": str(placed.total_incl_tax),
        "expected_total": str(expected),
        "sources": [source.source_type.name for source in placed.sources.all()],
        "verified": int(verified and allocated),
    }
