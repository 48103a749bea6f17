"""EWC (agentflow_core.rl.ewc): the Fisher on hand-checkable cases, the penalty and its gradient, PPO with it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from agentflow_core.config import TrainConfig
from agentflow_core.rl.ewc import EWCPenalty, champion_penalty, fisher_diagonal
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.ppo import PPO
from agentflow_core.semantics import N_ACTIONS, OBS_DIM
from tests.test_ppo import KeyChainPool, small_cfg


def _policy(seed: int = 0, hidden: tuple[int, ...] = (4,)) -> ActorCritic:
    torch.manual_seed(seed)
    policy = ActorCritic(obs_dim=3, n_actions=3, hidden_sizes=hidden)
    with torch.no_grad():  # larger output weights than the 0.01 init, so pi is far from uniform
        policy.actor[-1].weight.mul_(200.0)
    return policy


def test_output_layer_fisher_is_pi_times_one_minus_pi() -> None:
    # d log pi(a|s) / d b_j = 1[j=a] - pi_j, so E_a~pi[(.)^2] = pi_j (1 - pi_j) for the output bias and
    # pi_j (1 - pi_j) h_k^2 for the output weight W_jk (h: the last hidden activation); masked actions: 0.
    policy = _policy()
    obs = np.array([[1.0, 0.0, 0.5], [0.0, 1.0, -1.0]], np.float32)
    masks = np.array([[True, True, True], [True, False, True]])
    fisher = fisher_diagonal(policy, obs, masks)
    with torch.no_grad():
        pi = torch.softmax(policy.masked_logits(torch.as_tensor(obs), torch.as_tensor(masks)), -1)
        hidden = policy.actor[:-1](torch.as_tensor(obs))
    expected_bias = (pi * (1 - pi)).mean(0)
    expected_weight = ((pi * (1 - pi)).unsqueeze(-1) * hidden.pow(2).unsqueeze(1)).mean(0)
    last = f"actor.{len(policy.actor) - 1}"
    assert torch.allclose(fisher[f"{last}.bias"], expected_bias, atol=1e-6)
    assert torch.allclose(fisher[f"{last}.weight"], expected_weight, atol=1e-6)
    assert float(pi[1, 1]) < 1e-6 and float(fisher[f"{last}.bias"][1]) == float(expected_bias[1])
    assert all(float(v.abs().sum()) == 0.0 for k, v in fisher.items() if k.startswith("critic."))


def test_fisher_matches_a_per_state_per_action_autograd_loop() -> None:
    policy = _policy(seed=3, hidden=(5, 4))
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(6, 3)).astype(np.float32)
    masks = rng.random((6, 3)) > 0.3
    masks[:, 0] = True
    fisher = fisher_diagonal(policy, obs, masks, batch_size=4)  # two batches
    reference = {k: torch.zeros_like(v) for k, v in policy.named_parameters()}
    for o, m in zip(obs, masks, strict=True):
        logp = torch.log_softmax(policy.masked_logits(torch.as_tensor(o)[None], torch.as_tensor(m)[None]), -1)[0]
        for a in np.flatnonzero(m):
            policy.zero_grad()
            logp[a].backward(retain_graph=True)
            for k, p in policy.named_parameters():
                if p.grad is not None:
                    reference[k] += float(logp[a].detach().exp()) * p.grad.pow(2) / len(obs)
    for k in reference:
        assert torch.allclose(fisher[k], reference[k], atol=1e-6), k


def test_penalty_value_and_gradient(tmp_path: Path) -> None:
    policy = _policy()
    anchor = {k: v.detach().clone() for k, v in policy.named_parameters()}
    fisher = {k: torch.rand_like(v) for k, v in anchor.items()}
    penalty = EWCPenalty(fisher, anchor, lam=3.0)
    assert float(penalty(policy)) == 0.0
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.1)
    value = penalty(policy)
    expected = 0.5 * 3.0 * sum(float((f * 0.1**2).sum()) for f in fisher.values())
    assert abs(float(value) - expected) < 1e-4 * expected
    value.backward()
    for k, p in policy.named_parameters():  # d/dtheta lam/2 F (theta - theta*)^2 = lam F (theta - theta*)
        assert p.grad is not None and torch.allclose(p.grad, 3.0 * fisher[k] * (p.detach() - anchor[k]), atol=1e-6)
    penalty.save(tmp_path / "fisher.safetensors")
    loaded = EWCPenalty.load(tmp_path / "fisher.safetensors", lam=3.0)
    assert abs(float(loaded(policy)) - float(value)) < 1e-6


def test_ppo_with_a_strong_penalty_stays_near_the_champion() -> None:
    cfg = small_cfg(n_epochs=2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the product runs it (tasks.determinism)
    try:
        moved = {with_ewc: _actor_movement(cfg, with_ewc) for with_ewc in (False, True)}
    finally:
        torch.set_num_threads(threads)
    assert moved[True] < 0.5 * moved[False]


def _actor_movement(cfg: TrainConfig, with_ewc: bool) -> float:
    """Squared distance the actor's weights travel in two PPO updates from the same start, with or without EWC."""
    torch.manual_seed(0)
    policy = ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=cfg.hidden_sizes)
    start = {k: v.detach().clone() for k, v in policy.named_parameters()}
    obs = np.random.default_rng(0).random((64, policy.obs_dim)).astype(np.float32)
    masks = np.ones((64, policy.n_actions), bool)
    penalty = champion_penalty(policy, obs, masks, lam=1e4) if with_ewc else None
    ppo = PPO(policy, KeyChainPool(cfg.num_envs), cfg, seed=0, regularizer=penalty)
    for _ in range(2):
        metrics = ppo.train_iteration()
    assert ("losses/regularizer" in metrics) is with_ewc
    params = dict(policy.named_parameters())
    return sum(float((params[k] - start[k]).pow(2).sum()) for k in start if k.startswith("actor."))
