"""PPO benchmark: throughput against stable-baselines3 and update latency (learning: ``agentflow bench learning``).

Measured side by side in one process, so machine speed cancels in the ratios:

- ``sps_ratio_vs_sb3``: end-to-end training throughput (env steps / s, rollout + update) of our
  PPO over :class:`GymVectorPool` (a plain loop over ``gymnasium.make`` envs, SAME_STEP) vs SB3
  ``PPO("MlpPolicy")`` over ``DummyVecEnv``, both on the same registered Gymnasium env built by
  ``gymnasium.make`` (same wrapper stack), with matched hyperparameters: n_envs, n_steps,
  minibatch size, epochs, learning rate, clip, gamma/lambda, ent/vf coefficients, grad clip and the
  64x64 Tanh actor/critic. The headline uses SB3's default ``batch_size`` 64 and ``n_epochs`` 10
  (on both sides) with 8 envs x 256 steps; ``sps_ratio_vs_sb3_large_minibatch`` repeats it at
  minibatch 512 x 4 epochs, where both learners are bound by the env's step cost. Runs alternate
  (SB3, ours, SB3, ours) and each ratio uses each side's best repeat. SB3 keeps its defaults
  otherwise (no masking: it cannot mask), single torch thread on both sides.
  ``inprocess_pool_sps_ratio_vs_sb3`` is the headline run of ours over the catalogue pool
  (``InProcessPool``: scheduler, fault isolation, per-slot infos) for transparency.
- ``env_only_sps`` / ``sps_ratio_ceiling_vs_sb3``: the same envs stepped with no learner at all
  (uniformly random legal actions), and that rate over SB3's: the ratio ours would reach with a free learner.
  ``ours_rollout_s`` / ``ours_update_s`` split one headline iteration of ours.
- ``update_s_2048``: one PPO update on 2,048 samples, 4 epochs x 4 minibatches of 512 (median of
  repeats); ``sb3_update_s_2048`` is SB3's ``train()`` on the same sizes for reference.

How well the product learns, against sb3-contrib's MaskablePPO on the same catalogue's test split,
is ``benchmarks.learning_bench``'s question. Pure: returns a dict (the CLI writes ``data/bench/ppo.json``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium
import numpy as np
import torch

from agentflow_core.config import PoolConfig, TrainConfig, VariantsConfig
from agentflow_core.pool.base import PoolBatch, RegistryEnvFactory
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.ppo import PPO
from agentflow_core.semantics import CHECKOUT, Vocabulary
from agentflow_core.variants import BaseEnvInfo, VariantSpec, content_hash, generate_variants

GOAL_INDEX = CHECKOUT.token_index()[CHECKOUT.goal]

TARGETS = {"sps_ratio_vs_sb3": 3.0, "update_s_2048": 0.1}


@dataclass(frozen=True)
class GymIdEnv:
    """A ``gymnasium.make`` env (full wrapper stack) exposing the pool's env surface."""

    env: Any

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset through the whole wrapper stack."""
        return self.env.reset(seed=seed, options=options)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Step through the whole wrapper stack."""
        return self.env.step(action)

    def action_masks(self) -> np.ndarray:
        """Legal actions, read from the base env (wrappers do not forward them)."""
        return self.env.unwrapped.action_masks()

    def close(self) -> None:
        """Close the env and its wrappers."""
        self.env.close()


@dataclass(frozen=True)
class GymIdFactory:
    """Env factory building every slot from one registered Gymnasium id (picklable)."""

    gym_id: str
    vocabulary: Vocabulary  # the process the registered id's envs speak

    def __call__(self, variant: Any) -> GymIdEnv:
        """A fresh env of the id; ``variant`` is ignored, there is only one."""
        import agentflow_core.gym_registration  # noqa: F401  (registers the ids)

        return GymIdEnv(gymnasium.make(self.gym_id))


class _FixedScheduler:
    """The scheduler of a pool whose slots never change env: no state."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Nothing to restore."""


