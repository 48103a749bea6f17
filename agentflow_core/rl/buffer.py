"""The learner's side of a rollout: the preallocated buffer PPO fills and the episode outcomes it saw.

:class:`RolloutBuffer` holds one rollout as ``[n_steps, num_envs, ...]`` tensors (CleanRL's
``obs``/``actions``/``logprobs``/``rewards``/``dones``/``values``, with ``terminated`` and
``truncated`` kept apart and ``final_obs`` for bootstrapping on truncation);
:class:`RolloutStats` is what the rollout's finished episodes say, for the metrics sink.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


class RolloutBuffer:
    """Preallocated ``[n_steps, num_envs, ...]`` tensors: memory is bounded and allocation-free per step.

    Env-side arrays (obs, masks, rewards, done flags, final obs) live in host memory and are written
    through numpy views (no per-step numpy -> torch conversion); :meth:`to_device` moves them once
    per rollout (a no-op on CPU). Policy outputs (actions, log-probs, values) stay on the device.
    """

    def __init__(self, n_steps: int, num_envs: int, obs_dim: int, n_actions: int, device: torch.device) -> None:
        shape = (n_steps, num_envs)
        self.n_steps, self.num_envs, self.device = n_steps, num_envs, device
        pin = device.type == "cuda"
        self.host_obs = torch.zeros((*shape, obs_dim), pin_memory=pin)
        self.host_masks = torch.zeros((*shape, n_actions), dtype=torch.bool, pin_memory=pin)
        self.host_rewards = torch.zeros(shape, pin_memory=pin)
        self.host_terminated = torch.zeros(shape, dtype=torch.bool, pin_memory=pin)
        self.host_truncated = torch.zeros(shape, dtype=torch.bool, pin_memory=pin)
        self.host_final_obs = torch.zeros((*shape, obs_dim), pin_memory=pin)
        self.np_obs, self.np_masks, self.np_rewards = (
            self.host_obs.numpy(),
            self.host_masks.numpy(),
            self.host_rewards.numpy(),
        )
        self.np_terminated, self.np_truncated = self.host_terminated.numpy(), self.host_truncated.numpy()
        self.np_final_obs = self.host_final_obs.numpy()
        self.actions = torch.zeros(shape, dtype=torch.long, device=device)
        self.logprobs = torch.zeros(shape, device=device)
        self.values = torch.zeros(shape, device=device)
        self.variant_index = np.full(shape, -1, dtype=np.int64)
        self.to_device()

    def to_device(self) -> None:
        """Expose the host arrays as device tensors ``obs``, ``masks``, ``rewards``, ``terminated``, ``truncated``, ``final_obs``."""
        move = (lambda t: t) if self.device.type == "cpu" else (lambda t: t.to(self.device, non_blocking=True))
        self.obs, self.masks, self.rewards = move(self.host_obs), move(self.host_masks), move(self.host_rewards)
        self.terminated, self.truncated = move(self.host_terminated), move(self.host_truncated)
        self.final_obs = move(self.host_final_obs)


@dataclass
class RolloutStats:
    """Episode outcomes seen during one rollout."""

    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Episode count, mean return, length and success of the rollout, for the metrics sink."""
        n = len(self.episode_returns)
        if n == 0:
            return {"rollout/episodes": 0.0}
        return {
            "rollout/episodes": float(n),
            "rollout/episode_return": float(np.mean(self.episode_returns)),
            "rollout/episode_length": float(np.mean(self.episode_lengths)),
            "rollout/success_rate": float(np.mean(self.successes)),
        }
