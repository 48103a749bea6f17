"""Settings of the checkout_v2 store: the checkout store's settings plus guest checkout and our classes.

``AGENTFLOW_OSCAR_MACHINE`` (set by ``python -m agentflow_oscar.serve --process checkout_v2``) names the
state machine whose business logic the outside world follows (:mod:`agentflow_oscar.checkout_v2.world`).
"""

from __future__ import annotations

from pathlib import Path

from agentflow_oscar.settings import *  # noqa: F403 - the base store's settings, then what differs
from agentflow_oscar.settings import MIDDLEWARE, TEMPLATES

ROOT_URLCONF = "agentflow_oscar.checkout_v2.urls"
OSCAR_ALLOW_ANON_CHECKOUT = True  # a new customer has no account: guest checkout
OSCAR_DYNAMIC_CLASS_LOADER = "agentflow_oscar.checkout_v2.loader.class_loader"
OSCAR_ORDER_STATUS_PIPELINE = {"Pending": ("Confirmed",), "Confirmed": ()}
MIDDLEWARE = [*MIDDLEWARE, "agentflow_oscar.checkout_v2.panel.OperatorPanelMiddleware"]
TEMPLATES = [{**TEMPLATES[0], "DIRS": [Path(__file__).resolve().parent / "templates"]}]
