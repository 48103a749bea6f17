"""Training's shaping terms for the key states mined from the exploration data (``train.reward.auto_shaping``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from agentflow_core.config import ShapingTerm
from agentflow_core.rl.key_states import KeyStateLimits, mine_key_states
from agentflow_core.rl.trajectories import iter_episodes
from agentflow_core.splits import read_splits
from tasks.context import PhaseContext


def auto_shaped(
    ctx: PhaseContext, catalogue_path: Path, trajectories_dir: Path | None
) -> tuple[PhaseContext, list[dict[str, Any]]]:
    """``ctx`` with the mined terms appended to ``train.reward.shaping``, and the key states as records.

    Only the train split's episodes are mined (validation and test variants stay out of training).
    Without ``auto_shaping`` or without exploration data, ``ctx`` is returned unchanged.
    """
    rc = ctx.cfg.train.reward
    if not rc.auto_shaping or trajectories_dir is None or not Path(trajectories_dir).exists():
        return ctx, []
    vocab = ctx.vocabulary
    accepted = {v.content_hash: vocab.accepted_outcomes(v.params) for v in read_splits(catalogue_path)["train"]}
    limits = KeyStateLimits(weight=rc.auto_shaping_weight)
    keys = mine_key_states(iter_episodes(Path(trajectories_dir), vocabulary=vocab), accepted, limits)
    terms = [
        ShapingTerm.model_validate({"condition": k.token, "reward": k.reward}, context={"vocabulary": vocab})
        for k in keys
    ]
    reward = rc.model_copy(update={"shaping": [*rc.shaping, *terms]})
    cfg = ctx.cfg.model_copy(update={"train": ctx.cfg.train.model_copy(update={"reward": reward})})
    return dataclasses.replace(ctx, cfg=cfg), [dataclasses.asdict(k) for k in keys]