class GymVectorPool:
    """EnvPool over ``n`` ``gymnasium.make`` envs of one registered id, SAME_STEP autoreset.

    The lightest pool for a single Gymnasium id (no catalogue, scheduler, fault isolation or info
    aggregation): a plain loop over the envs, as SB3's ``DummyVecEnv`` is, so the throughput
    comparison measures the learners rather than the vector-env machinery.
    """

    def __init__(self, gym_id: str, num_envs: int) -> None:
        import agentflow_core.gym_registration  # noqa: F401

        self.num_envs = num_envs
        self.vocabulary = CHECKOUT  # the registered ids are the checkout process's envs
        self.envs = [gymnasium.make(gym_id) for _ in range(num_envs)]
        family = gym_id.split("/")[-1]
        self.variants = [VariantSpec(gym_id, gym_id, family, {}, gym_id)]
        self.scheduler = _FixedScheduler()
        self._return = np.zeros(num_envs)
        self._length = np.zeros(num_envs, dtype=np.int64)
        self._obs = np.zeros((num_envs, CHECKOUT.obs_dim), np.float32)

    def slot_variants(self) -> np.ndarray:
        """Every slot plays variant 0."""
        return np.zeros(self.num_envs, np.int64)

    def set_value_loss(
        self, variant_indices: Sequence[int] | np.ndarray, value_loss: Sequence[float] | np.ndarray
    ) -> None:
        """No scheduler to feed: every slot always plays the one env."""

    def feedback_state(self) -> list[float | None]:
        """No pending feedback (see :meth:`set_value_loss`)."""
        return [None]

    def load_feedback_state(self, state: Sequence[float | None]) -> None:
        """Nothing pending (see :meth:`set_value_loss`)."""

    def stats(self) -> dict[str, Any]:
        """Only the slot count: the loop has no counters of its own."""
        return {"num_envs": self.num_envs}

    def _masks(self) -> np.ndarray:
        return np.stack([e.unwrapped.action_masks() for e in self.envs])  # type: ignore[attr-defined]

    def reset(self, seed: int) -> PoolBatch:
        """Reset every env, env ``i`` with ``seed + i``."""
        obs = np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)])
        self._obs = obs
        self._return[:], self._length[:] = 0.0, 0
        zeros = np.zeros(self.num_envs, dtype=bool)
        return PoolBatch(
            obs,
            self._masks(),
            np.zeros(self.num_envs, np.float32),
            zeros,
            zeros.copy(),
            obs.copy(),
            [{} for _ in range(self.num_envs)],
        )

    def step(self, actions: np.ndarray, active: np.ndarray | None = None) -> PoolBatch:
        """Step every env; a finished one is reset at once (SAME_STEP autoreset), its last
        observation kept in ``final_obs``."""
        n = self.num_envs
        obs = self._obs.copy()
        final_obs = self._obs.copy()
        reward = np.zeros(n, np.float32)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        infos: list[dict[str, Any]] = [{} for _ in range(n)]
        for i, (env, action) in enumerate(zip(self.envs, actions.tolist(), strict=True)):
            if active is not None and not active[i]:  # paused: the episode waits
                continue
            o, r, te, tr, _ = env.step(action)
            final_obs[i], reward[i], terminated[i], truncated[i] = o, r, te, tr
            self._return[i] += r
            self._length[i] += 1
            if te or tr:
                infos[i] = {
                    "episode_return": float(self._return[i]),
                    "episode_length": int(self._length[i]),
                    "success": bool(te and o[GOAL_INDEX] > 0.5),
                    "variant_index": 0,
                }
                self._return[i], self._length[i] = 0.0, 0
                o, _ = env.reset()
            obs[i] = o
        self._obs = obs
        return PoolBatch(obs, self._masks(), reward, terminated, truncated, final_obs, infos)

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()


def _matched_train_config(n_envs: int, n_steps: int, minibatch: int, epochs: int, total_steps: int) -> TrainConfig:
    return TrainConfig(
        total_steps=total_steps,
        num_envs=n_envs,
        n_steps=n_steps,
        minibatch_size=minibatch,
        n_epochs=epochs,
        learning_rate=3e-4,
        clip_range=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        gamma=0.99,
        gae_lambda=0.95,
        hidden_sizes=[64, 64],
    )


def _gym_pool(gym_id: str, n_envs: int, seed: int) -> InProcessPool:
    spec = VariantSpec(f"bench_{gym_id.replace('/', '_')}", gym_id, "bench", {}, content_hash(gym_id, {}))
    return InProcessPool(
        [spec], GymIdFactory(gym_id, CHECKOUT), n_envs, PoolConfig(num_workers=0, scheduler="uniform"), seed=seed
    )


def _ours_sps(gym_id: str, cfg: TrainConfig, seed: int, catalogue_pool: bool = False) -> tuple[float, PPO]:
    pool: Any = _gym_pool(gym_id, cfg.num_envs, seed) if catalogue_pool else GymVectorPool(gym_id, cfg.num_envs)
    try:
        torch.manual_seed(seed)
        ppo = PPO(ActorCritic(CHECKOUT.obs_dim, CHECKOUT.n_actions, cfg.hidden_sizes), pool, cfg, seed=seed)
        t0 = time.perf_counter()
        for _ in range(cfg.num_updates):
            ppo.train_iteration()
        return ppo.global_step / (time.perf_counter() - t0), ppo
    finally:
        pool.close()


