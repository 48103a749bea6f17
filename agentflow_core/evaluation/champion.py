"""Champion / challenger canary (docs/design.md §5.3): promote a new policy only when it is consistent and better.

The design's canary runs the new policy on 10% of the traffic and switches over when its action
consistency rate exceeds 85% *and* reward improves by more than 5%. Here the "traffic" is a stable
slice of the catalogue (sha256 of the env_id, so every process and every run picks the same
variants) and both policies are evaluated on it with the same seeds. The numbers:

* ``consistency`` -- the challenger's *action consistency*, the design's consistency matrix on the
  slice: the same business state (a canonical probe) on every variant and channel of the slice gets
  the same greedy action (:func:`agentflow_core.evaluation.consistency.canonical_consistency`). How
  often it agrees with the champion is reported beside it (``agreement_with_champion``), not gated:
  a policy that learnt what the champion did not must act differently where that pays;
* ``reward_gain`` -- ``(R_challenger - R_champion) / max(|R_champion|, 1e-8)`` over the mean
  *evaluated* return (risk penalty included);
* ``paired`` -- the paired difference of the evaluated return, challenger minus champion, blocked
  by variant (each variant's episodes averaged, then paired over the variants both played), with
  its 95% bounds (:func:`agentflow_core.evaluation.paired.paired_by_key`).

Promote iff ``consistency >= min_consistency`` and ``reward_gain_low >= min_reward_gain``, where
``reward_gain_low`` is the paired difference's lower 95% bound over ``max(|R_champion|, 1e-8)``: the
gain the slice shows beyond its sampling noise, not a raw difference of two means (the point
``reward_gain`` is reported beside it); with no champion the challenger is promoted ("no champion yet").
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentflow_core.evaluation.paired import PairedDifference

V = TypeVar("V")


@dataclass(frozen=True)
class PromotionDecision:
    """Whether to move the ``champion`` alias, why (with the numbers), and the numbers themselves."""

    promote: bool
    reason: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form for the run's artifacts."""
        return {"promote": self.promote, "reason": self.reason, "numbers": self.numbers}


def slice_position(env_id: str) -> float:
    """A stable position of a variant in [0, 1) (sha256, so it is the same in every process)."""
    digest = hashlib.sha256(env_id.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def champion_slice(variants: Sequence[V], fraction: float, key: Any = None) -> list[V]:
    """The variants whose stable position is below ``fraction`` (at least one: the lowest)."""
    key = key or (lambda v: v.env_id)
    if not variants:
        return []
    chosen = [v for v in variants if slice_position(key(v)) < fraction]
    return chosen or [min(variants, key=lambda v: slice_position(key(v)))]


def reward_gain(challenger_return: float, champion_return: float) -> float:
    """Relative improvement of the mean evaluated return (the denominator is ``|champion|``)."""
    return (challenger_return - champion_return) / max(abs(champion_return), 1e-8)


def decide_promotion(
    challenger_return: float,
    champion_return: float | None,
    consistency: float | None,
    min_consistency: float = 0.85,
    min_reward_gain: float = 0.05,
    paired: PairedDifference | None = None,
    agreement: float | None = None,
) -> PromotionDecision:
    """The canary rule: promote iff consistent with the champion AND the paired gain's lower bound reaches the
    margin (without ``paired`` figures nothing is shown: the champion stays)."""
    if champion_return is None:
        return PromotionDecision(
            True,
            f"no champion yet: promote the challenger (mean evaluated return {challenger_return:.3f})",
            {"challenger_return": challenger_return},
        )
    gain = reward_gain(challenger_return, champion_return)
    numbers = {
        "challenger_return": challenger_return,
        "champion_return": champion_return,
        "reward_gain": gain,
        "consistency": consistency,
        "agreement_with_champion": agreement,
        "min_consistency": min_consistency,
        "min_reward_gain": min_reward_gain,
        "paired": None if paired is None else paired.to_dict(),
    }
    consistent = consistency is not None and consistency >= min_consistency
    gain_low, bound = None, "none (no paired episodes)"
    if paired is not None:
        gain_low = paired.low / max(abs(champion_return), 1e-8)
        bound = f"{gain_low:+.1%} over {paired.pairs} variants"
    numbers["reward_gain_low"] = gain_low
    better = gain_low is not None and gain_low >= min_reward_gain
    detail = (
        f"action consistency {consistency if consistency is not None else float('nan'):.3f} "
        f"(need >= {min_consistency:.2f}{'' if agreement is None else f'; agrees with the champion on {agreement:.3f}'}), "
        f"reward {challenger_return:.3f} vs champion {champion_return:.3f}, gain {gain:+.1%}, "
        f"paired gain 95% lower bound {bound} (need >= {min_reward_gain:+.0%})"
    )
    if consistent and better:
        return PromotionDecision(True, f"promote: {detail}", numbers)
    why = [
        w
        for w, bad in (
            ("its actions are inconsistent across the slice's channels", not consistent),
            ("reward does not improve enough", not better and gain < min_reward_gain),
            ("the gain is within the slice's sampling noise", not better and gain >= min_reward_gain),
        )
        if bad
    ]
    return PromotionDecision(False, f"keep the champion ({' and '.join(why)}): {detail}", numbers)
