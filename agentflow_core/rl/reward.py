"""The training reward: a base reward (one of three modes) plus auxiliary shaping terms.

A transition is ``(s_t, a_t, s_{t+1})``; ``s_{t+1}`` is the pool's ``final_obs`` where the
episode ended and ``obs`` elsewhere (SAME_STEP autoreset puts the next episode's first
observation in ``obs``). Token sets are decoded from the encoded vectors.

Base reward modes (``RewardConfig.mode``):

* ``scalar`` -- the env's own reward (the business reward, per-step costs included).
* ``token_table`` -- ``token_rewards[k]`` for every token ``k`` that is absent in ``s_t`` and
  present in ``s_{t+1}`` (an absent→present edge; tokens present at reset never pay).
  Positive entries pay at most ONCE per episode per token (re-entering PAYMENT_PAGE after a
  declined card does not pay again, so loops cannot be farmed); negative entries pay on every
  absent→present edge (each new INVALID_CARD costs again). Tokens not in the table pay 0.
* ``model`` -- the external reward model's score of ``s_{t+1}``, one batched request per pool
  step; on any service failure the batch falls back to the ``token_table`` reward and the
  client's failure counter increases.

The env's business reward is added with ``env_reward_weight`` in the token and model modes
(in ``scalar`` mode it is the base already), so escalating for a blocked user, cancelling and
per-step costs are learned, not only the goal token. The risk term (a SafetyWrapper in training,
the same rule the stress phase applies to the evaluated return) costs ``risk_penalty`` on each
step whose ``info["risk"]`` exceeds ``risk_threshold``.

Shaping: ``shaped = base + Σ_i weight_i · reward_i · [condition_i(s_{t+1}) first holds in this
episode]`` -- **once per episode per term**. A condition that holds on many steps pays only on
the first, so the shaping total of an episode is bounded by ``Σ_i |weight_i · reward_i|`` and
cannot be farmed by oscillating around the condition. Conditions are compiled by
:mod:`agentflow_core.safe_expr` over the process's token and feature names (tokens read 1.0/0.0, features as
floats); an undefined condition (e.g. division by zero) does not hold.

Every step returns :class:`RewardComponents` -- env (business) reward, base, the weighted env term,
shaping, risk penalty, total and which terms fired -- so each part can be logged separately and
reward-hacking analysis can compare shaped return with business outcome.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from agentflow_core.config import RewardConfig
from agentflow_core.rl.reward_model import RewardModelClient
from agentflow_core.safe_expr import Condition, compile_condition
from agentflow_core.semantics import Vocabulary


class StepBatch(Protocol):
    """What the reward needs from a pool step (``agentflow_core.pool.PoolBatch`` satisfies it)."""

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    infos: list[dict[str, Any]]
    pending: np.ndarray | None  # slots whose step has not returned: no transition, no reward


COMPONENTS = ("base", "env", "shaping", "risk")


@dataclass(frozen=True)
class RewardComponents:
    """Per-env reward parts of one pool step; ``total = base + env + shaping - risk``."""

    env_reward: np.ndarray  # [N] float32, the env's business reward
    base: np.ndarray  # [N] float32, the mode's reward
    env: np.ndarray  # [N] float32, env_reward_weight x env_reward (0 in scalar mode: it is the base)
    shaping: np.ndarray  # [N] float32, Σ weight·reward over terms that fired this step
    risk: np.ndarray  # [N] float32, the risk penalty charged this step (>= 0)
    total: np.ndarray  # [N] float32, what the learner optimises (before normalisation)
    fired: np.ndarray  # [N, n_terms] bool
    model_ok: bool = True  # False when the model mode fell back to the token table


def token_reward_vector(token_rewards: dict[str, float], vocabulary: Vocabulary) -> np.ndarray:
    """Dense ``[n_tokens]`` table in ``vocabulary``'s order."""
    table = np.zeros(vocabulary.n_tokens, dtype=np.float32)
    token_index = vocabulary.token_index()
    for token, value in token_rewards.items():
        table[token_index[token]] = value
    return table


