"""The operator's panel: what a shop's operator sees of the session, appended to every store page.

The order's value (Oscar's basket total; before the basket is filled, the customer's intended order at
the catalogue price), the customer (new or returning, the card type on file) and the payment provider's
counters (attempts, consecutive gateway errors, declines, route, backup card, 3-D Secure). Only visible
variables: the hidden causes (patience, an outage, a card that will be declined) never reach a page.
"""

from __future__ import annotations

from collections.abc import Callable
from decimal import Decimal

from django import http
from django.utils.html import format_html, format_html_join

from agentflow_oscar.checkout_v2.world import world

ORDER_QUANTITY = 5  # the customer's order: five of the featured product
FEATURED_UPC = "AF-001"


def order_value(request: http.HttpRequest) -> Decimal:
    """Oscar's basket total, or the intended order at the catalogue price while the basket is empty."""
    from oscar.apps.partner.models import StockRecord

    basket = getattr(request, "basket", None)
    if basket is not None and basket.num_items:
        return Decimal(basket.total_incl_tax)
    record = StockRecord.objects.filter(partner_sku=FEATURED_UPC).first()
    return Decimal(record.price) * ORDER_QUANTITY if record is not None else Decimal(0)


class OperatorPanelMiddleware:
    """Appends the operator's panel to the store's HTML pages."""

    def __init__(self, get_response: Callable[[http.HttpRequest], http.HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: http.HttpRequest) -> http.HttpResponse:
        """The page, with the panel before ``</body>``."""
        response = self.get_response(request)
        if (
            response.status_code != 200
            or not response.get("Content-Type", "").startswith("text/html")
            or request.path.startswith("/__agentflow__/")
            or getattr(response, "streaming", False)
        ):
            return response
        if hasattr(response, "render") and not response.is_rendered:
            response.render()
        shown = {"order_value": f"{order_value(request):.2f}", **world().panel()}
        attributes = format_html_join(" ", 'data-{}="{}"', ((k.replace("_", "-"), v) for k, v in shown.items()))
        rows = format_html_join("", "<dt>{}</dt><dd>{}</dd>", ((k.replace("_", " "), v) for k, v in shown.items()))
        panel = format_html('<aside id="operator-panel" {}><dl>{}</dl></aside>', attributes, rows)
        response.content = response.content.replace(b"</body>", panel.encode() + b"</body>", 1)
        response["Content-Length"] = str(len(response.content))
        return response
