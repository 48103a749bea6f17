"""Oscar's dynamic class loader (``OSCAR_DYNAMIC_CLASS_LOADER``), pointing a few of Oscar's classes at ours.

Oscar loads its views and the shipping repository through ``get_class``, so a project can replace them
without forking the apps; this loader answers with the checkout_v2 store's subclasses for the names in
``OVERRIDES`` and with Oscar's own classes for everything else.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string
from oscar.core.loading import default_class_loader

OVERRIDES = {
    ("shipping.repository", "Repository"): "agentflow_oscar.checkout_v2.shipping.Repository",
    ("basket.views", "BasketAddView"): "agentflow_oscar.checkout_v2.views.BasketAddView",
    ("checkout.views", "IndexView"): "agentflow_oscar.checkout_v2.views.IndexView",
    ("checkout.views", "ShippingAddressView"): "agentflow_oscar.checkout_v2.views.ShippingAddressView",
    ("checkout.views", "ShippingMethodView"): "agentflow_oscar.checkout_v2.views.ShippingMethodView",
    ("checkout.views", "PaymentMethodView"): "agentflow_oscar.checkout_v2.views.PaymentMethodView",
    ("checkout.views", "PaymentDetailsView"): "agentflow_oscar.checkout_v2.views.PaymentDetailsView",
}


def class_loader(module_label: str, classnames: list[str], module_prefix: str) -> list[Any]:
    """Oscar's classes, with the store's subclasses for the overridden names."""
    found = default_class_loader(module_label, classnames, module_prefix)
    return [
        import_string(OVERRIDES[(module_label, name)]) if (module_label, name) in OVERRIDES else cls
        for name, cls in zip(classnames, found, strict=True)
    ]
