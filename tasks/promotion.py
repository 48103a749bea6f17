"""Champion/challenger: decide whether the last training run's best checkpoint replaces the champion.

The canary (consistency and reward gain on a slice of the variants,
:func:`tasks.steps.report.run_champion_challenger`), for a retrain the paired held-out comparison
(:func:`tasks.retrain.paired_decision`), then the registration in the MLflow Model Registry
(:func:`tasks.model_registry.register_candidate`).
"""

from __future__ import annotations

from typing import Any

from tasks.context import PhaseContext
from tasks.model_registry import candidate_checkpoint, champion_checkpoint, register_candidate
from tasks.retrain import paired_decision
from tasks.steps.report import run_champion_challenger
from tasks.tracking import MlflowTracker


def promote_if_better(
    ctx: PhaseContext, tracker: MlflowTracker, train_run_id: str, allowed: bool = True, paired: bool = False
) -> dict[str, Any]:
    """Register the candidate; move the ``champion`` alias to it only if the canary test passes.

    ``allowed=False`` (the candidate failed stress validation) registers it without promoting.
    ``paired=True`` (a retrain) adds the paired held-out comparison after a passed canary
    (:func:`tasks.retrain.paired_decision`): promoted only if it beats the champion there too.
    """
    challenger = candidate_checkpoint(ctx)
    champion = champion_checkpoint(tracker, ctx.cfg.base.tracking.registered_model)
    decision = run_champion_challenger(ctx, challenger, champion)
    if paired and champion is not None:
        decision = paired_decision(ctx, challenger, champion, decision)
    if not allowed:
        decision = {
            **decision,
            "promote": False,
            "reason": f"not promoted: the candidate failed stress validation ({decision['reason']})",
        }
    return register_candidate(ctx, tracker, train_run_id, challenger, decision)
