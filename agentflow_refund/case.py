"""The refund case: the business rules of the refund service (the SQL channel writes the same rules as data).

A case belongs to one customer and one order. It moves draft -> submitted -> issued; a refund above
``EVIDENCE_THRESHOLD`` needs evidence attached before it can be submitted (submitting without it
returns the request with ``evidence_required``). The review issues the refund on a status check with
probability ``1 - review_pending_rate``. A flagged account (``account: flagged``) can do nothing but
escalate to support; a session expires after ``session_timeout_steps``; a network drop (the scenario's
``network``) fails a request without applying it, and RETRY sends it again. The service keeps the case in
memory and decides what the client sees; this module decides what happens. configs/refund/envs/refund_db_v1.yaml
states the same rules as SQL statements and outcomes (tests/test_refund_db_channel.py replays episodes of
both and tests/test_channel_equivalence.py holds the two channels to one path per seed).

The refund system's parameters are :data:`SCENARIO` (configs/processes/refund.yaml declares the same
fields, which the variant catalogue varies); a case starts at ``entry_stage`` with an order worth
``order_value``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.envs.base import NETWORK_CONDITIONS, NETWORK_DROP_RATE
from agentflow_core.scenario import ScenarioField, ScenarioSpec

EVIDENCE_THRESHOLD = 100.0  # refunds above this amount need evidence
STEP_REWARD = -0.01
INAPPLICABLE_REWARD = -0.05
ISSUED_REWARD = 10.0
FLAGGED_ESCALATION_REWARD = 1.0
WRONG_ESCALATION_REWARD = -1.0
WITHDRAW_REWARD = -2.0

ENTRY_STAGES = ("signed_out", "order_found", "request_draft", "under_review")
SCENARIO = ScenarioSpec(
    (
        ScenarioField("network", "str", "normal", "dimension", values=NETWORK_CONDITIONS),
        ScenarioField("account", "str", "ok", "dimension", values=("ok", "flagged")),
        ScenarioField("entry_stage", "str", "signed_out", "dimension", values=ENTRY_STAGES),
        ScenarioField("order_value", "float", 100.0, "perturbation", low=1.0, high=10_000.0),
        ScenarioField("review_pending_rate", "float", 0.3, "perturbation", low=0.0, high=1.0),
        ScenarioField("session_timeout_steps", "int", 40, "fixed", low=1, high=100_000),
        ScenarioField("max_episode_steps", "int", 30, "fixed", low=1, high=100_000),
    )
)
Scenario = Mapping[str, Any]  # a ScenarioValues of SCENARIO's fields

ACTIONS = (
    "sign_in",
    "find_order",
    "open_request",
    "attach_evidence",
    "submit_request",
    "check_status",
    "withdraw",
    "escalate",
)


@dataclass
class RefundCase:
    """Mutable state of one episode's case (the channel persists it its own way)."""

    session: str = "none"  # none | active | expired
    account: str = "ok"  # ok | flagged
    order_found: bool = False
    request: str = "none"  # none | draft | submitted | issued | withdrawn
    evidence: bool = False
    evidence_required: bool = False
    ticket: bool = False
    amount: float = 100.0
    steps: int = 0
    timed_out: bool = False

    @property
    def done(self) -> bool:
        """The case is closed: refunded, withdrawn or handed to support."""
        return self.request in ("issued", "withdrawn") or self.ticket


def start_case(scenario: Scenario) -> RefundCase:
    """The case at the scenario's entry stage (signed out; order found; request drafted; under review)."""
    case = RefundCase(amount=round(float(scenario["order_value"]), 2))
    case.account = str(scenario["account"])
    stage = scenario["entry_stage"]
    if stage != "signed_out":
        case.session, case.order_found = "active", True
    if stage in ("request_draft", "under_review"):
        case.request = "draft"
    if stage == "under_review":
        case.evidence = case.amount > EVIDENCE_THRESHOLD
        case.request = "submitted"
    return case


def apply(case: RefundCase, action: str, scenario: Scenario, rng: np.random.Generator) -> tuple[float, str | None]:
    """Apply one business action; returns (reward, failure reason or None). Draws from ``rng`` only."""
    case.steps += 1
    if case.steps >= scenario["session_timeout_steps"] and case.session == "active":
        case.session = "expired"
    case.timed_out = bool(rng.random() < NETWORK_DROP_RATE[scenario["network"]])
    if case.timed_out:
        return STEP_REWARD, "network_timeout"
    return _business(case, action, scenario, rng)


def _business(case: RefundCase, action: str, scenario: Scenario, rng: np.random.Generator) -> tuple[float, str | None]:
    if action == "escalate":
        case.ticket = True
        return (FLAGGED_ESCALATION_REWARD if case.account == "flagged" else WRONG_ESCALATION_REWARD), "escalated"
    if action == "sign_in":
        if case.session == "active":
            return INAPPLICABLE_REWARD, "already_signed_in"
        case.session = "active"
        return STEP_REWARD, None
    if case.session != "active":
        return INAPPLICABLE_REWARD, "not_signed_in"
    if case.account == "flagged":
        return INAPPLICABLE_REWARD, "account_flagged"
    return _request_step(case, action, scenario, rng)


def _request_step(
    case: RefundCase, action: str, scenario: Scenario, rng: np.random.Generator
) -> tuple[float, str | None]:
    """A signed-in, unflagged customer's step through the refund request: find, open, evidence, submit, check."""
    if action == "find_order":
        case.order_found = True
        return STEP_REWARD, None
    if action == "open_request" and case.order_found and case.request == "none":
        case.request = "draft"
        return STEP_REWARD, None
    if action == "attach_evidence" and case.request == "draft":
        case.evidence, case.evidence_required = True, False
        return STEP_REWARD, None
    if action == "submit_request" and case.request == "draft":
        if case.amount > EVIDENCE_THRESHOLD and not case.evidence:
            case.evidence_required = True
            return STEP_REWARD, "evidence_required"
        case.request = "submitted"
        return STEP_REWARD, None
    if action == "check_status" and case.request == "submitted":
        if rng.random() >= scenario["review_pending_rate"]:
            case.request = "issued"
            return ISSUED_REWARD, None
        return STEP_REWARD, "review_pending"
    if action == "withdraw" and case.request in ("draft", "submitted"):
        case.request = "withdrawn"
        return WITHDRAW_REWARD, "withdrawn"
    return INAPPLICABLE_REWARD, "not_applicable"
