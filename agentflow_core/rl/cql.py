"""Discrete conservative Q-learning (Kumar et al. 2020, CQL(H)) over masked actions, and its use by PPO.

The loss of one batch, with ``Q`` the online network and ``Q'`` the target network::

    y      = r + gamma * (1 - terminated) * max_{a' legal in s'} Q'(s', a')
    td     = 1/2 * (Q(s, a) - y)^2
    cql    = logsumexp_{a legal in s} Q(s, a) - Q(s, a)              (the paper's eq. 4, discrete)
    loss   = mean_w(td) + alpha * mean_w(cql)

``mean_w`` is the importance-weighted mean of prioritized replay (weights 1 without it). Illegal
actions never enter a max or a logsumexp: they are never taken in the data and never taken by the
policy, so pushing their Q down (or up) would be meaningless. The conservative term pushes down the
Q of every legal action in proportion to its softmax weight and pushes up the action the data took,
so the greedy policy of ``Q`` stays on actions the dataset supports.

The offline result reaches PPO twice (:mod:`tasks.steps.offline`): the actor is first cloned from the
successful episodes (BC), then moved toward ``pi_BC · exp(Q/temperature)`` over the legal actions
on every dataset state (:func:`improve_actor`: the KL-regularised improvement of the BC policy by the
conservative Q); and PPO's first updates are held near that policy by :class:`OfflinePrior`, a ``KL(pi || pi_offline)`` term whose coefficient decays
linearly to zero.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from agentflow_core.errors import NonFiniteError
from agentflow_core.rl.offline_data import Transitions
from agentflow_core.rl.policy import MASKED_LOGIT, ActorCritic, layer_init, require_finite_parameters
from agentflow_core.rl.replay import PrioritizedReplay

CQL_STAGE, IMPROVE_STAGE = "CQL gradient step", "actor-improvement step"


class QNetwork(nn.Module):
    """``Q(s, .)`` over every action: a Tanh MLP like the actor's (CleanRL initialisation)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden_sizes: Sequence[int] = (64, 64)):
        super().__init__()
        layers: list[nn.Module] = []
        prev = obs_dim
        for size in hidden_sizes:
            layers += [layer_init(nn.Linear(prev, size)), nn.Tanh()]
            prev = size
        layers.append(layer_init(nn.Linear(prev, n_actions), std=1.0))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q values, shape ``[B, n_actions]``."""
        return self.net(obs)


def masked_q(q: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Q with illegal actions at ``MASKED_LOGIT`` (out of every max, logsumexp and softmax)."""
    return q.masked_fill(~mask, MASKED_LOGIT)


def cql_loss(
    q_values: torch.Tensor,
    next_q_target: torch.Tensor,
    mask: torch.Tensor,
    next_mask: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    *,
    gamma: float,
    alpha: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The discrete CQL(H) loss of one batch: returns ``(loss, td_loss, cql_penalty, td_error [B])``.

    ``q_values`` and ``next_q_target`` are ``[B, A]`` (Q(s, .) with grad, Q'(s', .) without).
    """
    q_data = q_values.gather(1, action.long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        next_v = masked_q(next_q_target, next_mask).max(1).values
        target = reward + gamma * torch.where(terminated, 0.0, next_v)
    td_error = q_data - target
    w = torch.ones_like(q_data) if weights is None else weights
    td_loss = (w * 0.5 * td_error.pow(2)).sum() / w.sum()
    penalty = (w * (torch.logsumexp(masked_q(q_values, mask), dim=1) - q_data)).sum() / w.sum()
    return td_loss + alpha * penalty, td_loss.detach(), penalty.detach(), td_error.detach()


@dataclass(frozen=True)
class CQLSettings:
    """The offline learner's settings (the ``offline`` section of params.yaml supplies them)."""

    gradient_steps: int = 1500
    batch_size: int = 256
    learning_rate: float = 1e-3
    gamma: float = 0.99
    alpha: float = 1.0
    target_update_every: int = 100
    max_grad_norm: float = 10.0
    hidden_sizes: tuple[int, ...] = (64, 64)
    prioritized: bool = True
    priority_alpha: float = 0.6
    priority_beta: float = 0.4
    freshness_decay: float = 0.5


@dataclass
class CQLResult:
    """The trained Q network and its loss curve (means over windows of 100 steps)."""

    q: QNetwork
    td_loss: list[float] = field(default_factory=list)
    cql_penalty: list[float] = field(default_factory=list)
    replay_draws_newest_share: float = float("nan")  # share of draws from the newest cycle (age < 1)


def _tensors(data: Transitions, device: torch.device) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.as_tensor(data.obs, device=device),
        "mask": torch.as_tensor(data.mask, device=device),
        "action": torch.as_tensor(data.action, device=device),
        "reward": torch.as_tensor(data.reward, device=device),
        "next_obs": torch.as_tensor(data.next_obs, device=device),
        "next_mask": torch.as_tensor(data.next_mask, device=device),
        "terminated": torch.as_tensor(data.terminated, device=device),
    }


