"""The checkout_v2 store's views: Oscar's own checkout views, subclassed where a shop plugs in its services.

Oscar does what Oscar has: the basket (add to basket, drop part of a line), the checkout gateway (guest
checkout or sign-in; a new customer has no account), the shipping-address form (or a returning
customer's saved address), the shipping methods of the repository (:mod:`.shipping`), vouchers applied
to the basket, the order preview, ``handle_payment`` and order placement, the thank-you page and the
order status pipeline (``Pending`` -> ``Confirmed``). Our pages are what a real shop adds between them:
an address check, a warehouse stock check, a voucher step, a review page, the payment provider's
controls on the preview (3-D Secure, wait, switch route, backup card, bank transfer, support), and the
end pages. Each customer interaction is one action of the world (:mod:`.world`): its services' answers
are shown as Oscar shows them (flash messages, the payment error of ``UnableToTakePayment``), and the
customer is sent to the page of the stage the world is at.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django import http
from django.contrib import messages
from django.shortcuts import redirect
from django.views import generic
from oscar.apps.basket.views import BasketAddView as OscarBasketAddView
from oscar.apps.checkout import views as oscar_views
from oscar.apps.checkout.session import CheckoutSessionMixin
from oscar.apps.order.models import Order
from oscar.apps.payment.exceptions import UnableToTakePayment
from oscar.apps.payment.models import Source, SourceType

from agentflow_oscar.checkout_v2.world import MESSAGES, world

VOUCHER_CODE = "WELCOME10"
PROVIDER_ACTIONS = {
    "verify_3ds": "VERIFY_3DS",
    "wait": "WAIT",
    "switch_route": "SWITCH_ROUTE",
    "use_backup_card": "USE_BACKUP_CARD",
    "bank_transfer": "BANK_TRANSFER",
    "escalate": "ESCALATE",
}


def _answer(request: http.HttpRequest, action: str) -> http.HttpResponse:
    """Run ``action`` in the world, flash the outside's answer, send the customer where the world is."""
    with world().lock:
        reason = world().act(action)
    if reason is not None:
        messages.error(request, MESSAGES.get(reason, reason.replace("_", " ").capitalize() + "."))
    return redirect(world().next_page())


class BasketAddView(OscarBasketAddView):
    """Oscar's add-to-basket; the customer's order goes into the basket (``ADD_TO_CART``)."""

    def form_valid(self, form: Any) -> http.HttpResponse:
        """Oscar adds the line; the world records the interaction; the customer sees the basket."""
        super().form_valid(form)
        with world().lock:
            world().act("ADD_TO_CART")
        return redirect(world().next_page())


class IndexView(oscar_views.IndexView):
    """Oscar's checkout gateway: checkout as a guest or sign in (``CHECKOUT``, ``GUEST_CHECKOUT``, ``SIGN_IN``)."""

    def get(self, request: http.HttpRequest, *args: Any, **kwargs: Any) -> http.HttpResponse:
        """Proceeding from the basket starts the checkout."""
        if world().stage() == 1 and world().outcome is None:
            with world().lock:
                world().act("CHECKOUT")
            if world().outcome is not None:
                return redirect(world().next_page())
        return super().get(request, *args, **kwargs)

    def get_form(self, form_class: Any = None) -> Any:
        """Oscar's gateway form without the browser's ``required`` check (a guest leaves the password empty)."""
        form = super().get_form(form_class)
        form.use_required_attribute = False
        return form

    def form_valid(self, form: Any) -> http.HttpResponse:
        """Oscar signs the customer in or records the guest's email."""
        super().form_valid(form)
        return _answer(self.request, "GUEST_CHECKOUT" if form.is_guest_checkout() else "SIGN_IN")

    def form_invalid(self, form: Any) -> http.HttpResponse:
        """A failed sign-in (a new customer has no account) is still an interaction."""
        with world().lock:
            world().act("SIGN_IN")
        return super().form_invalid(form)


class ShippingAddressView(oscar_views.ShippingAddressView):
    """Oscar's shipping-address form (or a saved address); the address then goes to verification."""

    def get_success_url(self) -> str:
        """After Oscar stored the address (``ENTER_ADDRESS``)."""
        with world().lock:
            world().act("ENTER_ADDRESS")
        return world().next_page()


class ShippingMethodView(oscar_views.ShippingMethodView):
    """Oscar's shipping-method choice over the repository's standard and express methods."""

    def form_valid(self, form: Any) -> http.HttpResponse:
        """Oscar stores the method in the checkout session."""
        super().form_valid(form)
        code = form.cleaned_data["method_code"]
        return _answer(self.request, "CHOOSE_EXPRESS" if code == "express" else "CHOOSE_STANDARD")


class PaymentMethodView(oscar_views.PaymentMethodView):
    """The review of the order before payment (Oscar's payment-method step, rendered instead of skipped)."""

    template_name = "agentflow/review.html"

    def get(self, request: http.HttpRequest, *args: Any, **kwargs: Any) -> http.HttpResponse:
        """Show the basket, address and shipping method to review."""
        return generic.TemplateView.get(self, request, *args, **kwargs)

    def post(self, request: http.HttpRequest, *args: Any, **kwargs: Any) -> http.HttpResponse:
        """``REVIEW_ORDER``: on to the payment details."""
        return _answer(request, "REVIEW_ORDER")


