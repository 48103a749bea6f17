"""Proximal Policy Optimization over an :class:`EnvPool`, in CleanRL ``ppo.py`` order and names.

rollout (``n_steps`` x ``num_envs``, one batched no-grad forward per step) -> :func:`compute_gae`
(bootstrap through truncation with V(final_obs), never through termination) -> flatten (``b_*``)
-> ``n_epochs`` x minibatches (``mb_*``, a fresh permutation per epoch): advantage normalisation,
clipped surrogate, value loss, entropy bonus, optional KL penalty, grad-norm clipping, Adam ->
approx KL ((r-1) - log r, Schulman's low-variance estimator), clip fraction and the last
minibatch's pre-clip grad norm -> diagnostics to an injected :class:`MetricsSink`.

One learner path, as CleanRL and SB3 write it: :func:`ppo_minibatch_loss` through autograd,
``loss.backward()``, ``torch.nn.utils.clip_grad_norm_``, ``torch.optim.Adam``. A hand-written
gradient with a flat Adam and NumPy kernels once ran beside it; at the shipped minibatch 512 the
run is env-bound and they made ``agentflow train`` no faster end to end (BENCHMARKS.md, "One
learner path"), so they were removed rather than kept in step with every change to the loss.

Rollouts come from a :class:`~agentflow_core.contracts.RolloutSource`: worker-side slices
(:mod:`agentflow_core.pool.rollout`: each env worker runs its own slots for the whole rollout with a
copy of the policy and returns them in one call), or any :class:`EnvPool` stepped from here
(:mod:`agentflow_core.rl.rollout`). The training reward is applied after
the rollout, step by step in rollout order (actions never depend on it, so it is the same
computation as rewarding each step as it happens).

Determinism and resume: every rollout slice starts with a pool reset and an action-sampling
generator seeded from ``slice_seeds(seed, update, slice)``. Episodes therefore never span a
rollout boundary (the last step of a rollout is bootstrapped with V(s_T), as any rollout end is),
and a checkpoint taken between updates fully determines the future: weights, optimizer, the
minibatch generator, the adaptive controller, the reward normaliser and the schedulers. Keep ``n_steps`` at least the envs' episode
length (their scenarios' ``max_episode_steps``) so every episode can finish inside one rollout.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from agentflow_core.config import TrainConfig
from agentflow_core.contracts import (
    EnvPool,
    MetricsSink,
    PoolBatch,
    RewardTransform,
    RewardValidatorHook,
    RolloutSlice,
    RolloutSource,
)
from agentflow_core.errors import NonFiniteError
from agentflow_core.rl.adaptive import AdaptiveKLController
from agentflow_core.rl.buffer import RolloutBuffer, RolloutStats
from agentflow_core.rl.losses import STAT_KEYS, LossCoefficients, compute_gae, explained_variance, ppo_minibatch_loss
from agentflow_core.rl.policy import ActorCritic, require_finite_parameters
from agentflow_core.rl.reward import COMPONENTS
from agentflow_core.rl.rollout import rollout_source


class NullSink:
    """Discards metrics."""

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Drop them."""
        return None

    def flush(self) -> None:
        """Nothing to keep."""
        return None