class RewardFunction:
    """Stateful per-env reward over a pool: call :meth:`reset` with the reset batch, then :meth:`step`."""

    def __init__(
        self,
        cfg: RewardConfig,
        num_envs: int,
        model: RewardModelClient | None = None,
        *,
        vocabulary: Vocabulary,
    ) -> None:
        if cfg.mode == "model" and model is None:
            raise ValueError("reward mode 'model' needs a RewardModelClient")
        self.cfg, self.num_envs, self.model = cfg, num_envs, model
        self._n_tokens = n_tokens = vocabulary.n_tokens
        self.condition_names = (*vocabulary.tokens, *vocabulary.features)
        self.table = token_reward_vector(cfg.token_rewards, vocabulary)
        self._positive = self.table > 0
        self.conditions: tuple[Condition, ...] = tuple(
            compile_condition(t.condition, self.condition_names) for t in cfg.shaping
        )
        self.term_values = np.array([t.weight * t.reward for t in cfg.shaping], dtype=np.float32)
        self._prev_tokens = np.zeros((num_envs, n_tokens), dtype=bool)
        self._paid_tokens = np.zeros((num_envs, n_tokens), dtype=bool)
        self._fired = np.zeros((num_envs, len(self.conditions)), dtype=bool)

    def reset(self, obs: np.ndarray) -> None:
        """Start every env's episode from ``obs`` ([N, obs_dim])."""
        self._prev_tokens = np.asarray(obs)[:, : self._n_tokens] > 0.5
        self._paid_tokens[:] = False
        self._fired[:] = False

    def step(self, batch: StepBatch) -> RewardComponents:
        """Rewards of the transitions that produced ``batch``; advances the per-env episode state."""
        done = np.asarray(batch.terminated, dtype=bool) | np.asarray(batch.truncated, dtype=bool)
        next_obs = np.where(done[:, None], batch.final_obs, batch.obs)
        next_tokens = next_obs[:, : self._n_tokens] > 0.5
        env_reward = np.asarray(batch.reward, dtype=np.float32)
        base = self._base(next_obs, next_tokens, env_reward)
        fired = self._shaping_fired(next_obs)
        idle = np.zeros(self.num_envs, bool) if batch.pending is None else np.asarray(batch.pending, bool)
        fired[idle] = False
        shaping = (
            (fired * self.term_values).sum(axis=1, dtype=np.float32)
            if fired.shape[1]
            else np.zeros(self.num_envs, np.float32)
        )
        self._fired |= fired
        # The next transition starts from the (possibly autoreset) observation.
        self._prev_tokens = np.asarray(batch.obs)[:, : self._n_tokens] > 0.5
        self._paid_tokens[done] = False
        self._fired[done] = False
        model_ok = self.model.last_ok if self.model is not None and self.cfg.mode == "model" else True
        weight = 0.0 if self.cfg.mode == "scalar" else self.cfg.env_reward_weight
        env = (weight * env_reward).astype(np.float32)
        risk = np.zeros(self.num_envs, np.float32)
        if self.cfg.risk_penalty > 0.0:
            step_risk = np.array([float(info.get("risk", 0.0)) for info in batch.infos], dtype=np.float32)
            risk[step_risk > self.cfg.risk_threshold] = self.cfg.risk_penalty
        total = (base + env + shaping - risk).astype(np.float32)
        if idle.any():  # a pending slot took no step: nothing to reward (or to charge)
            base, env, shaping, risk, total = (
                np.where(idle, 0.0, x).astype(np.float32) for x in (base, env, shaping, risk, total)
            )
        return RewardComponents(env_reward, base, env, shaping, risk, total, fired, model_ok)

    def _token_table(self, next_tokens: np.ndarray) -> np.ndarray:
        appeared = next_tokens & ~self._prev_tokens
        payable = appeared & ~(self._paid_tokens & self._positive)
        self._paid_tokens |= appeared & self._positive
        return (payable.astype(np.float32) @ self.table).astype(np.float32)

    def _base(self, next_obs: np.ndarray, next_tokens: np.ndarray, env_reward: np.ndarray) -> np.ndarray:
        if self.cfg.mode == "scalar":
            return env_reward.copy()
        table_reward = self._token_table(next_tokens)
        if self.cfg.mode == "token_table":
            return table_reward
        assert self.model is not None
        return self.model.score(next_obs, fallback=table_reward)

    def _shaping_fired(self, next_obs: np.ndarray) -> np.ndarray:
        fired = np.zeros((self.num_envs, len(self.conditions)), dtype=bool)
        if not self.conditions:
            return fired
        pending = (~self._fired).tolist()
        rows = next_obs.tolist()
        for i, pending_i in enumerate(pending):
            if not any(pending_i):
                continue
            values = dict(zip(self.condition_names, rows[i], strict=True))
            for j, condition in enumerate(self.conditions):
                if pending_i[j] and condition(values):
                    fired[i, j] = True
        return fired
