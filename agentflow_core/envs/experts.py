"""Scripted expert policies: the funnel plus the recovery rules, as the reference of what is achievable.

The expert reads only the semantic observation, so the same rules drive every channel through
its adapter; a family whose mapping is wrong shows up as an expert that cannot finish. Each
family gets its own :class:`ScriptedExpert` (``expert_for``) so a channel with different recovery
needs can override a rule without touching the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agentflow_core.semantics import CHECKOUT, SemanticAction, Vocabulary

A = SemanticAction

# (token that must be present, action) in priority order: recoveries first, then the funnel.
DEFAULT_RULES: tuple[tuple[str, SemanticAction], ...] = (
    ("USER_BLOCKED", A.ESCALATE),
    ("NETWORK_TIMEOUT", A.RETRY),
    ("SERVER_ERROR", A.RETRY),
    ("PAGE_NOT_FOUND", A.RETRY),
    ("SESSION_EXPIRED", A.LOGIN),
    ("LOGGED_OUT", A.LOGIN),
    ("INSUFFICIENT_FUNDS", A.TOP_UP_FUNDS),
    ("INVALID_CARD", A.USE_BACKUP_CARD),
    ("PAYMENT_FAILED", A.USE_BACKUP_CARD),
    ("FUNDS_TOPPED_UP", A.SUBMIT_PAYMENT),
    ("PAYMENT_PAGE", A.SUBMIT_PAYMENT),
    ("ORDER_EXPIRED", A.CHECKOUT),
    ("ORDER_PENDING", A.ENTER_PAYMENT),
    ("CART_FILLED", A.CHECKOUT),
    ("OUT_OF_STOCK", A.VIEW_PRODUCT),
    ("PRODUCT_VIEWED", A.ADD_TO_CART),
)


@dataclass(frozen=True)
class ScriptedExpert:
    """Priority rules over tokens; falls back to ``fallback`` (VIEW_PRODUCT), then to any legal action.

    A process loaded from data (:mod:`agentflow_core.process`) builds its expert with its own rules,
    fallback and vocabulary; the defaults are the checkout process's.
    """

    family: str = "any"
    rules: Sequence[tuple[str, int]] = field(default=DEFAULT_RULES)
    fallback: int = int(A.VIEW_PRODUCT)
    vocabulary: Vocabulary = field(default=CHECKOUT, repr=False)

    def act(self, obs: np.ndarray, mask: np.ndarray | None = None) -> int:
        """Choose the semantic action for one encoded observation."""
        tokens = self.vocabulary.decode_tokens(obs)
        for token, action in self.rules:
            if token in tokens and (mask is None or mask[action]):
                return int(action)
        if mask is None or mask[self.fallback]:
            return int(self.fallback)
        return int(np.flatnonzero(mask)[0])

    def act_batch(self, obs: np.ndarray, masks: np.ndarray | None = None) -> np.ndarray:
        """Vectorised over a batch of observations (pools step many envs per call)."""
        return np.array(
            [
                self.act(o, None if masks is None else m)
                for o, m in zip(obs, masks if masks is not None else [None] * len(obs), strict=True)
            ],
            dtype=np.int64,
        )


_EXPERTS: dict[str, ScriptedExpert] = {
    "web_checkout": ScriptedExpert("web_checkout"),
    "order_db": ScriptedExpert("order_db"),
    "payment_api": ScriptedExpert("payment_api"),
}


def expert_for(family: str) -> ScriptedExpert:
    """The scripted expert of one env family (a generic one for families without their own)."""
    return _EXPERTS.get(family, ScriptedExpert(family))
