"""PPO's math as pure functions (CleanRL ``ppo.py`` names): GAE, the clipped surrogate, value loss, diagnostics.

:class:`~agentflow_core.rl.ppo.PPO` composes them into an update; tests hold each to hand-computed
cases (tests/test_ppo.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from agentflow_core.rl.policy import ActorCritic


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016) for SAME_STEP autoreset rollouts.

    All inputs are ``[T, N]`` except ``next_value`` (``[N]``, V of the observation after the last
    step). Row ``t`` holds the transition (s_t, a_t, r_t) and whether *that* step ended the episode.
    On termination the target is r_t; on truncation r_t + gamma * V(final_obs_t) (the episode was
    cut, not finished, so its future value is still owed); the GAE chain stops at both.
    Returns (advantages, returns), returns = advantages + values.
    """
    n_steps = rewards.shape[0]
    done = (terminated | truncated).to(rewards.dtype)
    bootstrap = (truncated & ~terminated).to(rewards.dtype)
    rewards = rewards + gamma * final_values * bootstrap
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(n_steps)):
        nextvalues = next_value if t == n_steps - 1 else values[t + 1]
        nextnonterminal = 1.0 - done[t]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def clipped_policy_loss(advantages: torch.Tensor, ratio: torch.Tensor, clip_range: float) -> torch.Tensor:
    """PPO-clip surrogate, negated for minimisation: mean(max(-A r, -A clip(r, 1-e, 1+e)))."""
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1.0 - clip_range, 1.0 + clip_range)
    return torch.max(pg_loss1, pg_loss2).mean()


def value_loss(new_values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """0.5 * mean squared error to the GAE returns (unclipped, the SB3 default)."""
    return 0.5 * ((new_values - returns) ** 2).mean()


def approx_kl(logratio: torch.Tensor) -> torch.Tensor:
    """KL(old || new) estimate mean((r - 1) - log r): unbiased, non-negative (Schulman, "Approximating KL")."""
    return ((logratio.exp() - 1.0) - logratio).mean()


def clip_fraction(ratio: torch.Tensor, clip_range: float) -> torch.Tensor:
    """Share of samples whose ratio left [1-e, 1+e]."""
    return ((ratio - 1.0).abs() > clip_range).float().mean()


def normalize_advantages(advantages: torch.Tensor) -> torch.Tensor:
    """Per-minibatch standardisation (CleanRL ``norm_adv``)."""
    return (advantages - advantages.mean()) / (advantages.std() + 1e-8)


def explained_variance(y_pred: torch.Tensor, y_true: torch.Tensor) -> float:
    """1 - Var[y - y_pred] / Var[y]: how much of the return variance the critic explains."""
    var_y = torch.var(y_true)
    return float("nan") if var_y == 0 else float(1.0 - torch.var(y_true - y_pred) / var_y)


@dataclass(frozen=True)
class LossCoefficients:
    """The scalars of one PPO minibatch loss: clip range, entropy/value/KL-penalty weights."""

    clip_range: float
    ent_coef: float
    vf_coef: float
    kl_coef: float = 0.0


STAT_KEYS = (
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/old_approx_kl",
    "losses/clipfrac",
)


def ppo_minibatch_loss(
    policy: ActorCritic,
    obs: torch.Tensor,
    mask: torch.Tensor | None,
    actions: torch.Tensor,
    old_logprob: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    coef: LossCoefficients,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference (autograd) PPO loss of one minibatch: (loss, stats [6] in ``STAT_KEYS`` order)."""
    _, newlogprob, entropy, newvalue = policy.get_action_and_value(obs, mask, actions)
    logratio = newlogprob - old_logprob
    ratio = logratio.exp()
    pg_loss = clipped_policy_loss(normalize_advantages(advantages), ratio, coef.clip_range)
    v_loss = value_loss(newvalue, returns)
    entropy_loss = entropy.mean()
    kl = approx_kl(logratio)
    loss = pg_loss - coef.ent_coef * entropy_loss + coef.vf_coef * v_loss
    if coef.kl_coef > 0.0:
        loss = loss + coef.kl_coef * kl
    with torch.no_grad():
        stats = torch.stack(
            [pg_loss, v_loss, entropy_loss, kl, (-logratio).mean(), clip_fraction(ratio, coef.clip_range)]
        )
    return loss, stats
