"""Scripted expert policies: the funnel plus the recovery rules, as the reference of what is achievable.

The expert reads only the semantic observation, so the same rules drive every channel through
its adapter; a family whose mapping is wrong shows up as an expert that cannot finish. A process
loaded from data builds its own (:meth:`agentflow_core.process.ProcessSpec.expert`); this module also
spells out checkout's, one per checkout family (``expert_for``), so a channel with different recovery
needs can override a rule without touching the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from agentflow_core.semantics import CHECKOUT, Vocabulary

# The checkout expert (configs/processes/checkout.yaml declares the same rules): (token that must be
# present, action) in priority order, recoveries first, then the funnel.
_CHECKOUT_RULES: tuple[tuple[str, str], ...] = (
    ("USER_BLOCKED", "ESCALATE"),
    ("NETWORK_TIMEOUT", "RETRY"),
    ("SERVER_ERROR", "RETRY"),
    ("PAGE_NOT_FOUND", "RETRY"),
    ("SESSION_EXPIRED", "LOGIN"),
    ("LOGGED_OUT", "LOGIN"),
    ("INSUFFICIENT_FUNDS", "TOP_UP_FUNDS"),
    ("INVALID_CARD", "USE_BACKUP_CARD"),
    ("PAYMENT_FAILED", "USE_BACKUP_CARD"),
    ("FUNDS_TOPPED_UP", "SUBMIT_PAYMENT"),
    ("PAYMENT_PAGE", "SUBMIT_PAYMENT"),
    ("ORDER_EXPIRED", "CHECKOUT"),
    ("ORDER_PENDING", "ENTER_PAYMENT"),
    ("CART_FILLED", "CHECKOUT"),
    ("OUT_OF_STOCK", "VIEW_PRODUCT"),
    ("PRODUCT_VIEWED", "ADD_TO_CART"),
)
DEFAULT_RULES: tuple[tuple[str, int], ...] = tuple((t, CHECKOUT.action_id(a)) for t, a in _CHECKOUT_RULES)


@dataclass(frozen=True)
class ScriptedExpert:
    """Priority rules over tokens; falls back to ``fallback``, then to any legal action.

    Every part is the process's own (its rules, fallback and vocabulary): there is no default process.
    """

    family: str
    rules: Sequence[tuple[str, int]]
    fallback: int
    vocabulary: Vocabulary = field(repr=False)

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


def expert_for(family: str) -> ScriptedExpert:
    """Checkout's scripted expert for one of its env families (``"any"``: the family-independent one)."""
    return ScriptedExpert(family, DEFAULT_RULES, CHECKOUT.action_id("VIEW_PRODUCT"), CHECKOUT)