@dataclass
class MemorySink:
    """Keeps every record in memory (tests, benchmarks, figures)."""

    rows: list[tuple[int, dict[str, float]]] = field(default_factory=list)

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Keep a copy, so a caller reusing its dict cannot change the record."""
        self.rows.append((step, dict(metrics)))

    def flush(self) -> None:
        """Every record is kept already."""
        return None

    def series(self, key: str) -> list[float]:
        """All recorded values of one metric, in order."""
        return [m[key] for _, m in self.rows if key in m]


@runtime_checkable
class PolicyPenalty(Protocol):
    """An extra term of every minibatch loss (e.g. ``cql.OfflinePrior``'s decaying KL to the offline policy)."""

    def penalty(
        self, policy: ActorCritic, obs: torch.Tensor, mask: torch.Tensor, update: int
    ) -> tuple[torch.Tensor, float]:
        """``(loss term, diagnostic value)`` of one minibatch at PPO update ``update`` (0-based)."""

    def coef(self, update: int) -> float:
        """The term's weight at update ``update``."""


class TrainingReward:
    """Reward function (``agentflow_core.rl.reward.RewardFunction``) + per-env scale normalisation.

    Rewards are divided by the running std of the rewards of their env key (``key_of(info)``,
    e.g. the base env), using ``PerEnvRewardNormalizer``'s statistics. They are *not* centred:
    subtracting a mean from every step of an episodic task with early termination changes which
    policy is optimal (a negative per-step reward rewards ending early, e.g. cancelling). Keys
    with fewer than ``min_count`` samples are left unscaled so early, tiny stds cannot blow up.
    """

    def __init__(
        self,
        reward_fn: Any | None,
        normalizer: Any | None,
        key_of: Callable[[dict[str, Any]], str],
        min_count: int = 100,
        eps: float = 1e-8,
    ) -> None:
        self.reward_fn, self.normalizer, self.key_of = reward_fn, normalizer, key_of
        self.min_count, self.eps = min_count, eps
        self._sums: dict[str, float] = {}
        self._steps = 0

    def reset(self, batch: PoolBatch) -> None:
        """Reset the reward function's per-episode state (no-op without one)."""
        if self.reward_fn is not None:
            self.reward_fn.reset(batch.obs)

    def __call__(self, batch: PoolBatch) -> np.ndarray:
        """Shaped reward (the env's own without a reward function), divided by the running std of
        the env it came from once that env has ``min_count`` steps."""
        if self.reward_fn is None:
            reward = np.asarray(batch.reward, dtype=np.float32)
        else:
            parts = self.reward_fn.step(batch)
            reward = parts.total
            for name in (*COMPONENTS, "total"):
                self._sums[name] = self._sums.get(name, 0.0) + float(getattr(parts, name).sum())
        self._steps += len(reward)
        if self.normalizer is None:
            return reward
        keys = [self.key_of(info) for info in batch.infos]
        self.normalizer.update(keys, reward)
        stats = [self.normalizer.stats[k] for k in keys]
        scale = np.array([s.std + self.eps if s.count >= self.min_count else 1.0 for s in stats], dtype=np.float32)
        return reward / scale

    def metrics(self) -> dict[str, float]:
        """Mean per env step of each reward component since the last call (before normalisation)."""
        out = {f"reward/{name}": total / max(self._steps, 1) for name, total in self._sums.items()}
        self._sums, self._steps = {}, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        """The normaliser's running statistics, so a resumed run scales rewards as before."""
        return {"normalizer": None if self.normalizer is None else self.normalizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the normaliser's statistics (a checkpoint without them leaves it fresh)."""
        if self.normalizer is not None and state.get("normalizer") is not None:
            self.normalizer.load_state_dict(state["normalizer"])


_IMPL_FLAGS = ("fused", "foreach", "capturable", "differentiable")  # how Adam runs, not what it computes


class PPO:
    """PPO learner state: policy, optimizer, generators, adaptive controller and counters.

    ``train_iteration`` = one rollout + one update. Everything that influences the future is in
    :meth:`state_dict` (tensors) and :meth:`state_json` (scalars/RNG), which the checkpoint stores.
    """

    def __init__(
        self,
        policy: ActorCritic,
        pool: EnvPool | RolloutSource[ActorCritic],
        cfg: TrainConfig,
        *,
        seed: int,
        sink: MetricsSink | None = None,
        reward_transform: RewardTransform | None = None,
        device: torch.device | str = "cpu",
        regularizer: Callable[[nn.Module], torch.Tensor] | None = None,
        reward_validator: RewardValidatorHook | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.policy = policy.to(self.device)
        self.pool = pool
        self.rollouts = rollout_source(pool)
        self.cfg = cfg
        self.seed = seed
        self.sink: MetricsSink = sink or NullSink()
        self.reward_transform = reward_transform
        self.regularizer = regularizer  # e.g. EWC toward the champion in a retrain (agentflow_core.rl.ewc)
        self.reward_validator = reward_validator  # down-weights suspicious episodes (evaluation.validator)
        self.num_envs = int(pool.num_envs)
        self.n_steps = cfg.n_steps
        self.batch_size = self.num_envs * self.n_steps
        if self.batch_size % cfg.minibatch_size:
            raise ValueError(f"minibatch_size {cfg.minibatch_size} must divide num_envs*n_steps={self.batch_size}")
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate, eps=1e-5)
        self.grad_norm = torch.zeros(())
        self.np_random = np.random.default_rng(seed)
        self.adaptive = AdaptiveKLController(
            clip_init=cfg.clip_range, target_kl=cfg.target_kl, check_every=cfg.kl_check_every
        )
        self.buffer = RolloutBuffer(self.n_steps, self.num_envs, policy.obs_dim, policy.n_actions, self.device)
        self.global_step = 0
        self.update = 0
        self.last_rollout = RolloutStats()
        self.policy_penalty: PolicyPenalty | None = None  # set by the caller (train: the offline prior)

    # ---------------------------------------------------------------- rollout
    def collect_rollout(self) -> RolloutStats:
        """Fill the buffer with n_steps x num_envs transitions from the rollout source, then apply the reward.

        The slices come back whole (worker-side rollouts) or from the pool stepped here; either way
        the training reward is applied afterwards, step by step in rollout order: actions never
        depend on it, so this is the same computation as rewarding each pool step as it happens.
        """
        buf = self.buffer
        rollout = RolloutSlice.concatenate(self.rollouts.collect(self.policy, self.n_steps, self.seed, self.update))
        buf.np_obs[:], buf.np_masks[:] = rollout.obs, rollout.masks
        buf.np_terminated[:], buf.np_truncated[:] = rollout.terminated, rollout.truncated
        buf.np_final_obs[:] = rollout.final_obs
        buf.variant_index[:] = rollout.variant_index
        buf.actions.copy_(torch.from_numpy(rollout.actions))
        buf.logprobs.copy_(torch.from_numpy(rollout.logprobs))
        buf.values.copy_(torch.from_numpy(rollout.values))
        if self.reward_transform is None:
            buf.np_rewards[:] = rollout.rewards
        else:
            self.reward_transform.reset(rollout.reset_batch())
            for t in range(self.n_steps):
                buf.np_rewards[t] = self.reward_transform(rollout.step_batch(t))
        if self.reward_validator is not None:
            buf.np_rewards[:] = self.reward_validator.reweight(
                rollout.obs, rollout.actions, rollout.done, buf.np_rewards
            )
        stats = RolloutStats()
        for t, i in zip(*np.nonzero(rollout.done), strict=True):  # step order, then slot order
            stats.episode_returns.append(float(rollout.episode_return[t, i]))
            stats.episode_lengths.append(int(rollout.episode_length[t, i]))
            stats.successes.append(float(rollout.success[t, i]))
        buf.to_device()
        with torch.no_grad():
            self._next_value = self.policy.get_value(torch.as_tensor(rollout.last_obs, device=self.device))
        self.global_step += self.batch_size
        self.last_rollout = stats
        return stats

    def _final_values(self) -> torch.Tensor:
        """V(final_obs) where a step was truncated, computed in one batched pass after the rollout."""
        buf = self.buffer
        final_values = torch.zeros_like(buf.rewards)
        idx = torch.nonzero(buf.truncated & ~buf.terminated, as_tuple=True)
        if idx[0].numel():
            with torch.no_grad():
                final_values[idx] = self.policy.get_value(buf.final_obs[idx])
        return final_values

    # ---------------------------------------------------------------- update
    def update_policy(self) -> dict[str, float]:
        """GAE over the buffer, then n_epochs x minibatches of clipped-PPO gradient steps."""
        cfg, buf = self.cfg, self.buffer
        advantages, returns = compute_gae(
            buf.rewards,
            buf.values,
            buf.terminated,
            buf.truncated,
            self._final_values(),
            self._next_value,
            cfg.gamma,
            cfg.gae_lambda,
        )
        self._feed_scheduler(returns)
        b_obs = buf.obs.reshape(-1, buf.obs.shape[-1])
        b_masks = buf.masks.reshape(-1, buf.masks.shape[-1])
        b_actions, b_logprobs = buf.actions.reshape(-1), buf.logprobs.reshape(-1)
        b_advantages, b_returns, b_values = advantages.reshape(-1), returns.reshape(-1), buf.values.reshape(-1)
        clip_range = self.adaptive.clip_range
        coef = LossCoefficients(clip_range, cfg.ent_coef, cfg.vf_coef, self.adaptive.kl_coef)
        mb_stats: list[torch.Tensor] = []
        penalty_values: list[float] = []
        penalties: list[torch.Tensor] = []
        for _epoch in range(cfg.n_epochs):
            b_inds = torch.as_tensor(self.np_random.permutation(self.batch_size), device=self.device)
            for start in range(0, self.batch_size, cfg.minibatch_size):
                mb_inds = b_inds[start : start + cfg.minibatch_size]
                loss, stats = ppo_minibatch_loss(
                    self.policy,
                    b_obs[mb_inds],
                    b_masks[mb_inds],
                    b_actions[mb_inds],
                    b_logprobs[mb_inds],
                    b_advantages[mb_inds],
                    b_returns[mb_inds],
                    coef,
                )
                if self.policy_penalty is not None:
                    extra, penalty_value = self.policy_penalty.penalty(
                        self.policy, b_obs[mb_inds], b_masks[mb_inds], self.update
                    )
                    loss = loss + extra
                    penalty_values.append(penalty_value)
                if self.regularizer is not None:
                    penalty = self.regularizer(self.policy)
                    loss = loss + penalty
                    penalties.append(penalty.detach())
                self.optimizer.zero_grad()
                loss.backward()
                self.grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                mb_stats.append(stats)
        metrics = dict(zip(STAT_KEYS, torch.stack(mb_stats).mean(0).tolist(), strict=True))
        metrics["losses/grad_norm"] = float(self.grad_norm)
        if penalties:
            metrics["losses/regularizer"] = float(torch.stack(penalties).mean())
        metrics["losses/explained_variance"] = explained_variance(b_values, b_returns)
        self.adaptive.observe(metrics["losses/approx_kl"])
        metrics.update({"adaptive/" + k: v for k, v in self.adaptive.metrics().items()})
        metrics["adaptive/clip_range_used"] = clip_range
        if self.policy_penalty is not None:
            metrics["offline/kl_coef"] = self.policy_penalty.coef(self.update)
            if metrics["offline/kl_coef"] > 0.0:
                metrics["offline/kl_to_offline"] = float(np.mean(penalty_values))
        return metrics

    def _feed_scheduler(self, returns: torch.Tensor) -> None:
        """Per-variant mean squared value error (PLR's learning-potential score) to pools that take it."""
        index = self.buffer.variant_index.reshape(-1)
        known = index >= 0
        if not known.any():
            return
        sq_err = ((returns - self.buffer.values) ** 2).reshape(-1).cpu().numpy()[known]
        variants, inverse = np.unique(index[known], return_inverse=True)
        scores = np.bincount(inverse, weights=sq_err) / np.bincount(inverse)
        self.rollouts.set_value_loss(variants, scores)

    def train_iteration(self, prefetch_next: Callable[[int], bool] | None = None) -> dict[str, float]:
        """One rollout + one update; records and returns the diagnostics.

        ``prefetch_next(update)`` true: the caller will run the next iteration whatever it does in
        between, so its rollout is sent to the env workers before this one's metrics are recorded
        (Ray's workers then roll out while the caller logs and checkpoints; same rollout either way).
        """
        rollout = self.collect_rollout()
        t1 = time.perf_counter()
        t0 = self.rollouts.rollout_started_at  # a rollout sent ahead began before this call
        metrics = self.update_policy()
        self.check_finite(metrics)
        t2 = time.perf_counter()
        self.update += 1
        if prefetch_next is not None and prefetch_next(self.update):
            self.rollouts.prefetch(self.policy, self.n_steps, self.seed, self.update)
        metrics.update(rollout.metrics())
        if self.reward_transform is not None:
            metrics.update(self.reward_transform.metrics())
        if self.reward_validator is not None:
            metrics.update(self.reward_validator.metrics())
        metrics.update(
            {
                "time/rollout_s": t1 - t0,
                "time/update_s": t2 - t1,
                "time/sps": self.batch_size / max(t2 - t0, 1e-9),
                "global_step": float(self.global_step),
                "update": float(self.update),
            }
        )
        self.sink.record(self.global_step, metrics)
        return metrics

    def check_finite(self, metrics: dict[str, float]) -> None:
        """Raise :class:`NonFiniteError` at the first NaN/inf of this update, in pipeline order.

        Rewards, then values, then the losses, then the last gradient, then each parameter: one
        NaN reward turns every weight NaN within one update, and the first quantity is the cause.
        """
        update = self.update + 1
        buf = self.buffer
        for name, tensor in (("rewards", buf.rewards), ("value estimates", buf.values)):
            bad = ~torch.isfinite(tensor)
            if bool(bad.any()):
                step, env = (int(i) for i in torch.nonzero(bad)[0])
                raise NonFiniteError(
                    update, name, f"first at rollout step {step}, env {env}: {float(tensor[step, env])}"
                )
        for key in STAT_KEYS[:4]:
            if not np.isfinite(metrics[key]):
                raise NonFiniteError(update, key.removeprefix("losses/"), f"mean over minibatches {metrics[key]}")
        if not bool(torch.isfinite(self.grad_norm)):
            raise NonFiniteError(update, "gradients", "in the last minibatch step")
        require_finite_parameters(self.policy, update, "update")

    # ---------------------------------------------------------------- state
    def state_json(self) -> dict[str, Any]:
        """Scalars and RNG states needed for bit-identical continuation (JSON-serialisable)."""
        return {
            "seed": self.seed,
            "global_step": self.global_step,
            "update": self.update,
            "np_random": self.np_random.bit_generator.state,
            "adaptive": self.adaptive.state_dict(),
            "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups],
            "reward_transform": None if self.reward_transform is None else self.reward_transform.state_dict(),
            "scheduler": self.rollouts.scheduler.state_dict(),
            # value losses the pool holds for the scheduler until each variant's next episode ends
            "pool_feedback": self.rollouts.feedback_state(),
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Optimizer moments, as named tensors (safetensors-ready); action sampling is seeded per rollout slice."""
        tensors: dict[str, torch.Tensor] = {}
        for idx, state in self.optimizer.state_dict()["state"].items():
            for key, value in state.items():
                tensors[f"optim/{idx}/{key}"] = torch.as_tensor(value).detach().cpu().clone()
        return tensors

    def load_state(
        self,
        state: dict[str, Any],
        tensors: dict[str, torch.Tensor],
        restore_rng: bool = True,
        restore_optimizer: bool = True,
    ) -> None:
        """Inverse of :meth:`state_json` + :meth:`state_tensors` (flags exist for negative-control tests)."""
        self.global_step, self.update = int(state["global_step"]), int(state["update"])
        self.adaptive.load_state_dict(state["adaptive"])
        if restore_rng:
            self.np_random.bit_generator.state = state["np_random"]
        if restore_optimizer:
            optim_state: dict[int, dict[str, torch.Tensor]] = {}
            for name, value in tensors.items():
                if name.startswith("optim/"):
                    _, idx, key = name.split("/", 2)
                    optim_state.setdefault(int(idx), {})[key] = value.to(self.device) if key != "step" else value
            groups = [
                dict(g, params=list(og["params"]), **{k: og[k] for k in _IMPL_FLAGS if k in og})
                for g, og in zip(state["param_groups"], self.optimizer.state_dict()["param_groups"], strict=True)
            ]
            self.optimizer.load_state_dict({"state": optim_state, "param_groups": groups})
        if self.reward_transform is not None and state.get("reward_transform") is not None:
            self.reward_transform.load_state_dict(state["reward_transform"])
        if state.get("scheduler") is not None:
            self.rollouts.scheduler.load_state_dict(state["scheduler"])
        if state.get("pool_feedback") is not None:
            self.rollouts.load_feedback_state(state["pool_feedback"])
