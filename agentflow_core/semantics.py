"""The shared semantic vocabulary: business-state tokens, semantic actions and features.

Every channel (web UI, SQL database, HTTP API) is projected onto this one vocabulary by its
semantic adapter, so a single policy network can act in all of them. The encoded observation
is a fixed-length float32 vector: a multi-hot block over ``TOKENS`` followed by ``FEATURES``.
Adding a token or an action changes the encoding width and therefore invalidates checkpoints;
``VOCAB_VERSION`` is stored with every checkpoint and dataset for that reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

VOCAB_VERSION = "1"

# Business-state tokens (docs/design.md §2.1: the design ships 17; we carry more so that distinct raw states never
# have to share a token -- see the mapping audit's "collapse" check).
TOKENS: tuple[str, ...] = (
    "LOGGED_OUT",
    "LOGGED_IN",
    "USER_BLOCKED",
    "VIP_USER",
    "SESSION_EXPIRED",
    "PRODUCT_VIEWED",
    "OUT_OF_STOCK",
    "CART_EMPTY",
    "CART_FILLED",
    "CHECKOUT_STARTED",
    "ORDER_PENDING",
    "PAYMENT_PAGE",
    "PAYMENT_SUCCESS",
    "PAYMENT_FAILED",
    "INVALID_CARD",
    "INSUFFICIENT_FUNDS",
    "FUNDS_TOPPED_UP",
    "NETWORK_TIMEOUT",
    "SERVER_ERROR",
    "PAGE_NOT_FOUND",
    "ORDER_CANCELLED",
    "ORDER_EXPIRED",
    "ESCALATED",
)
TOKEN_INDEX: dict[str, int] = {t: i for i, t in enumerate(TOKENS)}

# Tokens that end an episode successfully / unsuccessfully regardless of channel.
GOAL_TOKEN = "PAYMENT_SUCCESS"

# Process success: besides the goal, the terminal tokens that are the right outcome for a
# variant, keyed by (dimension, value) of its scenario. A blocked user cannot pay; escalating to
# support is the process's answer (every channel emits ESCALATED on its support/ticket state).
HANDLED_OUTCOMES: Mapping[tuple[str, str], frozenset[str]] = {
    ("user_tier", "blocked"): frozenset({"ESCALATED"}),
}


class SemanticAction(IntEnum):
    """The shared action set. Adapters translate each into a channel-native action."""

    LOGIN = 0
    VIEW_PRODUCT = 1
    ADD_TO_CART = 2
    REMOVE_FROM_CART = 3
    CHECKOUT = 4
    ENTER_PAYMENT = 5
    SUBMIT_PAYMENT = 6
    TOP_UP_FUNDS = 7
    USE_BACKUP_CARD = 8
    RETRY = 9
    CANCEL_ORDER = 10
    ESCALATE = 11


ACTIONS: tuple[str, ...] = tuple(a.name for a in SemanticAction)
N_ACTIONS = len(ACTIONS)

# Declared risk of each semantic action (docs/design-003.md §2.2): the env may raise it further in
# context (e.g. submitting a payment for an order that is already paid = double charge).
ACTION_RISK: dict[SemanticAction, float] = {
    SemanticAction.CANCEL_ORDER: 0.5,
    SemanticAction.SUBMIT_PAYMENT: 0.1,
}

# Numeric features, each scaled to roughly [0, 1] by the adapter.
FEATURES: tuple[str, ...] = (
    "user_logged_in",
    "cart_items",
    "payment_page_loaded",
    "is_vip",
    "price_factor",
    "balance_ratio",
    "retries_used",
    "step_fraction",
)
FEATURE_INDEX: dict[str, int] = {f: i for i, f in enumerate(FEATURES)}
N_TOKENS = len(TOKENS)
N_FEATURES = len(FEATURES)
OBS_DIM = N_TOKENS + N_FEATURES


@dataclass(frozen=True)
class SemanticObs:
    """One channel-independent observation: the active tokens plus named numeric features."""

    tokens: frozenset[str]
    features: Mapping[str, float] = field(default_factory=dict)

    def encode(self) -> np.ndarray:
        """Return the fixed-length float32 vector shared by all families."""
        return encode(self.tokens, self.features)


def encode(tokens: Iterable[str], features: Mapping[str, float]) -> np.ndarray:
    """Multi-hot tokens followed by features; unknown names are a programming error."""
    vec = np.zeros(OBS_DIM, dtype=np.float32)
    for token in tokens:
        vec[TOKEN_INDEX[token]] = 1.0
    for name, value in features.items():
        vec[N_TOKENS + FEATURE_INDEX[name]] = value
    return vec


def accepted_outcomes(params: Mapping[str, object]) -> frozenset[str]:
    """Terminal tokens that count as process success for a variant with scenario ``params``."""
    accepted = {GOAL_TOKEN}
    for (dimension, value), tokens in HANDLED_OUTCOMES.items():
        if str(params.get(dimension)) == value:
            accepted |= tokens
    return frozenset(accepted)


def process_success(params: Mapping[str, object], final_tokens: Iterable[str], terminated: bool) -> bool:
    """The episode ended (not truncated) in the goal or in a handled outcome accepted for its variant."""
    return terminated and not accepted_outcomes(params).isdisjoint(final_tokens)


def decode_tokens(vec: np.ndarray) -> frozenset[str]:
    """Inverse of the token block of :func:`encode`."""
    return frozenset(TOKENS[i] for i in np.flatnonzero(vec[:N_TOKENS] > 0.5))


def decode_features(vec: np.ndarray) -> dict[str, float]:
    """Inverse of the feature block of :func:`encode`."""
    return {name: float(vec[N_TOKENS + i]) for i, name in enumerate(FEATURES)}
