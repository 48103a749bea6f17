"""One masked actor-critic over the shared semantic vector, for every channel family.

Architecture and initialisation follow CleanRL ``ppo.py`` (separate Tanh MLPs for actor and
critic, orthogonal weights with gain sqrt(2), 0.01 on the policy head and 1.0 on the value head),
so the untrained policy is close to uniform over the *legal* actions. Illegal actions are masked
by replacing their logits with a large negative number before the softmax (the MaskablePPO
convention), so they get probability exactly zero and are never sampled.

Sampling uses the Gumbel-max trick with an explicit :class:`torch.Generator`: the draw is a pure
function of the generator state, which the checkpoint stores for bit-identical resume. The learner
trains it through autograd (:func:`agentflow_core.rl.ppo.ppo_minibatch_loss`), as CleanRL and SB3 do.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from agentflow_core.errors import NonFiniteError

MASKED_LOGIT = -1e9


def layer_init(layer: nn.Linear, std: float = float(np.sqrt(2)), bias_const: float = 0.0) -> nn.Linear:
    """Orthogonal weights, constant bias (CleanRL; Engstrom et al. 2020, "implementation matters")."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def _mlp(in_dim: int, hidden_sizes: Sequence[int], out_dim: int, out_std: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    prev = in_dim
    for size in hidden_sizes:
        layers += [layer_init(nn.Linear(prev, size)), nn.Tanh()]
        prev = size
    layers.append(layer_init(nn.Linear(prev, out_dim), std=out_std))
    return nn.Sequential(*layers)


def resolve_device(name: str) -> torch.device:
    """``cpu`` | ``cuda`` | ``auto`` -> a device; asking for CUDA without one is an error, not a fallback."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device(name)


class ActorCritic(nn.Module):
    """Masked categorical actor + state-value critic over ``obs_dim`` -> ``n_actions`` (the process's widths)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        self.obs_dim, self.n_actions, self.hidden_sizes = obs_dim, n_actions, tuple(hidden_sizes)
        self.critic = _mlp(obs_dim, hidden_sizes, 1, out_std=1.0)
        self.actor = _mlp(obs_dim, hidden_sizes, n_actions, out_std=0.01)

    def get_value(self, obs: torch.Tensor) -> torch.Tensor:
        """V(s), shape [B]."""
        return self.critic(obs).squeeze(-1)

    def masked_logits(self, obs: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Actor logits with illegal actions pushed to ``MASKED_LOGIT``."""
        logits = self.actor(obs)
        if mask is None:
            return logits
        return logits.masked_fill(~mask, MASKED_LOGIT)

    def get_action_and_value(
        self,
        obs: torch.Tensor,
        mask: torch.Tensor | None,
        action: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (or score a given) action: returns (action, log_prob, entropy, value)."""
        logits = self.masked_logits(obs, mask)
        log_probs = torch.log_softmax(logits, dim=-1)
        if action is None:
            # Gumbel-max: argmax(logits + G) ~ Categorical(softmax(logits)); masked logits never win.
            uniform = torch.rand(logits.shape, generator=generator, device=logits.device, dtype=logits.dtype)
            gumbel = -torch.log(-torch.log(uniform.clamp_min(1e-20)))
            action = torch.argmax(logits + gumbel, dim=-1)
        log_prob = log_probs.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)
        probs = log_probs.exp()
        entropy = -(probs * log_probs).sum(-1)
        return action, log_prob, entropy, self.get_value(obs)

    @torch.no_grad()
    def sample(
        self, obs: torch.Tensor, mask: torch.Tensor | None, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rollout inference: (action, log_prob, value), the draw of :meth:`get_action_and_value`, no graph."""
        action, log_prob, _, value = self.get_action_and_value(obs, mask, generator=generator)
        return action, log_prob, value

    @torch.no_grad()
    def act(self, obs: np.ndarray | torch.Tensor, mask: np.ndarray | torch.Tensor | None = None) -> np.ndarray:
        """Greedy (argmax) legal action(s) for evaluation; accepts one observation or a batch."""
        device = next(self.parameters()).device
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device)
        mask_t = None if mask is None else torch.as_tensor(mask, dtype=torch.bool, device=device)
        single = obs_t.dim() == 1
        if single:
            obs_t = obs_t.unsqueeze(0)
            mask_t = None if mask_t is None else mask_t.unsqueeze(0)
        actions = self.masked_logits(obs_t, mask_t).argmax(-1).cpu().numpy()
        return actions[0] if single else actions


def require_finite_parameters(model: nn.Module, step: int, stage: str) -> None:
    """Raise :class:`NonFiniteError` naming ``model``'s first parameter that holds NaN/inf."""
    for name, param in model.named_parameters():
        bad = int((~torch.isfinite(param.detach())).sum())
        if bad:
            raise NonFiniteError(step, f"parameter {name}", f"{bad} entries", stage=stage)


def policy_hash(model: nn.Module, length: int = 12) -> str:
    """Short sha256 over parameter names, shapes and bytes: identifies a policy across runs."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(name.encode())
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()[:length]
