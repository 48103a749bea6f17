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

from agentflow_core.scenario import ScenarioField, ScenarioSpec
from agentflow_core.state_contract import FeatureSpec, StateContract, contract_from_data, permissive

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

# Meanings that cannot hold at once (one session, one cart, one order, one payment outcome): the mapping
# audit flags a reading that holds two of one group, since the policy cannot know which is true.
EXCLUSIVE_TOKENS: tuple[frozenset[str], ...] = (
    frozenset({"LOGGED_OUT", "LOGGED_IN"}),
    frozenset({"CART_EMPTY", "CART_FILLED"}),
    frozenset({"ORDER_PENDING", "ORDER_CANCELLED", "ORDER_EXPIRED"}),
    frozenset({"PAYMENT_SUCCESS", "ORDER_CANCELLED", "ORDER_EXPIRED"}),
    frozenset({"PAYMENT_SUCCESS", "PAYMENT_FAILED", "INVALID_CARD", "INSUFFICIENT_FUNDS"}),
)

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

# The checkout scenario's fields (agentflow_core.envs.base.Scenario is the typed form checkout's envs take).
CHECKOUT_SCENARIO = ScenarioSpec(
    (
        ScenarioField("network", "str", "normal", "dimension", values=("normal", "latency_500ms", "packet_loss_5%")),
        ScenarioField("user_tier", "str", "standard", "dimension", values=("standard", "vip", "blocked")),
        ScenarioField(
            "start_stage", "str", "login", "dimension", values=("login", "product_detail", "checkout", "payment")
        ),
        ScenarioField("price_factor", "float", 1.0, "perturbation", low=0.01, high=10.0),
        ScenarioField("inventory", "int", 20, "perturbation", low=0, high=10_000),
        ScenarioField("balance", "float", 500.0, "perturbation", low=0.0, high=1e7),
        ScenarioField("card_decline_rate", "float", 0.1, "perturbation", low=0.0, high=1.0),
        ScenarioField("session_timeout_steps", "int", 40, "fixed", low=1, high=100_000),
        ScenarioField("max_episode_steps", "int", 50, "fixed", low=1, high=100_000),
        ScenarioField("vip_discount", "float", 0.9, "perturbation", low=0.01, high=1.0),
    )
)
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


@dataclass(frozen=True)
class Vocabulary:
    """One business process's vocabulary as a value: tokens, actions (with declared risk), features, outcomes.

    The module-level names above are the checkout process's vocabulary (:data:`CHECKOUT`); a process
    loaded from data (:mod:`agentflow_core.process`) carries its own instance, and code that serves
    more than one process reads widths, indices and outcomes from it instead of from the module.
    """

    version: str
    tokens: tuple[str, ...]
    actions: tuple[str, ...]
    features: tuple[str, ...]
    action_risk: tuple[float, ...]
    goal: str
    handled_outcomes: Mapping[tuple[str, str], frozenset[str]] = field(default_factory=dict, hash=False)
    escape_action: str = "ESCALATE"  # legal whenever a channel maps no other action (never no legal move)
    exclusive: tuple[frozenset[str], ...] = ()  # token groups no state may hold two of (the mapping audit)
    scenario: ScenarioSpec = ScenarioSpec(())  # the business parameters a variant sets (agentflow_core.scenario)
    contract: StateContract | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def state_contract(self) -> StateContract:
        """Legal actions and feature presentation from the tokens (every action legal if none is declared)."""
        if self.contract is not None:
            return self.contract
        return permissive(self.actions, self.actions.index(self.escape_action), self.features)

    @property
    def n_tokens(self) -> int:
        """Width of the multi-hot token block."""
        return len(self.tokens)

    @property
    def n_actions(self) -> int:
        """Size of the discrete action space."""
        return len(self.actions)

    @property
    def n_features(self) -> int:
        """Width of the feature block."""
        return len(self.features)

    @property
    def obs_dim(self) -> int:
        """Width of an encoded observation."""
        return len(self.tokens) + len(self.features)

    def token_index(self) -> dict[str, int]:
        """Token name -> position in the token block."""
        return {t: i for i, t in enumerate(self.tokens)}

    def feature_index(self) -> dict[str, int]:
        """Feature name -> position in the feature block (after the tokens)."""
        return {f: i for i, f in enumerate(self.features)}

    def action_id(self, name: str) -> int:
        """The index of a semantic action by name (a KeyError names an unknown one)."""
        try:
            return self.actions.index(name)
        except ValueError:
            raise KeyError(f"unknown action {name!r}, expected one of {list(self.actions)}") from None

    def encode(self, tokens: Iterable[str], features: Mapping[str, float]) -> np.ndarray:
        """Multi-hot tokens followed by features, in this vocabulary's order."""
        token_index, feature_index = self.token_index(), self.feature_index()
        vec = np.zeros(self.obs_dim, dtype=np.float32)
        for token in tokens:
            vec[token_index[token]] = 1.0
        for name, value in features.items():
            vec[self.n_tokens + feature_index[name]] = value
        return vec

    def decode_tokens(self, vec: np.ndarray) -> frozenset[str]:
        """Inverse of the token block of :meth:`encode`."""
        return frozenset(self.tokens[i] for i in np.flatnonzero(vec[: self.n_tokens] > 0.5))

    def decode_features(self, vec: np.ndarray) -> dict[str, float]:
        """Inverse of the feature block of :meth:`encode`."""
        return {name: float(vec[self.n_tokens + i]) for i, name in enumerate(self.features)}

    def accepted_outcomes(self, params: Mapping[str, object]) -> frozenset[str]:
        """Terminal tokens that count as process success for a variant with scenario ``params``."""
        accepted = {self.goal}
        for (dimension, value), tokens in self.handled_outcomes.items():
            if str(params.get(dimension)) == value:
                accepted |= tokens
        return frozenset(accepted)

    def process_success(self, params: Mapping[str, object], final_tokens: Iterable[str], terminated: bool) -> bool:
        """The episode ended (not truncated) in the goal or in a handled outcome accepted for its variant."""
        return terminated and not self.accepted_outcomes(params).isdisjoint(final_tokens)


