"""Behaviour-cloning warm start: imitate the goal-reaching exploration episodes before PPO.

Cross-entropy on the actor's *masked* logits (the same masking PPO samples with), so the cloned
policy never puts mass on illegal actions and the loss does not waste capacity on them. Only the
actor is trained: the critic is left to PPO, whose first rollouts fit it to the real returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from agentflow_core.errors import NonFiniteError
from agentflow_core.rl.policy import ActorCritic, require_finite_parameters

STAGE = "behaviour-cloning epoch"


@dataclass(frozen=True)
class BCResult:
    """Per-epoch mean loss and final training accuracy (share of rows where argmax = demonstrated action)."""

    samples: int
    epochs: int
    losses: list[float]
    accuracy: float


def behaviour_cloning(
    policy: ActorCritic,
    obs: np.ndarray,
    actions: np.ndarray,
    masks: np.ndarray,
    *,
    epochs: int = 10,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    seed: int = 0,
    min_steps: int = 500,
) -> BCResult:
    """Fit the actor to (obs, action) pairs by masked cross-entropy; returns the loss curve.

    Runs at least ``min_steps`` gradient steps (more epochs on small datasets), so a few hundred
    demonstration rows are not left underfit by a fixed epoch count. A non-finite observation,
    epoch loss or final weight raises :class:`NonFiniteError` naming it.
    """
    n = len(actions)
    if n == 0:
        return BCResult(0, 0, [], float("nan"))
    epochs = max(epochs, -(-min_steps // -(-n // batch_size)))
    bad_rows = np.flatnonzero(~np.isfinite(np.asarray(obs, dtype=np.float32)).all(axis=1))
    if len(bad_rows):
        raise NonFiniteError(1, "observations", f"{len(bad_rows)} rows, first row {int(bad_rows[0])}", stage=STAGE)
    device = next(policy.parameters()).device
    obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device)
    act_t = torch.as_tensor(actions, dtype=torch.long, device=device)
    mask_t = torch.as_tensor(masks, dtype=torch.bool, device=device)
    mask_t = mask_t | F.one_hot(act_t, mask_t.shape[1]).bool()  # a demonstrated action is legal by definition
    optimizer = torch.optim.Adam(policy.actor.parameters(), lr=learning_rate)
    rng = np.random.default_rng(seed)
    losses: list[float] = []
    for _ in range(epochs):
        perm = torch.as_tensor(rng.permutation(n), device=device)
        epoch_loss = torch.zeros((), device=device)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            loss = F.cross_entropy(policy.masked_logits(obs_t[idx], mask_t[idx]), act_t[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach() * len(idx)
        losses.append(float(epoch_loss) / n)
        if not np.isfinite(losses[-1]):
            raise NonFiniteError(len(losses), "loss", f"mean over the epoch {losses[-1]}", stage=STAGE)
    require_finite_parameters(policy.actor, epochs, STAGE)
    with torch.no_grad():
        accuracy = float((policy.masked_logits(obs_t, mask_t).argmax(-1) == act_t).float().mean())
    return BCResult(n, epochs, losses, accuracy)