def train_cql(data: Transitions, settings: CQLSettings, seed: int, device: torch.device | str = "cpu") -> CQLResult:
    """Fit ``Q`` to ``data`` by discrete CQL; batches drawn by prioritized replay (or uniformly)."""
    if len(data) == 0:
        raise ValueError("no transitions to learn from")
    device = torch.device(device)
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    q = QNetwork(data.obs.shape[1], data.mask.shape[1], settings.hidden_sizes).to(device)
    torch.random.set_rng_state(generator_state)  # leave the caller's global generator where it was
    target = copy.deepcopy(q).requires_grad_(False)
    optimizer = torch.optim.Adam(q.parameters(), lr=settings.learning_rate)
    rng = np.random.default_rng(seed)
    replay = (
        PrioritizedReplay(
            data.age, alpha=settings.priority_alpha, beta=settings.priority_beta, decay=settings.freshness_decay
        )
        if settings.prioritized
        else None
    )
    t = _tensors(data, device)
    for name in ("obs", "reward", "next_obs"):
        bad = ~torch.isfinite(t[name].reshape(len(data), -1)).all(dim=1)
        if bool(bad.any()):
            detail = f"{int(bad.sum())} transitions, first {int(torch.nonzero(bad)[0])}"
            raise NonFiniteError(1, f"{name} in the data", detail, stage=CQL_STAGE)
    result = CQLResult(q)
    window_td, window_cql, newest = [], [], 0
    for step in range(settings.gradient_steps):
        if replay is not None:
            drawn = replay.sample(settings.batch_size, rng)
            idx_np, weights = drawn.indices, torch.as_tensor(drawn.weights, dtype=torch.float32, device=device)
        else:
            idx_np, weights = rng.integers(len(data), size=settings.batch_size), None
        newest += int((data.age[idx_np] < 1.0).sum())
        idx = torch.as_tensor(idx_np, device=device)
        with torch.no_grad():
            next_q = target(t["next_obs"][idx])
        loss, td, penalty, td_error = cql_loss(
            q(t["obs"][idx]),
            next_q,
            t["mask"][idx],
            t["next_mask"][idx],
            t["action"][idx],
            t["reward"][idx],
            t["terminated"][idx],
            gamma=settings.gamma,
            alpha=settings.alpha,
            weights=weights,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(q.parameters(), settings.max_grad_norm)
        for name, value in (("TD loss", td), ("CQL penalty", penalty), ("gradient norm", grad_norm)):
            if not math.isfinite(float(value)):
                raise NonFiniteError(step + 1, name, f"{float(value)}", stage=CQL_STAGE)
        optimizer.step()
        if replay is not None:
            replay.update(idx_np, td_error.cpu().numpy())
        if (step + 1) % settings.target_update_every == 0:
            target.load_state_dict(q.state_dict())
        window_td.append(float(td))
        window_cql.append(float(penalty))
        if len(window_td) == 100 or step == settings.gradient_steps - 1:
            result.td_loss.append(float(np.mean(window_td)))
            result.cql_penalty.append(float(np.mean(window_cql)))
            window_td, window_cql = [], []
    require_finite_parameters(q, settings.gradient_steps, CQL_STAGE)
    result.replay_draws_newest_share = newest / (settings.gradient_steps * settings.batch_size)
    return result


@torch.no_grad()
def td_error_on(q: QNetwork, data: Transitions, gamma: float, alpha: float) -> dict[str, float]:
    """Held-out diagnostics of a trained ``Q`` (target = ``Q`` itself): TD loss, CQL penalty, agreement."""
    device = next(q.parameters()).device
    t = _tensors(data, device)
    q_values = q(t["obs"])
    _, td, penalty, _ = cql_loss(
        q_values,
        q(t["next_obs"]),
        t["mask"],
        t["next_mask"],
        t["action"],
        t["reward"],
        t["terminated"],
        gamma=gamma,
        alpha=alpha,
    )
    agree = (masked_q(q_values, t["mask"]).argmax(1) == t["action"]).float().mean()
    return {"td_loss": float(td), "cql_penalty": float(penalty), "data_action_agreement": float(agree)}


@dataclass(frozen=True)
class ImproveResult:
    """How far the actor moved toward pi* ∝ pi_BC · exp(Q/T): KL(pi* || actor) before and after, greedy agreement."""

    steps: int
    kl_before: float
    kl_after: float
    greedy_agreement: float


def _kl_to_actor(actor: ActorCritic, obs: torch.Tensor, mask: torch.Tensor, target_logp: torch.Tensor) -> torch.Tensor:
    logp = torch.log_softmax(actor.masked_logits(obs, mask), dim=-1)
    return (target_logp.exp() * (target_logp - logp)).masked_fill(~mask, 0.0).sum(-1).mean()


def improve_actor(
    actor: ActorCritic,
    q: QNetwork,
    obs: np.ndarray,
    mask: np.ndarray,
    *,
    temperature: float,
    steps: int,
    batch_size: int = 256,
    learning_rate: float = 1e-3,
    seed: int = 0,
) -> ImproveResult:
    """Move the actor toward ``pi* ∝ pi_start · exp(Q / temperature)`` on the dataset's states.

    ``pi*`` is the closed-form maximiser of ``E_pi[Q] - temperature · KL(pi || pi_start)`` (the
    KL-regularised policy improvement step of AWR/MPO-style methods), with ``pi_start`` the actor as
    it comes in (behaviour cloning's): where BC is confident, Q must disagree by more than its
    log-probability margin to move it; where BC is unsure, Q decides. The actor minimises
    ``KL(pi* || pi)``; only its weights change (the critic is PPO's to fit).
    """
    device = next(actor.parameters()).device
    obs_t = torch.as_tensor(obs, dtype=torch.float32, device=device)
    mask_t = torch.as_tensor(mask, dtype=torch.bool, device=device)
    with torch.no_grad():
        start_logp = torch.log_softmax(actor.masked_logits(obs_t, mask_t), dim=-1)
        improved = masked_q(start_logp + q.to(device)(obs_t) / temperature, mask_t)
        target_logp = torch.log_softmax(improved, dim=-1)
        kl_before = float(_kl_to_actor(actor, obs_t, mask_t, target_logp))
    optimizer = torch.optim.Adam(actor.actor.parameters(), lr=learning_rate)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        idx = torch.as_tensor(rng.integers(len(obs_t), size=batch_size), device=device)
        loss = _kl_to_actor(actor, obs_t[idx], mask_t[idx], target_logp[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        kl_after = float(_kl_to_actor(actor, obs_t, mask_t, target_logp))
    if not math.isfinite(kl_after):
        raise NonFiniteError(steps, "KL to the improved policy", f"{kl_after}", stage=IMPROVE_STAGE)
    require_finite_parameters(actor.actor, steps, IMPROVE_STAGE)
    with torch.no_grad():
        agreement = float((actor.masked_logits(obs_t, mask_t).argmax(-1) == target_logp.argmax(-1)).float().mean())
    return ImproveResult(steps, kl_before, kl_after, agreement)


class OfflinePrior:
    """PPO's pull toward the offline policy: ``coef(update) * KL(pi || pi_offline)``, ``coef`` decaying to 0.

    ``coef(u) = kl_coef * max(0, 1 - u / decay_updates)``: full strength at the first update, none after
    ``decay_updates``, so online learning starts near the offline policy and is then free. The
    reference is frozen; the coefficient depends only on the update counter (checkpointed), so a
    resumed run adds the same term as an uninterrupted one.
    """

    def __init__(self, reference: ActorCritic, kl_coef: float, decay_updates: int) -> None:
        self.reference = copy.deepcopy(reference).requires_grad_(False)
        self.kl_coef, self.decay_updates = kl_coef, decay_updates

    def coef(self, update: int) -> float:
        """The KL weight at PPO update ``update`` (0-based)."""
        return self.kl_coef * max(0.0, 1.0 - update / self.decay_updates)

    def penalty(
        self, policy: ActorCritic, obs: torch.Tensor, mask: torch.Tensor, update: int
    ) -> tuple[torch.Tensor, float]:
        """``(coef * KL(pi || pi_offline) averaged over the minibatch, KL)``; zero without a graph once decayed."""
        coef = self.coef(update)
        if coef == 0.0:
            return torch.zeros((), device=obs.device), float("nan")
        self.reference.to(obs.device)
        logp = torch.log_softmax(policy.masked_logits(obs, mask), dim=-1)
        with torch.no_grad():
            ref_logp = torch.log_softmax(self.reference.masked_logits(obs, mask), dim=-1)
        kl = (logp.exp() * (logp - ref_logp)).masked_fill(~mask, 0.0).sum(-1).mean()
        return coef * kl, float(kl.detach())


def actor_state(actor: ActorCritic) -> dict[str, torch.Tensor]:
    """The actor's weights (the part the offline stage hands to training)."""
    return {k: v.detach().cpu().contiguous() for k, v in actor.state_dict().items() if k.startswith("actor.")}


def load_actor(policy: ActorCritic, state: dict[str, torch.Tensor]) -> None:
    """Load actor weights into ``policy``, leaving its critic as it is."""
    missing = [k for k in policy.state_dict() if k.startswith("actor.") and k not in state]
    if missing:
        raise KeyError(f"offline actor weights miss {missing[:3]}")
    policy.load_state_dict({**policy.state_dict(), **{k: v for k, v in state.items() if k.startswith("actor.")}})