_LIVE = frozenset({"LOGGED_IN"})
# Checkout's features as the process defines them (configs/processes/checkout.yaml declares the same).
CHECKOUT_FEATURES: tuple[FeatureSpec, ...] = (
    FeatureSpec("user_logged_in", "a live session", "0 or 1"),
    FeatureSpec("cart_items", "items in the cart", "count / 5, clipped to 1"),
    FeatureSpec("payment_page_loaded", "the payment form is open", "0 or 1", observed_with=frozenset({"PAYMENT_PAGE"})),
    FeatureSpec("is_vip", "the signed-in user is a VIP member", "0 or 1", observed_with=_LIVE),
    FeatureSpec("price_factor", "list price of the product", "price / 200, clipped to 1", observed_with=_LIVE),
    FeatureSpec("balance_ratio", "wallet balance over the unit price", "ratio / 2, clipped to 1", observed_with=_LIVE),
    FeatureSpec("retries_used", "client retries spent on the last request", "count / 5, clipped to 1"),
    FeatureSpec("step_fraction", "episode progress", "step / max steps"),
)
# Checkout's legal actions per business state (action -> {any, all, none} of tokens; ESCALATE always).
CHECKOUT_LEGAL: Mapping[str, Mapping[str, tuple[str, ...]]] = {
    "LOGIN": {"any": ("LOGGED_OUT", "SESSION_EXPIRED")},
    "VIEW_PRODUCT": {"all": ("LOGGED_IN",)},
    "ADD_TO_CART": {"all": ("LOGGED_IN", "PRODUCT_VIEWED"), "none": ("OUT_OF_STOCK",)},
    "REMOVE_FROM_CART": {"all": ("LOGGED_IN", "CART_FILLED")},
    "CHECKOUT": {"all": ("LOGGED_IN", "CART_FILLED")},
    "ENTER_PAYMENT": {"all": ("ORDER_PENDING",), "none": ("PAYMENT_PAGE", "FUNDS_TOPPED_UP")},
    "SUBMIT_PAYMENT": {"any": ("PAYMENT_PAGE", "FUNDS_TOPPED_UP")},
    "TOP_UP_FUNDS": {"any": ("INSUFFICIENT_FUNDS",)},
    "USE_BACKUP_CARD": {"any": ("INVALID_CARD", "PAYMENT_FAILED")},
    "RETRY": {"any": ("NETWORK_TIMEOUT", "SERVER_ERROR", "PAGE_NOT_FOUND")},
    "CANCEL_ORDER": {"any": ("ORDER_PENDING", "ORDER_EXPIRED")},
    "ESCALATE": {},
}

# The checkout process's vocabulary as a value (configs/processes/checkout.yaml must load to exactly this).
CHECKOUT = Vocabulary(
    version=VOCAB_VERSION,
    tokens=TOKENS,
    actions=ACTIONS,
    features=FEATURES,
    action_risk=tuple(ACTION_RISK.get(a, 0.0) for a in SemanticAction),
    goal=GOAL_TOKEN,
    handled_outcomes=HANDLED_OUTCOMES,
    exclusive=EXCLUSIVE_TOKENS,
    scenario=CHECKOUT_SCENARIO,
    contract=contract_from_data(
        ACTIONS, "ESCALATE", CHECKOUT_LEGAL, CHECKOUT_FEATURES, {"ESCALATED": ("USER_BLOCKED",)}
    ),
)
