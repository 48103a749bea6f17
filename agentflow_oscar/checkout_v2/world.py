"""The world outside Oscar in a checkout_v2 episode: the customer and the services a real shop calls.

Oscar has no customer who loses patience, no address-verification service, no warehouse with partial
stock and no payment provider with outages, declines, backup cards and 3-D Secure. A real shop gets
those from outside; here they come from the process's own business logic, the state machine
``configs/checkout_v2/envs/channels/machine.yaml``, run by the core's :class:`StateMachineEnv`:

* ``reset(scenario, seed)`` draws every variable with the machine's ``init`` expressions (the core's safe
  expression evaluator), from a generator seeded by the episode's seed -- the same draws the simulator
  makes for the same scenario and seed: patience, a bad address, a partial stock, an outage and its
  length, whether the card and the backup card will be declined, whether the account is flagged;
* every customer interaction the store serves is one machine action (``act``): the store's views do
  Oscar's part (basket, sign-in, address form, shipping method, voucher, order placement, order status)
  and ask the world what the outside answers (the address check's verdict, the warehouse's, the payment
  provider's) and how the customer's clock moves (patience, the outage's remaining steps);
* the visible variables are what an operator sees (attempts, recent gateway failures, declines, the card
  type, whether the customer is new); hidden ones never reach a page.

One store process serves one episode at a time (every reset restores its one database), so the world is
a module-level singleton guarded by a lock.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from agentflow_core.envs.state_machine import StateMachineEnv

NATIVE = "machine"
# The page each machine stage is shown on (stage 2 depends on whether the customer is identified yet).
STAGE_PAGES = {
    0: "/catalogue/featured-kettle_1/",
    1: "/basket/",
    3: "/checkout/address-check/",
    4: "/checkout/stock-check/",
    5: "/checkout/shipping-method/",
    6: "/checkout/voucher/",
    7: "/checkout/payment-method/",
    8: "/checkout/payment-details/",
    9: "/checkout/preview/",
    10: "/checkout/bank-transfer/",
    11: "/checkout/thank-you/",
}
END_PAGES = {"goal": "/checkout/confirmed/", "handled": "/checkout/handed-over/", "abandoned": "/checkout/abandoned/"}
# What the outside says, in the words a shop shows its customer (Oscar shows them as the payment error).
MESSAGES = {
    "address_invalid": "We could not verify this address.",
    "partial_stock": "Only part of your order is in stock.",
    "authentication_required": "Your bank requires 3-D Secure authentication.",
    "gateway_error": "The payment gateway did not respond.",
    "card_declined": "Your card was declined.",
    "backup_declined": "Your backup card was declined.",
    "account_review": "Your account is under review: the payment is on hold.",
    "transfer_pending": "The bank transfer has not arrived yet.",
}
VISIBLE_ON_PAGE = ("attempts", "recent_failures", "declines", "route", "using_backup", "verified_3ds")


class World:
    """The machine of one episode behind the store (see the module docstring)."""

    def __init__(self, spec: dict[str, Any], source: str) -> None:
        self.spec, self.source = spec, source
        self.env: StateMachineEnv | None = None
        self.outcome: str | None = None
        self.business_value = 0.0
        self.steps = 0
        self.lock = threading.Lock()

    def reset(self, scenario: dict[str, Any], seed: int | None) -> None:
        """Draw a new episode's hidden and visible state for ``scenario`` with ``seed``."""
        fields = {k: v for k, v in scenario.items() if k != "seed"}
        self.env = StateMachineEnv(fields, "checkout_v2_oscar_v1", self.spec, self.source)
        self.env.reset(seed=seed)
        self.outcome, self.business_value, self.steps = None, 0.0, 0

    @property
    def values(self) -> dict[str, Any]:
        """All variables (hidden included: for the store's services, never for a page)."""
        if self.env is None:
            raise RuntimeError("the store's world was not reset: POST /__agentflow__/reset/ first")
        return self.env.values

    def act(self, action: str) -> str | None:
        """One customer interaction as the machine's action; its failure reason (None: it went through)."""
        if self.env is None or self.outcome is not None:
            return None
        result = self.env.step({"type": NATIVE, "action": action})
        self.steps += 1
        self.business_value = float(result.info["business_value"])
        if result.terminated:
            self.outcome = str(result.info["outcome"])
        reason = result.info["failure_reason"]
        return None if reason in (None, "max_steps") else str(reason)

    def stage(self) -> int:
        """The checkout stage the customer is at."""
        return int(self.values["stage"])

    def next_page(self) -> str:
        """Where the customer is now: the end page of a finished episode, else the page of the stage."""
        if self.outcome is not None:
            return END_PAGES.get(self.outcome, END_PAGES["abandoned"])
        stage = self.stage()
        if stage == 2:
            return "/checkout/shipping-address/" if self.values["identified"] else "/checkout/"
        return STAGE_PAGES[stage]

    def panel(self) -> dict[str, Any]:
        """What the operator sees of the customer and the payment provider (visible variables only)."""
        if self.env is None:
            return {}
        values = self.values
        shown = {name: int(values[name]) for name in VISIBLE_ON_PAGE}
        shown["new_customer"] = int(values["new_customer"])
        shown["card_kind"] = int(values["card_kind"])
        shown["has_voucher"] = int(values["has_voucher"] and self.stage() == 6)
        shown["escalated"] = int(values["escalated"])
        shown["confirmed"] = int(values["confirmed"])
        shown["stage"], shown["identified"] = self.stage(), int(values["identified"])  # where the customer is
        return shown


_world: World | None = None


def configure(machine_file: Path) -> None:
    """Load the machine document the world runs (called once by the server)."""
    from tasks.yaml_io import load_yaml_file

    global _world
    _world = World(load_yaml_file(machine_file), str(machine_file))


def world() -> World:
    """The store's world (configured at start)."""
    if _world is None:
        raise RuntimeError("the checkout_v2 store was started without a machine (serve --machine)")
    return _world
