"""Best-checkpoint selection and the ``policy_convergence_flag``.

The catalogue's splits live in ``agentflow_core.splits``. The best checkpoint is the one with the
highest validation metric the trainer feeds :meth:`ConvergenceTracker.add` (process success, ties:
mean return; business value where the channel prices episodes). Convergence: the last ``window``
evaluations each improved the metric by less than ``min_rel_improvement`` relative to the one
before, and their variance is below ``max_variance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np


def policy_convergence_flag(
    history: Sequence[float], window: int = 3, min_rel_improvement: float = 0.003, max_variance: float = 0.02
) -> bool:
    """True when the last ``window`` evaluations improved < 0.3% each and vary < ``max_variance``."""
    if len(history) < window + 1:
        return False
    recent = np.asarray(history[-(window + 1) :], dtype=float)
    prev, cur = recent[:-1], recent[1:]
    rel = (cur - prev) / np.maximum(np.abs(prev), 1e-8)
    return bool((rel < min_rel_improvement).all() and np.var(cur) < max_variance)


@dataclass
class ConvergenceTracker:
    """Evaluation history, best-so-far and the convergence flag; JSON state for checkpoints."""

    window: int = 3
    min_rel_improvement: float = 0.003
    max_variance: float = 0.02
    history: list[float] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    best_metric: float = float("-inf")
    best_tiebreak: float = float("-inf")
    best_step: int = -1

    def add(self, step: int, metric: float, tiebreak: float = 0.0) -> bool:
        """Record one evaluation; returns True when it is the new best (ties broken by ``tiebreak``)."""
        self.history.append(float(metric))
        self.steps.append(int(step))
        if (metric, tiebreak) > (self.best_metric, self.best_tiebreak):
            self.best_metric, self.best_tiebreak, self.best_step = float(metric), float(tiebreak), int(step)
            return True
        return False

    @property
    def converged(self) -> bool:
        """The flag of :func:`policy_convergence_flag` over the evaluations so far."""
        return policy_convergence_flag(self.history, self.window, self.min_rel_improvement, self.max_variance)

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state for a checkpoint; ``-inf`` best values are stored as None."""
        state = asdict(self)
        for key in ("best_metric", "best_tiebreak"):  # JSON has no -inf
            state[key] = None if state[key] == float("-inf") else state[key]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`, turning stored None best values back into ``-inf``."""
        for key, value in state.items():
            setattr(self, key, float("-inf") if value is None and key.startswith("best_") else value)
