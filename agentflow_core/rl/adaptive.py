"""Adaptive clip range and KL penalty: keep each PPO update close to a target KL.

Every ``check_every`` PPO updates (rollout + epochs of minibatch steps; the design's "every 100
updates" (docs/design.md §3.4) never fired in a 98-update run, so the shipped cadence is 5) the
controller looks at the mean approximate KL the learner measured over the updates since its last
check. Above ``target_kl`` the policy moved too far: the clip range shrinks (x0.5, never below
``clip_floor``) and the KL-penalty coefficient beta rises (x1.5, as in RLlib's adaptive KL;
from zero it jumps to ``kl_coef_min``). Once the KL is back under ``target_kl / 1.5`` both relax
(clip x1.5 up to its initial value, beta x0.5, dropping to zero below ``kl_coef_min``). In between
nothing changes, which gives the controller hysteresis instead of oscillation. Each check is
logged (``adaptive/checked``, the KL it saw, ``adaptive/action``: +1 tightened, -1 relaxed, 0 held).

Pure and deterministic: no clock, no randomness; ``state_dict`` round-trips through JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class AdaptiveKLController:
    """Clip range / KL-coefficient controller driven by measured approximate KL."""

    clip_init: float = 0.08
    target_kl: float = 0.015
    check_every: int = 100
    clip_floor: float = 0.01
    shrink: float = 0.5
    grow: float = 1.5
    kl_coef_init: float = 0.0
    kl_coef_min: float = 0.01
    relax_ratio: float = 1.5
    clip_range: float = field(init=False)
    kl_coef: float = field(init=False)
    updates_seen: int = field(default=0, init=False)
    window_kl_sum: float = field(default=0.0, init=False)
    window_count: int = field(default=0, init=False)
    last_check_kl: float = field(default=0.0, init=False)
    checks: int = field(default=0, init=False)
    adjustments: int = field(default=0, init=False)
    last_action: int = field(default=0, init=False)
    checked_now: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if self.check_every < 1:
            raise ValueError(f"check_every must be >= 1, got {self.check_every}")
        self.clip_range = self.clip_init
        self.kl_coef = self.kl_coef_init

    def observe(self, approx_kl: float) -> bool:
        """Record one update's approximate KL; returns True when this call adjusted clip/beta."""
        self.updates_seen += 1
        self.window_kl_sum += float(approx_kl)
        self.window_count += 1
        self.checked_now = self.updates_seen % self.check_every == 0
        if not self.checked_now:
            return False
        kl = self.window_kl_sum / self.window_count
        self.checks += 1
        self.last_check_kl = kl
        self.window_kl_sum, self.window_count = 0.0, 0
        old = (self.clip_range, self.kl_coef)
        if kl > self.target_kl:
            self.clip_range = max(self.clip_range * self.shrink, self.clip_floor)
            self.kl_coef = max(self.kl_coef * self.grow, self.kl_coef_min)
        elif kl < self.target_kl / self.relax_ratio:
            self.clip_range = min(self.clip_range * self.grow, self.clip_init)
            new_coef = self.kl_coef * self.shrink
            self.kl_coef = new_coef if new_coef >= self.kl_coef_min else 0.0
        changed = old != (self.clip_range, self.kl_coef)
        self.last_action = 0 if not changed else (1 if kl > self.target_kl else -1)
        self.adjustments += int(changed)
        return changed

    def metrics(self) -> dict[str, float]:
        """What to log every update: the current values, and what the last check saw and did."""
        return {
            "clip_range": self.clip_range,
            "kl_coef": self.kl_coef,
            "kl_at_last_check": self.last_check_kl,
            "checked": float(self.checked_now),
            "action": float(self.last_action if self.checked_now else 0),
            "checks": float(self.checks),
            "adjustments": float(self.adjustments),
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable state (configuration included, so a resume cannot mix settings)."""
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from :meth:`state_dict`."""
        for key, value in state.items():
            if not hasattr(self, key):
                raise KeyError(f"adaptive controller state: unknown key {key!r}")
            setattr(self, key, value)