class PaymentDetailsView(oscar_views.PaymentDetailsView):
    """Oscar's payment details, preview and order placement, with the payment provider plugged in.

    ``handle_payment`` asks the provider to charge the card (``SUBMIT_PAYMENT``); a refusal raises Oscar's
    ``UnableToTakePayment`` with the provider's message, which Oscar shows on the preview. The provider's
    other controls post to the preview with their ``action``.
    """

    def post(self, request: http.HttpRequest, *args: Any, **kwargs: Any) -> http.HttpResponse:
        """Place the order, run a provider control, confirm a transfer, or enter the card (``ENTER_PAYMENT``)."""
        action = request.POST.get("action", "")
        if action in PROVIDER_ACTIONS:
            return _answer(request, PROVIDER_ACTIONS[action])
        if action == "confirm_transfer":
            with world().lock:
                reason = world().act("CONFIRM_TRANSFER")
            if reason is None and world().stage() == 11 and world().outcome is None:
                return self.handle_place_order_submission(request)
            if reason is not None:
                messages.error(request, MESSAGES.get(reason, reason))
            return redirect(world().next_page())
        if action == "place_order":
            return self.handle_place_order_submission(request)
        return _answer(request, "ENTER_PAYMENT")

    def handle_payment(self, order_number: str, total: Any, **kwargs: Any) -> None:
        """Charge through the provider (a transfer already arrived: record it); refusals are Oscar's exceptions."""
        if world().stage() == 11:
            name, reference = "Bank transfer", f"transfer-{order_number}"
        else:
            with world().lock:
                reason = world().act("SUBMIT_PAYMENT")
            if reason is not None or world().outcome is not None:
                raise UnableToTakePayment(MESSAGES.get(reason or "", "The customer left."))
            name = "Sandbox card (backup)" if world().values["using_backup"] else "Sandbox card"
            reference = f"card-{order_number}"
        source_type, _ = SourceType.objects.get_or_create(name=name)
        amount = Decimal(total.incl_tax)
        self.add_payment_source(Source(source_type=source_type, amount_allocated=amount, reference=reference))
        self.add_payment_event("Settled", amount)

    def render_payment_details(self, request: http.HttpRequest, **kwargs: Any) -> http.HttpResponse:
        """A refused payment is shown on the preview, where the customer pays (or the end page when they left)."""
        if world().outcome is not None:
            return redirect(world().next_page())
        return self.render_preview(request, **kwargs)

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        """Oscar's context plus what the provider's controls need."""
        context = super().get_context_data(**kwargs)
        context["provider"] = world().panel()
        return context


class ThankYouView(oscar_views.ThankYouView):
    """Oscar's thank-you page (the order is placed and paid); it offers the order's confirmation."""


class StageView(CheckoutSessionMixin, generic.TemplateView):
    """One of our checkout pages; a POST's ``action`` is one world action among ``actions``."""

    actions: dict[str, str] = {}

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        """The world's visible state for the template."""
        context = super().get_context_data(**kwargs)
        context["panel"] = world().panel()
        context["values"] = {k: int(world().values[k]) for k in ("addr_flag", "partial_flag")}
        context["voucher_code"] = VOUCHER_CODE
        return context

    def post(self, request: http.HttpRequest, *args: Any, **kwargs: Any) -> http.HttpResponse:
        """Run the posted action (unknown: 400)."""
        action = self.actions.get(request.POST.get("action", ""))
        if action is None:
            return http.HttpResponseBadRequest()
        self.before(action)
        return _answer(request, action)

    def before(self, action: str) -> None:
        """Oscar's part of an action, before the world's (none by default)."""


class AddressCheckView(StageView):
    """The address-verification service's step (``CHECK_ADDRESS``, ``FIX_ADDRESS``)."""

    template_name = "agentflow/address_check.html"
    actions = {"check": "CHECK_ADDRESS", "fix": "FIX_ADDRESS"}


class StockCheckView(StageView):
    """The warehouse's stock check (``CHECK_STOCK``); on a partial stock split the shipment or drop the rest."""

    template_name = "agentflow/stock_check.html"
    actions = {"check": "CHECK_STOCK", "split": "SPLIT_SHIPMENT", "drop": "DROP_ITEM"}

    def before(self, action: str) -> None:
        """Dropping the part not in stock: Oscar's basket line keeps 60% of its quantity."""
        if action == "DROP_ITEM" and world().values["partial_flag"]:
            for line in self.request.basket.all_lines():
                line.quantity = max(1, (line.quantity * 3) // 5)
                line.save()


class VoucherView(StageView):
    """The customer's voucher, applied to Oscar's basket (``APPLY_VOUCHER``), or not (``SKIP_VOUCHER``)."""

    template_name = "agentflow/voucher.html"
    actions = {"apply": "APPLY_VOUCHER", "skip": "SKIP_VOUCHER"}

    def before(self, action: str) -> None:
        """Oscar's voucher on the basket (its offer applies on the next basket load)."""
        from oscar.apps.voucher.models import Voucher

        if action == "APPLY_VOUCHER" and world().panel()["has_voucher"]:
            self.request.basket.vouchers.add(Voucher.objects.get(code=VOUCHER_CODE))


class BankTransferView(StageView):
    """The bank transfer awaiting its arrival (confirmed through the payment view, which places the order)."""

    template_name = "agentflow/bank_transfer.html"


class ConfirmOrderView(generic.View):
    """``CONFIRM_ORDER``: the placed order moves along Oscar's status pipeline to ``Confirmed``."""

    def post(self, request: http.HttpRequest, *args: Any, **kwargs: Any) -> http.HttpResponse:
        """Confirm the customer's order in Oscar's tables, then the world's."""
        order = Order.objects.order_by("-id").first()
        if order is not None and world().stage() == 11:
            order.set_status("Confirmed")
        return _answer(request, "CONFIRM_ORDER")


class EndView(generic.TemplateView):
    """An end page: the order confirmed, handed over to support, or the customer gone."""

    template_name = "agentflow/end.html"
    heading = ""

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        """The heading and the visible state."""
        context = super().get_context_data(**kwargs)
        context["heading"], context["panel"] = self.heading, world().panel()
        return context
