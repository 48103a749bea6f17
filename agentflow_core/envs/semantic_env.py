"""The Gymnasium face of a physical env: physical env + semantic adapter -> one shared space.

Observation: ``Box(0, 1, (obs_dim,), float32)`` (multi-hot tokens + features); action:
``Discrete(n_actions)`` over the process's semantic actions -- both widths from the
:class:`~agentflow_core.semantics.Vocabulary` the adapter's mapping speaks. Every family of a
process therefore presents the same spaces, and one policy network serves them all. ``info`` carries
``env_id``, ``step_id``, ``failure_reason``, ``tokens``, ``action_mask`` and ``risk``;
``action_masks()`` follows the sb3-contrib MaskablePPO convention.

Misbehaviour is never passed on silently: an exception from the channel becomes
:class:`EnvCrashError`, a non-finite reward or observation :class:`EnvInvalidError`, both
carrying env_id and step_id (hangs are caught by the pool, which owns the clock).
"""

from __future__ import annotations

import copy
import functools
import math
from typing import Any

import gymnasium as gym
import numpy as np

from agentflow_core.adapters.base import AdaptedStep, BaseSemanticAdapter
from agentflow_core.envs.base import PhysicalEnv, StepResult
from agentflow_core.errors import EnvCrashError, EnvError, EnvInvalidError
from agentflow_core.semantics import SemanticObs, Vocabulary

# (obs, reward, terminated, truncated, step_id, risk, failure_reason, action mask): what a pool keeps of a step
StepRow = tuple[np.ndarray, float, bool, bool, int, float, Any, np.ndarray, float]


@functools.cache
def _space_prototypes(obs_dim: int, n_actions: int) -> tuple[gym.spaces.Box, gym.spaces.Discrete]:
    """The shared spaces (of one process's vocabulary), validated once; a pool re-creates SemanticEnvs at every re-use."""
    return gym.spaces.Box(-1.0, 1.0, shape=(obs_dim,), dtype=np.float32), gym.spaces.Discrete(n_actions)


class SemanticEnv(gym.Env[np.ndarray, np.int64]):
    """Wrap one physical env with its adapter into the shared semantic spaces."""

    metadata = {"render_modes": []}

    def __init__(
        self, physical: PhysicalEnv, adapter: BaseSemanticAdapter, max_episode_steps: int | None = None
    ) -> None:
        self.physical = physical
        self.adapter = adapter
        self.env_id = physical.env_id
        self.max_episode_steps = max_episode_steps or int(
            getattr(getattr(physical, "scenario", None), "max_episode_steps", 200)
        )
        vocabulary: Vocabulary = adapter.vocabulary  # the process the adapter's mapping speaks
        self.vocabulary = vocabulary
        observation_space, action_space = _space_prototypes(vocabulary.obs_dim, vocabulary.n_actions)
        self._action_risk = vocabulary.action_risk  # declared risk by action index (a tuple: cheap per step)
        self.observation_space = copy.copy(observation_space)  # own instances (own sampling RNG), no re-validation
        self.action_space = copy.copy(action_space)
        self._raw: Any = None
        self._mask = np.ones(vocabulary.n_actions, dtype=bool)
        self.step_id = 0
        self._step: AdaptedStep | None = None

    @property
    def last_obs(self) -> SemanticObs | None:
        """The SemanticObs of the latest observation (built on first access, not on every step)."""
        return None if self._step is None else self._step.obs

    def _observe(self, raw: Any) -> AdaptedStep:
        step = self.adapter.adapt_step(raw, {"step_fraction": min(self.step_id / self.max_episode_steps, 1.0)})
        if not step.finite:
            raise EnvInvalidError(
                self.env_id, self.step_id, f"non-finite observation features {dict(step.obs.features)}"
            )
        self._raw, self._step, self._mask = raw, step, step.mask
        return step

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Gymnasium reset; the physical env is seeded from this env's generator, so ``reset(seed)`` replays."""
        super().reset(seed=seed)
        # The physical env draws from its own generator, seeded from ours so reset(seed) is reproducible.
        child_seed = int(self.np_random.integers(0, 2**31 - 1))
        self.step_id = 0
        try:
            raw, info = self.physical.reset(seed=child_seed)
        except EnvError:
            raise
        except Exception as exc:  # the channel's own failure, whatever its type
            raise EnvCrashError(self.env_id, 0, f"reset raised {type(exc).__name__}: {exc}") from exc
        step = self._observe(raw)
        return step.vec, self._info(info, step, risk=0.0)

    def step(self, action: np.int64 | int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Gymnasium step on a semantic action; a crash of the physical env becomes an :class:`EnvCrashError`."""
        action = int(action)
        result, step, reward = self._advance(action)
        info = self._info(result.info, step, self._risk(action, result.info))
        info["raw_reward"] = float(result.reward)
        return step.vec, reward, bool(result.terminated), bool(result.truncated), info

    def step_row(self, action: int) -> StepRow:
        """:meth:`step` without its info dict, for a pool that keeps only these fields of it:
        (obs, reward, terminated, truncated, step_id, risk, failure_reason, mask, business_value). The mask
        is the adapter's shared read-only array (``step``'s info carries a copy); the business value is the
        channel's ``info["business_value"]``, NaN when it reports none."""
        result, step, reward = self._advance(action)
        info = result.info
        return (
            step.vec,
            reward,
            bool(result.terminated),
            bool(result.truncated),
            self.step_id,
            self._risk(action, info),
            info.get("failure_reason"),
            step.mask,
            math.nan if (value := info.get("business_value")) is None else float(value),
        )

    def _advance(self, action: int) -> tuple[StepResult, AdaptedStep, float]:
        self.step_id += 1
        native = self.adapter.adapt_action(action)
        try:
            result: StepResult = self.physical.step(native)
        except EnvError:
            raise
        except Exception as exc:
            raise EnvCrashError(self.env_id, self.step_id, f"step raised {type(exc).__name__}: {exc}") from exc
        step = self._observe(result.obs)
        reward = self.adapter.step_reward(result.reward, step, result.info)
        if not math.isfinite(reward):
            raise EnvInvalidError(self.env_id, self.step_id, f"non-finite reward {reward!r}")
        return result, step, float(reward)

    def _risk(self, action: int, channel_info: dict[str, Any]) -> float:
        """The channel's own risk figure, else the action's declared risk if the channel applied it."""
        if "risk" in channel_info:
            return float(channel_info["risk"])
        if channel_info.get("applied"):
            risks = self._action_risk
            return risks[action] if 0 <= action < len(risks) else 0.0
        return 0.0

    def _info(self, channel_info: dict[str, Any], step: AdaptedStep, risk: float) -> dict[str, Any]:
        info = dict(channel_info)
        info["env_id"] = self.env_id
        info["step_id"] = self.step_id
        info["failure_reason"] = channel_info.get("failure_reason")
        info["tokens"] = list(step.ordered)  # sorted once per distinct token set, by the adapter
        info["action_mask"] = self._mask.copy()  # the adapter's mask is shared and read-only
        info["risk"] = risk
        return info

    def action_masks(self) -> np.ndarray:
        """Legal semantic actions in the current state (sb3-contrib convention)."""
        return self._mask.copy()

    def close(self) -> None:
        """Close the physical env too (it may hold a database connection or an HTTP client)."""
        self.physical.close()
        super().close()
