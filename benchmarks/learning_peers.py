"""The peers of ``agentflow bench learning``: sb3-contrib MaskablePPO from scratch and warm-started by BC.

Both get the ``train`` section's hyper-parameters (envs, rollout length, minibatch, epochs, learning
rate, clip range, GAE, loss coefficients, gradient clip, target KL, 64x64 tanh actor and critic) and
the product's training reward on SB3's step batches (:func:`benchmarks.sb3_envs.product_reward_vec_env`).
They see the envs as an SB3 user wires them: a ``DummyVecEnv`` of ``train.num_envs`` envs, each reset
onto a uniformly drawn train variant, masks from ``action_masks()``.

The warm-started peer first clones the rules on the exploration data AgentFlow's run produced (the
same process-successful train-split episodes AgentFlow's BC reads), as an SB3 user does with
``imitation``'s BC: cross-entropy of the demonstrated action under the policy's masked action
distribution, on the actor's parameters, with the settings of AgentFlow's own BC
(:func:`agentflow_core.rl.bc.behaviour_cloning`). It needed those logs, so its clock starts at the
exploration's wall time and its env steps at the exploration's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.normalize import PerEnvRewardNormalizer
from agentflow_core.rl.ppo import TrainingReward
from agentflow_core.rl.trajectories import behaviour_cloning_arrays
from agentflow_core.splits import read_splits
from benchmarks.learning_eval import Evaluator, LearnerRun, TrainingClock
from benchmarks.sb3_envs import TrainVariantEnv, maskable_greedy, product_reward_vec_env
from tasks.compose import env_factory, reward_function
from tasks.context import PhaseContext

# AgentFlow's BC settings (epochs, batch size, learning rate, minimum gradient steps), read from its signature
BC_SETTINGS: dict[str, Any] = {k: v for k, v in (behaviour_cloning.__kwdefaults__ or {}).items() if k != "seed"}


@dataclass(frozen=True)
class Demonstrations:
    """The rules' logs a warm-started peer clones: where they are and what producing them cost."""

    trajectories: Path
    explore_s: float
    explore_steps: int


