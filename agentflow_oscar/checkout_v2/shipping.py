"""The store's shipping repository: Oscar's ``Repository`` with two methods, standard and express.

Both are free to the customer (the shop pays the courier: express is a cost of the business, which the
world books); Oscar's shipping-method page offers them and stores the choice in the checkout session.
"""

from __future__ import annotations

from oscar.apps.shipping import methods, repository


class Standard(methods.Free):
    """Standard delivery."""

    code = "standard"
    name = "Standard delivery"


class Express(methods.Free):
    """Express delivery (next day)."""

    code = "express"
    name = "Express delivery"


class Repository(repository.Repository):
    """Oscar's repository offering standard and express delivery."""

    methods = (Standard(), Express())
