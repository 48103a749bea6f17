"""The physical-environment contract shared by every channel family.

A physical env speaks its channel's native language (DOM-like pages, SQL rows, HTTP JSON). It
knows nothing of semantic tokens; the semantic adapter does that translation. Every family
takes the same :class:`Scenario` (the business parameters a variant can perturb), so one
variant catalogue spans all channels.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Protocol, runtime_checkable

NETWORK_CONDITIONS = ("normal", "latency_500ms", "packet_loss_5%")
USER_TIERS = ("standard", "vip", "blocked")
START_STAGES = ("login", "product_detail", "checkout", "payment")

# Simulated network: injected latency advances a simulated clock instead of sleeping, so
# training wall time does not grow with it.
NETWORK_LATENCY_S = {"normal": 0.02, "latency_500ms": 0.5, "packet_loss_5%": 0.05}
NETWORK_DROP_RATE = {"normal": 0.0, "latency_500ms": 0.0, "packet_loss_5%": 0.05}

# The shared business reward table (docs/architecture.md): every family's step earns exactly one.
STEP_REWARD = -0.01
INAPPLICABLE_REWARD = -0.05  # an action that does not apply in the current state
SUCCESS_REWARD = 10.0  # PAYMENT_SUCCESS
BLOCKED_ESCALATION_REWARD = 1.0  # escalating for a blocked user: the right outcome
WRONG_ESCALATION_REWARD = -1.0  # escalating when the order could have gone through
CANCEL_REWARD = -2.0

# Built once: a Scenario is validated at every env build and every payment-API episode.
_ONE_OF_NETWORKS, _ONE_OF_TIERS, _ONE_OF_STAGES = (
    f"one of {values}" for values in (NETWORK_CONDITIONS, USER_TIERS, START_STAGES)
)


@dataclass(frozen=True)
class Scenario:
    """Business parameters of one episode distribution (one variant).

    ``start_stage`` is the design's "page type" dimension (docs/design.md §3.3): the funnel stage an episode starts at
    (a user who arrives logged in on a product page, at checkout with a filled cart, ...).
    """

    network: str = "normal"
    user_tier: str = "standard"
    start_stage: str = "login"
    price_factor: float = 1.0
    inventory: int = 20
    balance: float = 500.0
    card_decline_rate: float = 0.1
    session_timeout_steps: int = 40
    max_episode_steps: int = 50
    vip_discount: float = 0.9

    def __post_init__(self) -> None:
        checks: list[tuple[str, bool, str]] = [
            ("network", self.network in NETWORK_CONDITIONS, _ONE_OF_NETWORKS),
            ("user_tier", self.user_tier in USER_TIERS, _ONE_OF_TIERS),
            ("start_stage", self.start_stage in START_STAGES, _ONE_OF_STAGES),
            ("price_factor", 0.0 < self.price_factor <= 10.0, "a float in (0, 10]"),
            ("inventory", 0 <= self.inventory <= 10_000, "an int in [0, 10000]"),
            ("balance", 0.0 <= self.balance <= 1e7, "a float in [0, 1e7]"),
            ("card_decline_rate", 0.0 <= self.card_decline_rate <= 1.0, "a float in [0, 1]"),
            ("session_timeout_steps", self.session_timeout_steps >= 1, "an int >= 1"),
            ("max_episode_steps", self.max_episode_steps >= 1, "an int >= 1"),
            ("vip_discount", 0.0 < self.vip_discount <= 1.0, "a float in (0, 1]"),
        ]
        for name, ok, expected in checks:
            if not ok:
                raise ValueError(f"scenario.{name}: got {getattr(self, name)!r}, expected {expected}")

    @classmethod
    def from_dict(cls, params: Mapping[str, Any]) -> Scenario:
        """Build from a plain mapping; unknown keys are an error naming the key."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(params) - known)
        if unknown:
            raise ValueError(f"scenario: unknown key(s) {unknown}, expected a subset of {sorted(known)}")
        return cls(**dict(params))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form, so a scenario can be logged and compared and rebuilt with :meth:`from_dict`."""
        return asdict(self)

    @property
    def unit_price(self) -> float:
        """Price of the demo product after the variant's price factor and VIP discount."""
        base = 100.0 * self.price_factor
        return round(base * (self.vip_discount if self.user_tier == "vip" else 1.0), 2)


def make_env_id(family: str, version: int, created: _dt.date | None = None, suffix: str = "") -> str:
    """``<family>_v<version>_<YYYYMMDD>[_<suffix>]``, the env_id convention of docs/design.md §2.1."""
    day = (created or _dt.date.today()).strftime("%Y%m%d")
    return f"{family}_v{version}_{day}" + (f"_{suffix}" if suffix else "")


@dataclass(frozen=True)
class StepResult:
    """What a physical env returns from ``step``: the standard dict of docs/design.md §2.1, typed.

    ``done`` is ``terminated or truncated``; both stay available so that value bootstrapping
    on truncation is possible. ``info`` always carries env_id, step_id and failure_reason.
    """

    obs: Any
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]

    @property
    def done(self) -> bool:
        """The episode is over, by the env's own ending or by truncation."""
        return self.terminated or self.truncated

    def as_dict(self) -> dict[str, Any]:
        """The plain step dict (obs, reward, done, terminated, truncated, info), for callers that take dicts."""
        return {
            "obs": self.obs,
            "reward": self.reward,
            "done": self.done,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "info": self.info,
        }


@runtime_checkable
class PhysicalEnv(Protocol):
    """A channel-native environment. ``obs`` is raw channel data, actions are native actions."""

    family: str
    version: int
    env_id: str

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        """Start an episode; returns (raw_obs, info)."""
        ...

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Apply one native action."""
        ...

    def close(self) -> None:
        """Release sockets, connections, threads."""
        ...


@runtime_checkable
class ReconfigurableEnv(PhysicalEnv, Protocol):
    """A physical env that can be re-targeted to another variant of its base env (optional).

    A pool reuses an idle env this way instead of building a new one. After ``reconfigure`` the
    env must behave exactly like one built fresh with ``(scenario, env_id)``: same observations,
    rewards and infos for the same seeds and actions. Any open episode is abandoned (rolled back).
    """

    def reconfigure(self, scenario: Scenario, env_id: str) -> None:
        """Switch to ``scenario`` under ``env_id``; the next ``reset`` starts its first episode."""
        ...