def _sb3_model(gym_id: str, cfg: TrainConfig, seed: int) -> Any:
    from stable_baselines3 import PPO as SB3PPO
    from stable_baselines3.common.env_util import make_vec_env

    import agentflow_core.gym_registration  # noqa: F401

    # A callable, not the id: make_vec_env would pass render_mode, which the Scenario-kwargs entry point rejects.
    venv = make_vec_env(lambda: gymnasium.make(gym_id), n_envs=cfg.num_envs, seed=seed)
    return SB3PPO(
        "MlpPolicy",
        venv,
        n_steps=cfg.n_steps,
        batch_size=cfg.minibatch_size,
        n_epochs=cfg.n_epochs,
        learning_rate=cfg.learning_rate,
        clip_range=cfg.clip_range,
        ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        seed=seed,
        device="cpu",
        policy_kwargs={
            "net_arch": {"pi": list(cfg.hidden_sizes), "vf": list(cfg.hidden_sizes)},
            "activation_fn": torch.nn.Tanh,
        },
    )


def _sb3_sps(gym_id: str, cfg: TrainConfig, seed: int) -> float:
    model = _sb3_model(gym_id, cfg, seed)
    try:
        t0 = time.perf_counter()
        model.learn(total_timesteps=cfg.num_updates * cfg.num_envs * cfg.n_steps)
        return model.num_timesteps / (time.perf_counter() - t0)
    finally:
        model.get_env().close()


def _update_latency(gym_id: str, seed: int, repeats: int) -> tuple[float, float]:
    """(ours, SB3) median seconds of one update: 2,048 samples, 4 epochs x 4 minibatches of 512."""
    cfg = _matched_train_config(8, 256, 512, 4, 2048)
    pool = GymVectorPool(gym_id, cfg.num_envs)
    try:
        torch.manual_seed(seed)
        ppo = PPO(ActorCritic(CHECKOUT.obs_dim, CHECKOUT.n_actions), pool, cfg, seed=seed)
        ppo.collect_rollout()
        ours = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ppo.update_policy()
            ours.append(time.perf_counter() - t0)
    finally:
        pool.close()
    model = _sb3_model(gym_id, cfg, seed)
    try:
        model.learn(total_timesteps=cfg.num_envs * cfg.n_steps)  # fills the rollout buffer (and runs one train())
        theirs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            model.train()
            theirs.append(time.perf_counter() - t0)
    finally:
        model.get_env().close()
    return float(np.median(ours)), float(np.median(theirs))


def demo_catalogue(samples_per_combination: int, seed: int) -> list[VariantSpec]:
    """The demo catalogue's dimensions over the three packaged base envs."""
    vc = VariantsConfig()
    bases = [BaseEnvInfo(b, b.rsplit("_v", 1)[0], int(b.rsplit("_v", 1)[1])) for b in vc.base_envs]
    return generate_variants(
        bases, vc.dimensions, vc.perturbations, samples_per_combination, seed, scenario=CHECKOUT.scenario
    )


def _packaged_factory(variants: Sequence[VariantSpec]) -> RegistryEnvFactory:
    from agentflow_core.gym_registration import packaged_entry

    return RegistryEnvFactory({b: packaged_entry(b) for b in sorted({v.base_env_id for v in variants})})


def _env_only_sps(gym_id: str, n_envs: int, n_steps: int, seed: int) -> float:
    """Steps/s of the bare envs under uniformly random legal actions (what an untrained policy does),
    no learner: the ceiling for any learner on them."""
    pool = GymVectorPool(gym_id, n_envs)
    rng = np.random.default_rng(seed)
    try:
        batch = pool.reset(seed=seed)
        t0 = time.perf_counter()
        for _ in range(n_steps):
            batch = pool.step((rng.random(batch.action_mask.shape) + batch.action_mask).argmax(1))
        return n_envs * n_steps / (time.perf_counter() - t0)
    finally:
        pool.close()


def _iteration_split(gym_id: str, cfg: TrainConfig, seed: int, repeats: int = 3) -> tuple[float, float]:
    """(rollout s, update s) of one of our iterations, best of ``repeats``."""
    pool = GymVectorPool(gym_id, cfg.num_envs)
    try:
        torch.manual_seed(seed)
        ppo = PPO(ActorCritic(CHECKOUT.obs_dim, CHECKOUT.n_actions, cfg.hidden_sizes), pool, cfg, seed=seed)
        rollout, update = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            ppo.collect_rollout()
            t1 = time.perf_counter()
            ppo.update_policy()
            rollout.append(t1 - t0)
            update.append(time.perf_counter() - t1)
        return min(rollout), min(update)
    finally:
        pool.close()


