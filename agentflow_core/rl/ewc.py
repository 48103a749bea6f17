"""Elastic weight consolidation (Kirkpatrick et al. 2017) for retrains: the champion's diagonal Fisher and the penalty.

A retrain continues PPO from the champion on a catalogue that may have shifted. EWC keeps the
weights that mattered for the champion's own behaviour near their old values: it adds
``lam / 2 * sum_i F_i (theta_i - theta*_i)^2`` to the loss, where ``theta*`` is the champion and
``F_i`` the diagonal of the Fisher information of the champion's policy,

    F_i = E_{s ~ D} E_{a ~ pi*(.|s)} [ (d log pi*(a|s) / d theta_i)^2 ],

with ``D`` the champion's data (states of its cycle's trajectories). The inner expectation is
exact: every legal action is weighted by its probability (no sampling), so the estimate depends
on the states only. The critic is not part of ``log pi`` and gets ``F = 0``: the value function
is free to re-fit the new catalogue's returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from torch.func import functional_call, grad, vmap

from agentflow_core.atomic import atomic_file
from agentflow_core.rl.policy import MASKED_LOGIT, ActorCritic

FISHER_FILE = "fisher.safetensors"


def fisher_diagonal(
    policy: ActorCritic, obs: np.ndarray, masks: np.ndarray, batch_size: int = 1024
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher information of ``policy``'s masked action distribution, averaged over the states ``obs``.

    Per state ``s`` and legal action ``a``: the squared per-sample gradient of ``log pi(a|s)``
    weighted by ``pi(a|s)`` (``torch.func.vmap`` over states, a loop over the 12 actions).
    Returns one tensor per named parameter of the policy (zeros for the critic).
    """
    fisher = {k: torch.zeros_like(v.detach()) for k, v in policy.named_parameters()}
    if len(obs) == 0:
        return fisher
    actor = {k: v.detach() for k, v in policy.actor.named_parameters()}
    # copies: the arrays may be read-only views (a parquet read), which torch must not wrap
    obs_t = torch.tensor(np.asarray(obs), dtype=torch.float32)
    mask_t = torch.tensor(np.asarray(masks), dtype=torch.bool)

    def log_prob(p: dict[str, torch.Tensor], o: torch.Tensor, m: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        logits = functional_call(policy.actor, p, (o.unsqueeze(0),)).masked_fill(~m.unsqueeze(0), MASKED_LOGIT)
        return torch.log_softmax(logits, dim=-1)[0, a]

    per_sample = vmap(grad(log_prob), in_dims=(None, 0, 0, None))
    with torch.no_grad():
        probs = torch.softmax(policy.masked_logits(obs_t, mask_t), dim=-1) * mask_t
    for start in range(0, len(obs_t), batch_size):
        o, m = obs_t[start : start + batch_size], mask_t[start : start + batch_size]
        pr = probs[start : start + batch_size]
        for a in range(policy.n_actions):
            weight = pr[:, a]
            if not bool((weight > 0).any()):
                continue
            grads = per_sample(actor, o, m, torch.tensor(a))
            for name, g in grads.items():
                w = weight.reshape(-1, *([1] * (g.dim() - 1)))
                fisher[f"actor.{name}"] += (w * g.pow(2)).sum(0)
    return {k: v / len(obs_t) for k, v in fisher.items()}


@dataclass
class EWCPenalty:
    """``lam / 2 * sum_i F_i (theta_i - theta*_i)^2`` over the parameters named in ``fisher``."""

    fisher: dict[str, torch.Tensor]
    anchor: dict[str, torch.Tensor]
    lam: float

    def __call__(self, policy: nn.Module) -> torch.Tensor:
        """The penalty for ``policy``'s current weights (differentiable)."""
        total = torch.zeros(())
        for name, param in policy.named_parameters():
            f = self.fisher.get(name)
            if f is None:
                continue
            total = total + (f.to(param.device) * (param - self.anchor[name].to(param.device)).pow(2)).sum()
        return 0.5 * self.lam * total

    def save(self, path: Path) -> None:
        """Fisher and anchor in one safetensors file (``fisher/<name>``, ``anchor/<name>``)."""
        tensors = {f"fisher/{k}": v.contiguous() for k, v in self.fisher.items()}
        tensors |= {f"anchor/{k}": v.contiguous() for k, v in self.anchor.items()}
        with atomic_file(path) as tmp:
            save_file(tensors, str(tmp))

    @classmethod
    def load(cls, path: Path, lam: float) -> EWCPenalty:
        """Read what :meth:`save` wrote, with the strength ``lam`` of this run."""
        tensors = load_file(str(path))
        fisher = {k.removeprefix("fisher/"): v for k, v in tensors.items() if k.startswith("fisher/")}
        anchor = {k.removeprefix("anchor/"): v for k, v in tensors.items() if k.startswith("anchor/")}
        if set(fisher) != set(anchor):
            raise ValueError(f"{path}: fisher and anchor name different parameters")
        return cls(fisher, anchor, lam)

    def summary(self) -> dict[str, float]:
        """Size of the Fisher: total, max and the share of the actor's weights with F above 1% of the max."""
        flat = torch.cat([v.reshape(-1) for v in self.fisher.values()]) if self.fisher else torch.zeros(1)
        peak = float(flat.max())
        return {
            "ewc/fisher_sum": float(flat.sum()),
            "ewc/fisher_max": peak,
            "ewc/fisher_active_share": float((flat > 0.01 * peak).float().mean()) if peak > 0 else 0.0,
            "ewc/lam": self.lam,
        }


def champion_penalty(policy: ActorCritic, obs: np.ndarray, masks: np.ndarray, lam: float) -> EWCPenalty:
    """The penalty anchored at ``policy`` (the champion), its Fisher over the states ``obs``."""
    anchor = {k: v.detach().clone() for k, v in policy.named_parameters()}
    return EWCPenalty(fisher_diagonal(policy, obs, masks), anchor, lam)
