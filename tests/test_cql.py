"""Discrete CQL, prioritized replay and the offline prior, held to hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentflow_core.rl.cql import CQLSettings, OfflinePrior, cql_loss, improve_actor, train_cql
from agentflow_core.rl.offline_data import Transitions
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.replay import PrioritizedReplay, SumTree, freshness
from agentflow_core.semantics import N_ACTIONS, OBS_DIM


def _batch() -> dict[str, torch.Tensor]:
    """Two transitions over 3 actions (the third illegal in s1, the last two illegal in s1')."""
    return {
        "q_values": torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 3.0]], requires_grad=True),
        "next_q_target": torch.tensor([[0.5, 3.0, 10.0], [7.0, 7.0, 7.0]]),
        "mask": torch.tensor([[True, True, False], [True, True, True]]),
        "next_mask": torch.tensor([[True, False, False], [True, True, True]]),
        "action": torch.tensor([0, 2]),
        "reward": torch.tensor([1.0, 2.0]),
        "terminated": torch.tensor([False, True]),
    }


def test_cql_loss_matches_the_hand_computed_case() -> None:
    b = _batch()
    loss, td, penalty, td_error = cql_loss(**b, gamma=0.9, alpha=0.5)
    # s1: y = 1 + 0.9 * max over the legal next action {0} = 1 + 0.9 * 0.5 = 1.45; Q(s1, a=0) = 1
    # s2: terminated, y = r = 2; Q(s2, a=2) = 3
    assert td_error.tolist() == pytest.approx([1.0 - 1.45, 3.0 - 2.0])
    td1, td2 = 0.5 * 0.45**2, 0.5 * 1.0**2
    assert float(td) == pytest.approx((td1 + td2) / 2)
    # logsumexp over the legal actions only (s1: actions 0 and 1), minus Q of the data action
    cql1 = math.log(math.exp(1.0) + math.exp(2.0)) - 1.0
    cql2 = math.log(1.0 + 1.0 + math.exp(3.0)) - 3.0
    assert float(penalty) == pytest.approx((cql1 + cql2) / 2)
    assert float(loss.detach()) == pytest.approx((td1 + td2) / 2 + 0.5 * (cql1 + cql2) / 2)
    # gradient of the penalty wrt Q(s1, .): alpha/B * (softmax over legal - onehot(a)) plus the TD part on a
    loss.backward()
    grad = b["q_values"].grad
    assert grad is not None
    soft = [math.exp(1) / (math.exp(1) + math.exp(2)), math.exp(2) / (math.exp(1) + math.exp(2))]
    assert grad[0].tolist() == pytest.approx([(1.0 - 1.45) / 2 + 0.25 * (soft[0] - 1.0), 0.25 * soft[1], 0.0])


def test_importance_weights_weight_both_terms() -> None:
    b = _batch()
    _, td, penalty, _ = cql_loss(**b, gamma=0.9, alpha=0.5, weights=torch.tensor([1.0, 3.0]))
    td1, td2 = 0.5 * 0.45**2, 0.5
    cql1 = math.log(math.exp(1.0) + math.exp(2.0)) - 1.0
    cql2 = math.log(2.0 + math.exp(3.0)) - 3.0
    assert float(td) == pytest.approx((td1 + 3 * td2) / 4)
    assert float(penalty) == pytest.approx((cql1 + 3 * cql2) / 4)


def test_sum_tree_sums_finds_and_updates() -> None:
    tree = SumTree(5)
    tree.update(np.arange(5), np.array([1.0, 2.0, 3.0, 4.0, 0.0]))
    assert tree.total == pytest.approx(10.0)
    # cumulative ranges: [0,1) -> 0, [1,3) -> 1, [3,6) -> 2, [6,10) -> 3; item 4 has no mass
    assert tree.find(np.array([0.0, 0.99, 1.0, 2.5, 3.0, 5.99, 6.0, 9.999])).tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    tree.update(np.array([1]), np.array([0.0]))
    assert tree.total == pytest.approx(8.0)
    assert tree.find(np.array([1.0])).tolist() == [2]


def test_prioritized_draws_follow_td_and_freshness_with_is_weights() -> None:
    # four items: the last two one cycle older (freshness 0.5); after an update TD errors 3, 1, 3, 1
    replay = PrioritizedReplay(np.array([0.0, 0.0, 1.0, 1.0]), alpha=1.0, beta=1.0, decay=0.5, eps=0.0)
    replay.update(np.array([0, 1, 2, 3]), np.array([3.0, -1.0, 3.0, 1.0]))
    expected_p = np.array([3.0, 1.0, 1.5, 0.5]) / 6.0
    draws = np.concatenate([replay.sample(64, np.random.default_rng(s)).indices for s in range(200)])
    share = np.bincount(draws, minlength=4) / draws.size
    assert share == pytest.approx(expected_p, abs=0.01)
    sample = replay.sample(8, np.random.default_rng(0))
    assert sample.probabilities == pytest.approx(expected_p[sample.indices])
    # w = (N P)^-beta / max w: the least likely item (P = 1/12) gets weight 1
    w = (4 * expected_p) ** -1.0
    assert sample.weights == pytest.approx(w[sample.indices] / w.max())
    assert freshness(np.array([0.0, 1.0, 2.5]), 0.5) == pytest.approx([1.0, 0.5, 0.5**2.5])


