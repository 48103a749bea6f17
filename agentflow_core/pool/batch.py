"""What one env-worker call returns: a batch of rows aligned with the slots it stepped, and what a row reads
from a step's env (its business value, the oracle's action for evaluation)."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from agentflow_core.contracts import OracleEnv
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.semantics import Vocabulary


@dataclass
class WorkerBatch:
    """Rows of one worker call, aligned with ``slots`` (plain arrays: cheap to pickle through Ray)."""

    slots: np.ndarray
    obs: np.ndarray
    action_mask: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    step_id: np.ndarray
    risk: np.ndarray
    failure_reason: list[str | None]
    business_value: np.ndarray  # the channel's ``info["business_value"]`` of the step (NaN: none reported)

    @classmethod
    def empty(cls, slots: np.ndarray, vocabulary: Vocabulary) -> WorkerBatch:
        """Rows for ``slots`` before anything ran: zero observations and rewards, every action legal."""
        k = len(slots)
        return cls(
            slots=np.asarray(slots, dtype=np.int64),
            obs=np.zeros((k, vocabulary.obs_dim), dtype=np.float32),
            action_mask=np.ones((k, vocabulary.n_actions), dtype=bool),
            reward=np.zeros(k, dtype=np.float32),
            terminated=np.zeros(k, dtype=bool),
            truncated=np.zeros(k, dtype=bool),
            step_id=np.zeros(k, dtype=np.int64),
            risk=np.zeros(k, dtype=np.float32),
            failure_reason=[None] * k,
            business_value=np.full(k, np.nan, dtype=np.float64),
        )

    def scatter(self, part: WorkerBatch) -> None:
        """Write ``part``'s rows into this batch at ``part.slots`` (``self`` spans every slot of the pool)."""
        s = part.slots
        self.obs[s], self.action_mask[s], self.reward[s] = part.obs, part.action_mask, part.reward
        self.terminated[s], self.truncated[s] = part.terminated, part.truncated
        self.step_id[s], self.risk[s] = part.step_id, part.risk
        self.business_value[s] = part.business_value
        if len(part.failure_reason) != len(s):
            raise ValueError(f"{len(part.failure_reason)} failure reasons for {len(s)} slots")
        deque(map(self.failure_reason.__setitem__, s.tolist(), part.failure_reason), maxlen=0)  # a C-level loop


def oracle_action(env: Any) -> int:
    """The env's oracle action as a semantic action index.

    An env speaking semantic actions answers with the index; a physical env behind a
    :class:`SemanticEnv` answers with its native action's name, found in the adapter's action table
    (the semantic action whose native action carries that name; else the semantic action so named).
    """
    if isinstance(env, OracleEnv):
        return int(env.oracle_action())
    if isinstance(env, SemanticEnv) and isinstance(env.physical, OracleEnv):
        native = env.physical.oracle_action()
        if not isinstance(native, str):
            return int(native)
        for action in range(env.vocabulary.n_actions):
            if env.adapter.adapt_action(action).get("action") == native:
                return action
        return env.vocabulary.action_id(native)
    raise TypeError(f"{type(env).__name__} has no oracle: only a process that declares one is played by it")


def business_value(info: Mapping[str, Any]) -> float:
    """The step's ``info["business_value"]``, NaN when the channel reports none."""
    value = info.get("business_value")
    return np.nan if value is None else float(value)