def throughput_vs_sb3(
    gym_id: str, cfg: TrainConfig, seed: int, repeats: int, catalogue_pool: bool = False
) -> dict[str, Any]:
    """Alternating SB3 / ours runs at one matched setting: both sides' best steps/s and the ratio."""
    ours_runs, sb3_runs, pool_runs = [], [], []
    for r in range(repeats):
        sb3_runs.append(_sb3_sps(gym_id, cfg, seed + r))
        ours_runs.append(_ours_sps(gym_id, cfg, seed + r)[0])
        if catalogue_pool:
            pool_runs.append(_ours_sps(gym_id, cfg, seed + r, catalogue_pool=True)[0])
    result = {
        "n_envs": cfg.num_envs,
        "n_steps": cfg.n_steps,
        "minibatch_size": cfg.minibatch_size,
        "n_epochs": cfg.n_epochs,
        "steps_per_run": cfg.num_updates * cfg.num_envs * cfg.n_steps,
        "ours_sps": max(ours_runs),
        "sb3_sps": max(sb3_runs),
        "ours_sps_runs": ours_runs,
        "sb3_sps_runs": sb3_runs,
        "sps_ratio_vs_sb3": max(ours_runs) / max(sb3_runs),
    }
    if pool_runs:
        result.update(
            ours_inprocess_pool_sps=max(pool_runs), inprocess_pool_sps_ratio_vs_sb3=max(pool_runs) / max(sb3_runs)
        )
    return result


def run_ppo_bench(
    gym_id: str = "agentflow/WebCheckout-v2",
    n_envs: int = 8,
    n_steps: int = 256,
    minibatch: int = 64,
    epochs: int = 10,
    large_minibatch: int = 512,
    large_epochs: int = 4,
    sps_updates: int = 5,
    repeats: int = 2,
    update_repeats: int = 7,
    seed: int = 0,
) -> dict[str, Any]:
    """All PPO benchmark numbers, as one dict."""
    torch.set_num_threads(1)
    total = sps_updates * n_envs * n_steps
    cfg = _matched_train_config(n_envs, n_steps, minibatch, epochs, total)
    headline = throughput_vs_sb3(gym_id, cfg, seed, repeats, catalogue_pool=True)
    large = throughput_vs_sb3(
        gym_id, _matched_train_config(n_envs, n_steps, large_minibatch, large_epochs, total), seed, repeats
    )
    env_sps = _env_only_sps(gym_id, n_envs, n_steps, seed)
    rollout_s, update_s = _iteration_split(gym_id, cfg, seed)
    update_ours, update_sb3 = _update_latency(gym_id, seed, update_repeats)
    return {
        "gym_id": gym_id,
        "matched": {
            "n_envs": n_envs,
            "n_steps": n_steps,
            "minibatch_size": minibatch,
            "n_epochs": epochs,
            "minibatch_source": "SB3 PPO defaults (batch_size=64, n_epochs=10), set on both sides",
            "large_minibatch_size": large_minibatch,
            "large_n_epochs": large_epochs,
            "net": "64x64 tanh actor + critic",
            "steps_per_run": total,
            "repeats": repeats,
            "torch_threads": 1,
        },
        "ours_sps": headline["ours_sps"],
        "sb3_sps": headline["sb3_sps"],
        "ours_sps_runs": headline["ours_sps_runs"],
        "sb3_sps_runs": headline["sb3_sps_runs"],
        "sps_ratio_vs_sb3": headline["sps_ratio_vs_sb3"],
        "ours_sps_large_minibatch": large["ours_sps"],
        "sb3_sps_large_minibatch": large["sb3_sps"],
        "sps_ratio_vs_sb3_large_minibatch": large["sps_ratio_vs_sb3"],
        "throughput": {"sb3_default_minibatch": headline, "large_minibatch": large},
        "ours_inprocess_pool_sps": headline["ours_inprocess_pool_sps"],
        "inprocess_pool_sps_ratio_vs_sb3": headline["inprocess_pool_sps_ratio_vs_sb3"],
        "env_only_sps": env_sps,
        "sps_ratio_ceiling_vs_sb3": env_sps / headline["sb3_sps"],
        "ours_rollout_s": rollout_s,
        "ours_update_s": update_s,
        "update_s_2048": update_ours,
        "sb3_update_s_2048": update_sb3,
        "targets": TARGETS,
        "notes": [
            "sps_ratio_vs_sb3: SB3's default minibatch 64 x 10 epochs on both sides, 8 envs x 256 steps, "
            "64x64 tanh actor and critic, one torch thread; each side's best of the alternating repeats. "
            "Our learner is the product's one path (autograd, torch.optim.Adam, clip_grad_norm_), as SB3's is.",
            "sps_ratio_vs_sb3_large_minibatch (512 x 4) is bound by the env's step cost on both sides; "
            "sps_ratio_ceiling_vs_sb3 is the env alone over SB3.",
        ],
    }
