"""The SB3 side of ``agentflow bench learning``: the catalogue as Gymnasium envs an SB3 user would wire.

:class:`TrainVariantEnv` plays a uniformly drawn train variant at every reset (``action_masks()`` for
sb3-contrib's MaskablePPO), :func:`product_reward_vec_env` puts the product's training reward on
SB3's step batches, :func:`maskable_greedy` is the peer's greedy policy for the shared evaluations.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import gymnasium as gym
import numpy as np

from agentflow_core.contracts import PolicyFn, PoolBatch, VariantLike
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.pool.base import RegistryEnvFactory
from agentflow_core.rl.ppo import TrainingReward


class TrainVariantEnv(gym.Env[np.ndarray, np.int64]):
    """One SB3 env over a catalogue split: every reset plays a uniformly drawn variant.

    Envs are built by the product's factory, one per base env, and re-targeted at each reset
    (``RegistryEnvFactory.reuse``) so a reset does not open a new database or client.
    """

    def __init__(self, variants: Sequence[VariantLike], factory: RegistryEnvFactory) -> None:
        self.variants, self.factory = list(variants), factory
        self._envs: dict[str, SemanticEnv] = {}
        self.env = self._env_for(self.variants[0])
        self.observation_space, self.action_space = self.env.observation_space, self.env.action_space
        self.base_env_id = self.variants[0].base_env_id

    def _env_for(self, variant: VariantLike) -> SemanticEnv:
        idle = self._envs.get(variant.base_env_id)
        reused = self.factory.reuse(idle, variant) if idle is not None else None
        if reused is None and idle is not None:
            idle.close()
        env = cast(SemanticEnv, reused if reused is not None else self.factory(variant))  # the factory builds these
        self._envs[variant.base_env_id] = env
        return env

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Draw a variant, re-target its base env onto it and reset it from this env's generator."""
        super().reset(seed=seed)
        variant = self.variants[int(self.np_random.integers(len(self.variants)))]
        self.env, self.base_env_id = self._env_for(variant), variant.base_env_id
        obs, info = self.env.reset(seed=int(self.np_random.integers(2**31 - 1)))
        return obs, {**info, "base_env_id": self.base_env_id}

    def step(self, action: np.int64 | int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Step the current variant's env."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["base_env_id"] = self.base_env_id
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """Legal actions now (sb3-contrib's MaskablePPO asks every env through ``env_method``)."""
        return self.env.action_masks()

    def close(self) -> None:
        """Close every base env's env."""
        for env in self._envs.values():
            env.close()


def product_reward_vec_env(venv: Any, reward: TrainingReward) -> Any:
    """``venv`` with the product's training reward in place of the env's, computed on SB3's step batches."""
    from stable_baselines3.common.vec_env import VecEnvWrapper

    n_actions = int(venv.action_space.n)

    class ProductReward(VecEnvWrapper):  # type: ignore[misc]
        def reset(self) -> np.ndarray:
            obs = np.asarray(self.venv.reset())  # a Box observation space: one array
            zeros = np.zeros(len(obs), np.float32)
            reward.reset(_batch(obs, zeros, zeros.astype(bool), [{}] * len(obs), n_actions))
            return obs

        def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
            obs, rewards, dones, infos = self.venv.step_wait()
            obs = np.asarray(obs)
            batch = _batch(obs, rewards, dones, list(infos), n_actions)
            return obs, reward(batch), dones, list(infos)

    return ProductReward(venv)


def _batch(
    obs: np.ndarray, rewards: np.ndarray, dones: np.ndarray, infos: list[dict[str, Any]], n_actions: int
) -> PoolBatch:
    """SB3's autoreset step as a pool batch: terminated and truncated apart, the finished episode's last obs."""
    truncated = np.array([bool(info.get("TimeLimit.truncated", False)) for info in infos], dtype=bool)
    final_obs = obs.copy()
    for i in np.flatnonzero(dones):
        final_obs[i] = infos[i]["terminal_observation"]
    masks = np.ones((len(obs), n_actions), dtype=bool)
    return PoolBatch(obs, masks, np.asarray(rewards, np.float32), dones & ~truncated, truncated, final_obs, infos)


def maskable_greedy(model: Any) -> PolicyFn:
    """MaskablePPO's deterministic legal action per observation."""
    return lambda obs, mask: model.predict(obs, action_masks=mask, deterministic=True)[0]