def sb3_behaviour_cloning(
    model: Any,
    obs: np.ndarray,
    actions: np.ndarray,
    masks: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    learning_rate: float,
    min_steps: int,
    seed: int = 0,
) -> dict[str, float]:
    """Fit a MaskablePPO policy's actor to (obs, action) pairs by masked cross-entropy; returns samples and accuracy.

    The loss is ``-log pi(a|s)`` under the masked distribution (``get_distribution(obs, action_masks)``),
    the negative log-likelihood ``imitation``'s BC minimises; only the actor's layers are fitted, the
    critic is left to PPO's first rollouts, as in AgentFlow's BC.
    """
    n = len(actions)
    if n == 0:
        return {"samples": 0, "accuracy": float("nan")}
    policy = model.policy
    epochs = max(epochs, -(-min_steps // -(-n // batch_size)))
    obs_t = torch.as_tensor(obs, dtype=torch.float32, device=policy.device)
    act_t = torch.as_tensor(actions, dtype=torch.long, device=policy.device)
    mask_t = torch.as_tensor(masks, dtype=torch.bool, device=policy.device)
    mask_t = mask_t | torch.nn.functional.one_hot(act_t, mask_t.shape[1]).bool()  # a demonstrated action is legal
    actor = [*policy.mlp_extractor.policy_net.parameters(), *policy.action_net.parameters()]
    optimizer = torch.optim.Adam(actor, lr=learning_rate)
    rng = np.random.default_rng(seed)
    policy.set_training_mode(True)
    for _ in range(epochs):
        perm = torch.as_tensor(rng.permutation(n), device=policy.device)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            loss = -policy.get_distribution(obs_t[idx], action_masks=mask_t[idx]).log_prob(act_t[idx]).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    policy.set_training_mode(False)
    with torch.no_grad():
        greedy = policy.get_distribution(obs_t, action_masks=mask_t).mode()
    return {"samples": n, "epochs": epochs, "accuracy": float((greedy == act_t).float().mean())}


def maskableppo_kwargs(ctx: PhaseContext) -> dict[str, Any]:
    """MaskablePPO's arguments from the ``train`` section: the settings AgentFlow's PPO runs with.

    The value loss is weighed alike: AgentFlow's is ``vf_coef * 0.5 * mean((V - R)^2)`` (CleanRL's), SB3's
    ``vf_coef * mean((V - R)^2)`` (``F.mse_loss``), so SB3 gets half the coefficient.
    """
    tc = ctx.cfg.train
    return {
        "n_steps": tc.n_steps,
        "batch_size": tc.minibatch_size,
        "n_epochs": tc.n_epochs,
        "learning_rate": tc.learning_rate,
        "gamma": tc.gamma,
        "gae_lambda": tc.gae_lambda,
        "clip_range": tc.clip_range,
        "ent_coef": tc.ent_coef,
        "vf_coef": tc.vf_coef / 2,
        "max_grad_norm": tc.max_grad_norm,
        "target_kl": tc.target_kl,
        "policy_kwargs": {
            "net_arch": {"pi": list(tc.hidden_sizes), "vf": list(tc.hidden_sizes)},
            "activation_fn": torch.nn.Tanh,
        },
    }


def train_maskableppo(
    ctx: PhaseContext,
    catalogue: Path,
    evaluator: Evaluator,
    eval_every: int,
    demonstrations: Demonstrations | None = None,
) -> tuple[LearnerRun, dict[str, Any]]:
    """MaskablePPO from scratch, or warm-started by BC on ``demonstrations``, with the product's reward."""
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import DummyVecEnv

    cfg = ctx.cfg
    tc, seed = cfg.train, cfg.base.seed
    warm = demonstrations is not None
    run = LearnerRun("maskableppo_bc" if warm else "maskableppo")
    clock = TrainingClock(demonstrations.explore_s if demonstrations is not None else 0.0)
    offset = demonstrations.explore_steps if demonstrations is not None else 0
    if demonstrations is not None:
        run.setup_s["explore_s"], run.explore_steps = demonstrations.explore_s, offset
    train_variants = read_splits(catalogue)["train"]
    factory = env_factory(ctx, train_variants)
    venv = DummyVecEnv([lambda: TrainVariantEnv(train_variants, factory) for _ in range(tc.num_envs)])
    venv.seed(seed)
    kwargs = maskableppo_kwargs(ctx)
    with reward_function(ctx, tc.num_envs) as reward_fn:
        normalizer = PerEnvRewardNormalizer() if tc.reward.normalize else None
        reward = TrainingReward(reward_fn, normalizer, key_of=lambda info: str(info["base_env_id"]))
        started = clock.elapsed
        model = MaskablePPO("MlpPolicy", product_reward_vec_env(venv, reward), seed=seed, device="cpu", **kwargs)
        run.setup_s["model_s"] = clock.elapsed - started
        if demonstrations is not None:
            started = clock.elapsed
            vocabulary = ctx.vocabulary
            accepted = {v.content_hash: vocabulary.accepted_outcomes(v.params) for v in train_variants}
            arrays = behaviour_cloning_arrays(demonstrations.trajectories, accepted, vocabulary)
            run.stages["bc"] = sb3_behaviour_cloning(model, *arrays, seed=seed, **BC_SETTINGS)
            run.setup_s["bc_s"] = clock.elapsed - started

        class Checkpoints(BaseCallback):  # type: ignore[misc]
            """Evaluates at the start of every ``eval_every``-th rollout: after the previous update."""

            rollouts = 0

            def _on_rollout_start(self) -> None:
                if self.rollouts % eval_every == 0:
                    evaluator.checkpoint(run, maskable_greedy(model), offset + int(self.num_timesteps), clock)
                self.rollouts += 1

            def _on_step(self) -> bool:
                return True

        model.learn(total_timesteps=tc.num_updates * tc.num_envs * tc.n_steps, callback=Checkpoints())
        if run.checkpoints[-1].env_steps != offset + model.num_timesteps:
            evaluator.checkpoint(run, maskable_greedy(model), offset + int(model.num_timesteps), clock)
    venv.close()
    run.train_s, run.env_steps = clock.elapsed, offset + int(model.num_timesteps)
    net = f"pi/vf {'x'.join(str(n) for n in tc.hidden_sizes)} tanh"
    config = {k: v for k, v in kwargs.items() if k != "policy_kwargs"} | {"net": net}
    return run, config | ({"bc": BC_SETTINGS} if warm else {})
