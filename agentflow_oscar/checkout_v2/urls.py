"""The checkout_v2 store's URLs: our checkout pages and control endpoints, then Oscar's storefront."""

from __future__ import annotations

from django.apps import apps
from django.urls import include, path

from agentflow_oscar.checkout_v2 import control, views

urlpatterns = [
    path("__agentflow__/reset/", control.reset, name="agentflow-reset"),
    path("__agentflow__/order/", control.order, name="agentflow-order"),
    path("checkout/address-check/", views.AddressCheckView.as_view(), name="agentflow-address-check"),
    path("checkout/stock-check/", views.StockCheckView.as_view(), name="agentflow-stock-check"),
    path("checkout/voucher/", views.VoucherView.as_view(), name="agentflow-voucher"),
    path("checkout/bank-transfer/", views.BankTransferView.as_view(), name="agentflow-bank-transfer"),
    path("checkout/confirm/", views.ConfirmOrderView.as_view(), name="agentflow-confirm"),
    path("checkout/confirmed/", views.EndView.as_view(heading="Order confirmed"), name="agentflow-confirmed"),
    path("checkout/handed-over/", views.EndView.as_view(heading="Handed over to support"), name="agentflow-support"),
    path("checkout/abandoned/", views.EndView.as_view(heading="The customer left"), name="agentflow-abandoned"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include(apps.get_app_config("oscar").urls[0])),
]
