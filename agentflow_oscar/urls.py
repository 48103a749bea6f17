"""Oscar's storefront URLs plus the loopback control endpoints (:mod:`agentflow_oscar.control`)."""

from __future__ import annotations

from django.apps import apps
from django.urls import include, path

from agentflow_oscar import control

urlpatterns = [
    path("__agentflow__/reset/", control.reset, name="agentflow-reset"),
    path("__agentflow__/order/", control.order, name="agentflow-order"),
    path("i18n/", include("django.conf.urls.i18n")),
    path("", include(apps.get_app_config("oscar").urls[0])),
]
