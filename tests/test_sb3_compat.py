"""The gymnasium ids work with off-the-shelf tooling: gymnasium.make and stable-baselines3 PPO."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.semantics import N_ACTIONS, OBS_DIM

GYM_IDS = ["agentflow/WebCheckout-v2", "agentflow/OrderDB-v1", "agentflow/PaymentAPI-v1"]
FAMILIES = {
    "agentflow/WebCheckout-v2": "web_checkout",
    "agentflow/OrderDB-v1": "order_db",
    "agentflow/PaymentAPI-v1": "payment_api",
}


@pytest.mark.parametrize("gym_id", GYM_IDS)
def test_make_by_module_prefixed_id_and_override_scenario(gym_id: str) -> None:
    env = gymnasium.make(f"agentflow_core.gym_registration:{gym_id}", user_tier="vip", balance=80.0)
    assert env.spec is not None and env.spec.max_episode_steps == 50
    inner = env.unwrapped
    assert isinstance(inner, SemanticEnv) and inner.env_id.startswith(FAMILIES[gym_id] + "_v")
    assert inner.physical.scenario.user_tier == "vip" and inner.physical.scenario.balance == 80.0
    obs, info = env.reset(seed=0)
    assert obs.shape == (OBS_DIM,) and env.action_space.n == N_ACTIONS and info["step_id"] == 0
    env.close()


def test_register_envs_is_idempotent() -> None:
    from agentflow_core.gym_registration import register_envs

    all_ids = [
        *GYM_IDS,
        "agentflow/WebBrowser-v1",
    ]  # the real browser channel too (not trained here: tests/test_env_browser.py)
    before = {k: v for k, v in gymnasium.registry.items() if k.startswith("agentflow/")}
    assert register_envs() == all_ids and register_envs() == all_ids
    after = {k: v for k, v in gymnasium.registry.items() if k.startswith("agentflow/")}
    assert sorted(after) == sorted(all_ids) and all(after[k] is before[k] for k in before)


@pytest.mark.slow
@pytest.mark.parametrize("gym_id", GYM_IDS)
def test_sb3_ppo_trains_and_predicts(gym_id: str) -> None:
    from stable_baselines3 import PPO

    import agentflow_core.gym_registration  # noqa: F401  (registers the ids)

    env = gymnasium.make(gym_id)
    model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu", verbose=0)
    model.learn(total_timesteps=256)
    assert model.num_timesteps == 256
    assert np.isfinite(model.logger.name_to_value["train/value_loss"])
    obs, _ = env.reset(seed=1)
    for _ in range(10):
        action, _ = model.predict(obs, deterministic=True)
        assert env.action_space.contains(int(action))
        obs, reward, terminated, truncated, _ = env.step(int(action))
        assert np.isfinite(reward) and env.observation_space.contains(obs)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