def _chain(n_states: int = 4) -> Transitions:
    """A corridor: in state i action 0 moves on (reward 1 at the end), action 1 ends the episode at once (reward 0)."""
    obs = np.zeros((n_states, OBS_DIM), np.float32)
    obs[np.arange(n_states), np.arange(n_states)] = 1.0
    rows = []
    for i in range(n_states):
        last = i == n_states - 1
        rows.append((i, 0, 1.0 if last else 0.0, min(i + 1, n_states - 1), last))
        rows.append((i, 1, 0.0, i, True))
    s, a, r, s2, term = (np.array(c) for c in zip(*rows, strict=True))
    mask = np.zeros((len(rows), N_ACTIONS), bool)
    mask[:, :2] = True
    return Transitions(
        obs=obs[s],
        mask=mask,
        action=a.astype(np.int64),
        reward=r.astype(np.float32),
        next_obs=obs[s2],
        next_mask=mask.copy(),
        terminated=term.astype(bool),
        age=np.zeros(len(rows)),
        episode=np.arange(len(rows)),
    )


def _tabular_cql_fixed_point(n_states: int, gamma: float, alpha: float) -> np.ndarray:
    """The corridor's CQL(H) optimum when Q is a table: both actions are in the data equally often, so per
    state Q0 = y0 - alpha (2 sigma(Q0 - Q1) - 1) and Q1 = alpha (2 sigma(Q0 - Q1) - 1) (gradient set to 0)."""
    q = np.zeros((n_states, 2))
    for i in reversed(range(n_states)):
        y0 = 1.0 if i == n_states - 1 else gamma * q[i + 1].max()
        gap = y0
        for _ in range(100):
            gap = y0 - 2 * alpha * (2 / (1 + math.exp(-gap)) - 1)
        shift = alpha * (2 / (1 + math.exp(-gap)) - 1)
        q[i] = [y0 - shift, shift]
    return q


def test_cql_learns_the_corridor_and_the_actor_follows_it() -> None:
    torch.set_num_threads(1)  # a tiny MLP on a shared 2-core machine: more threads only contend
    data = _chain()
    settings = CQLSettings(
        gradient_steps=1500, batch_size=8, learning_rate=3e-3, gamma=0.9, alpha=0.1, target_update_every=50
    )
    q = train_cql(data, settings, seed=0).q
    with torch.no_grad():
        values = q(torch.as_tensor(data.obs[::2]))[:, :2].numpy()
    expected = _tabular_cql_fixed_point(4, 0.9, 0.1)
    # without the penalty Q(i, on) = 0.9^(3 - i) and Q(i, stop) = 0; the penalty narrows each gap
    assert expected[:, 0] == pytest.approx([0.610, 0.709, 0.824, 0.957], abs=1e-3)
    assert values == pytest.approx(expected, abs=0.1)
    assert bool((values[:, 0] > values[:, 1]).all())
    torch.manual_seed(0)
    actor = ActorCritic(OBS_DIM, N_ACTIONS)
    result = improve_actor(actor, q, data.obs, data.mask, temperature=0.1, steps=200, seed=0)
    assert result.kl_after < result.kl_before and result.greedy_agreement == 1.0
    assert (actor.act(data.obs[::2], data.mask[::2]) == 0).all()


def test_offline_prior_kl_and_its_linear_decay() -> None:
    torch.manual_seed(0)
    reference, policy = ActorCritic(OBS_DIM, N_ACTIONS), ActorCritic(OBS_DIM, N_ACTIONS)
    with torch.no_grad():  # two fresh inits are near-uniform: a KL of ~4e-5 is float32 cancellation noise
        for p in policy.actor.parameters():
            p.add_(0.5 * torch.randn_like(p))
    prior = OfflinePrior(reference, kl_coef=0.2, decay_updates=10)
    assert [prior.coef(u) for u in (0, 5, 10, 50)] == pytest.approx([0.2, 0.1, 0.0, 0.0])
    obs = torch.randn(6, OBS_DIM)
    mask = torch.ones(6, N_ACTIONS, dtype=torch.bool)
    mask[:, 5:] = False
    term, kl = prior.penalty(policy, obs, mask, update=5)
    with torch.no_grad():
        logp = torch.log_softmax(policy.actor(obs)[:, :5], -1)
        ref = torch.log_softmax(reference.actor(obs)[:, :5], -1)
    expected = float((logp.exp() * (logp - ref)).sum(-1).mean())
    assert kl > 1e-2  # large enough that float32 rounding cannot decide the comparison
    assert kl == pytest.approx(expected, rel=1e-4) and float(term.detach()) == pytest.approx(0.1 * expected, rel=1e-4)
    assert float(prior.penalty(reference, obs, mask, update=0)[0]) == pytest.approx(0.0, abs=1e-7)
    assert float(prior.penalty(policy, obs, mask, update=10)[0]) == 0.0
