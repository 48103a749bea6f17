"""Behaviour cloning, CQL and the actor-improvement step stop at the first non-finite quantity, as PPO does.

Each names its stage, step and quantity; the caller (the offline phase, ``agentflow train``'s BC
warm start) then writes nothing: the error reaches the CLI's one-line exit 2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_cql import _chain

from agentflow_core.errors import NonFiniteError
from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.cql import CQLSettings, QNetwork, improve_actor, train_cql
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.semantics import N_ACTIONS, OBS_DIM

SETTINGS = CQLSettings(gradient_steps=20, batch_size=8, target_update_every=5)


def _demonstrations(n: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.random((n, OBS_DIM), dtype=np.float32), rng.integers(0, N_ACTIONS, n), np.ones((n, N_ACTIONS), bool)


def test_behaviour_cloning_refuses_a_non_finite_observation_before_any_step() -> None:
    obs, actions, masks = _demonstrations()
    obs[17, 3] = np.nan
    policy = ActorCritic(OBS_DIM, N_ACTIONS)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    with pytest.raises(
        NonFiniteError, match=r"behaviour-cloning epoch 1: non-finite observations \(1 rows, first row 17\)"
    ):
        behaviour_cloning(policy, obs, actions, masks, min_steps=10)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())  # not a step taken


def test_behaviour_cloning_stops_at_the_first_non_finite_epoch_loss() -> None:
    obs, actions, masks = _demonstrations()
    # one step at this rate leaves huge weights whose next loss overflows (64 rows: one batch an epoch)
    with pytest.raises(NonFiniteError, match=r"behaviour-cloning epoch 2: non-finite loss \(mean over the epoch inf\)"):
        behaviour_cloning(ActorCritic(OBS_DIM, N_ACTIONS), obs, actions, masks, min_steps=10, learning_rate=1e36)


@pytest.mark.parametrize(
    ("column", "quantity"), [("reward", "reward in the data"), ("next_obs", "next_obs in the data")]
)
def test_cql_refuses_non_finite_transitions_naming_the_column(column: str, quantity: str) -> None:
    data = _chain()
    getattr(data, column)[3] = np.inf
    with pytest.raises(NonFiniteError, match=rf"CQL gradient step 1: non-finite {quantity} \(1 transitions, first 3\)"):
        train_cql(data, SETTINGS, seed=0)


def test_cql_stops_at_the_step_whose_td_loss_overflows() -> None:
    data = _chain()
    data.reward[:] = np.float32(3e38)  # finite rewards whose squared TD error is inf
    with pytest.raises(NonFiniteError, match=r"CQL gradient step 1: non-finite TD loss \(inf\)"):
        train_cql(data, SETTINGS, seed=0)


def test_the_actor_step_refuses_a_q_network_that_holds_nan() -> None:
    data = _chain()
    q = QNetwork(OBS_DIM, N_ACTIONS)
    with torch.no_grad():
        q.net[-1].bias[0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"actor-improvement step 5: non-finite KL to the improved policy"):
        improve_actor(ActorCritic(OBS_DIM, N_ACTIONS), q, data.obs, data.mask, temperature=0.1, steps=5)


def test_clean_inputs_pass_every_check() -> None:
    obs, actions, masks = _demonstrations()
    assert np.isfinite(
        behaviour_cloning(ActorCritic(OBS_DIM, N_ACTIONS), obs, actions, masks, min_steps=10).losses
    ).all()
    assert np.isfinite(train_cql(_chain(), SETTINGS, seed=0).td_loss).all()
