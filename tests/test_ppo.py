"""PPO numerics on hand-computed cases, masking, determinism, and a tiny learning run.

``KeyChainEnv`` / ``KeyChainPool`` are a test fixture: a real Gymnasium env (walk a chain by
pressing the one right key among a few legal ones) behind a minimal SAME_STEP vector pool, so the
learner is exercised without the semantic channel stack.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from agentflow_core.config import TrainConfig
from agentflow_core.rl.adaptive import AdaptiveKLController
from agentflow_core.rl.losses import (
    approx_kl,
    clip_fraction,
    clipped_policy_loss,
    compute_gae,
    explained_variance,
    normalize_advantages,
    value_loss,
)
from agentflow_core.rl.policy import ActorCritic, policy_hash
from agentflow_core.rl.ppo import PPO, MemorySink
from agentflow_core.rl.rollout import slice_seeds
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, OBS_DIM
from agentflow_core.variants import VariantSpec


class KeyChainEnv(gym.Env[np.ndarray, np.int64]):
    """Chain of ``length`` rooms; in room k four actions are legal and one advances. Goal: +1, terminated."""

    def __init__(self, length: int = 6, max_steps: int = 12) -> None:
        self.length, self.max_steps = length, max_steps
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (OBS_DIM,), np.float32)
        self.action_space = gym.spaces.Discrete(N_ACTIONS)
        self.room, self.t = 0, 0

    def _legal(self) -> np.ndarray:
        mask = np.zeros(N_ACTIONS, dtype=bool)
        mask[[(self.room * 5 + k) % N_ACTIONS for k in (0, 1, 3, 7)]] = True
        return mask

    def _obs(self) -> np.ndarray:
        obs = np.zeros(OBS_DIM, dtype=np.float32)
        obs[self.room] = 1.0
        obs[-1] = self.t / self.max_steps
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.room, self.t = int(self.np_random.integers(0, 2)), 0
        return self._obs(), {}

    def step(self, action: np.int64 | int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        reward = -0.01
        if int(action) == (self.room * 5 + 3) % N_ACTIONS:
            self.room += 1
        terminated = self.room >= self.length
        if terminated:
            reward, self.room = 1.0, self.length - 1
        truncated = not terminated and self.t >= self.max_steps
        return self._obs(), reward, terminated, truncated, {"success": terminated}

    def action_masks(self) -> np.ndarray:
        return self._legal()


class _NoScheduler:
    """KeyChainPool has one fixed env per slot: nothing to schedule, an empty state."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Any) -> None:
        assert state == {}


class KeyChainPool:
    """A minimal EnvPool (agentflow_core.contracts) over KeyChainEnv: SAME_STEP autoreset, episode stats in the
    final info, slot i plays variant i % 2."""

    def __init__(self, num_envs: int, **env_kwargs: Any) -> None:
        self.num_envs = num_envs
        self.vocabulary = CHECKOUT
        self.envs = [KeyChainEnv(**env_kwargs) for _ in range(num_envs)]
        self.variants = [
            VariantSpec(f"chain-{i}", "keychain", "keychain", {}, f"chain-{i}") for i in range(min(num_envs, 2))
        ]
        self.scheduler = _NoScheduler()
        self.value_loss: dict[int, float] = {}
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=int)

    def slot_variants(self) -> np.ndarray:
        return np.arange(self.num_envs) % len(self.variants)

    def set_value_loss(self, variant_indices: Any, value_loss: Any) -> None:
        self.value_loss.update(zip(np.asarray(variant_indices).tolist(), np.asarray(value_loss).tolist(), strict=True))

    def feedback_state(self) -> list[float | None]:
        return [self.value_loss.get(i) for i in range(len(self.variants))]

    def load_feedback_state(self, state: Any) -> None:
        self.value_loss = {i: x for i, x in enumerate(state) if x is not None}

    def stats(self) -> dict[str, Any]:
        return {"num_envs": self.num_envs}

    def _batch(
        self,
        obs: list[np.ndarray],
        reward: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        final_obs: np.ndarray,
        infos: list[dict[str, Any]],
    ) -> Any:
        from types import SimpleNamespace

        masks = np.stack([e.action_masks() for e in self.envs])
        self._last_obs = obs
        return SimpleNamespace(
            obs=np.stack(obs),
            action_mask=masks,
            reward=reward.astype(np.float32),
            terminated=term,
            truncated=trunc,
            final_obs=final_obs,
            infos=infos,
        )

    def reset(self, seed: int) -> Any:
        obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(self.envs)]
        self._returns[:], self._lengths[:] = 0.0, 0
        z = np.zeros(self.num_envs)
        return self._batch(obs, z, z.astype(bool), z.astype(bool), np.stack(obs), [{} for _ in self.envs])

    def step(self, actions: np.ndarray, active: np.ndarray | None = None) -> Any:
        obs, infos = [], []
        reward = np.zeros(self.num_envs)
        term = np.zeros(self.num_envs, dtype=bool)
        trunc = np.zeros(self.num_envs, dtype=bool)
        final_obs = np.zeros((self.num_envs, OBS_DIM), dtype=np.float32)
        for i, (env, action) in enumerate(zip(self.envs, actions, strict=True)):
            if active is not None and not active[i]:  # paused: the episode waits
                obs.append(self._last_obs[i])
                final_obs[i] = self._last_obs[i]
                infos.append({"variant_index": i % len(self.variants)})
                continue
            assert env.action_masks()[action], "the learner sent an illegal action"
            o, r, te, tr, info = env.step(action)
            reward[i], term[i], trunc[i], final_obs[i] = r, te, tr, o
            self._returns[i] += r
            self._lengths[i] += 1
            info = dict(info, variant_hash=f"chain-{i % 2}", variant_index=i % len(self.variants))
            if te or tr:
                info.update(episode_return=self._returns[i], episode_length=int(self._lengths[i]), success=bool(te))
                self._returns[i], self._lengths[i] = 0.0, 0
                o, _ = env.reset()
            obs.append(o)
            infos.append(info)
        return self._batch(obs, reward, term, trunc, final_obs, infos)

    def close(self) -> None:
        return None


def small_cfg(**overrides: Any) -> TrainConfig:
    base = dict(
        num_envs=8,
        n_steps=32,
        minibatch_size=64,
        n_epochs=4,
        learning_rate=2.5e-3,
        clip_range=0.2,
        kl_check_every=2,
        hidden_sizes=[32, 32],
    )
    base.update(overrides)
    return TrainConfig(**base)


def make_learner(seed: int = 0, sink: MemorySink | None = None, **cfg_overrides: Any) -> PPO:
    cfg = small_cfg(**cfg_overrides)
    torch.manual_seed(seed)
    return PPO(
        ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=cfg.hidden_sizes),
        KeyChainPool(cfg.num_envs),
        cfg,
        seed=seed,
        sink=sink,
    )


# ------------------------------------------------------------------ GAE
def test_gae_bootstraps_on_truncation_not_termination() -> None:
    # Hand computation with gamma = lambda = 0.5, r = 1, V = 0.5, next_value = 2:
    #   t=2: delta = 1 + .5*2 - .5 = 1.5                         -> A = 1.5 (both envs)
    #   env 0 terminated at t=1: delta = 1 - .5 = .5             -> A = .5
    #   env 1 truncated at t=1, V(final_obs)=3: 1 + .5*3 - .5 = 2 -> A = 2
    #   t=0: delta = 1 + .5*.5 - .5 = .75; A = .75 + .25*A_1     -> .875 | 1.25
    rewards = torch.ones(3, 2)
    values = torch.full((3, 2), 0.5)
    terminated = torch.tensor([[False, False], [True, False], [False, False]])
    truncated = torch.tensor([[False, False], [False, True], [False, False]])
    final_values = torch.tensor([[0.0, 0.0], [99.0, 3.0], [0.0, 0.0]])  # 99 must be ignored (termination)
    adv, ret = compute_gae(rewards, values, terminated, truncated, final_values, torch.tensor([2.0, 2.0]), 0.5, 0.5)
    expected = torch.tensor([[0.875, 1.25], [0.5, 2.0], [1.5, 1.5]])
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + values)


def test_gae_terminated_and_truncated_same_step_does_not_bootstrap() -> None:
    adv, _ = compute_gae(
        torch.ones(1, 1),
        torch.zeros(1, 1),
        torch.tensor([[True]]),
        torch.tensor([[True]]),
        torch.tensor([[5.0]]),
        torch.tensor([7.0]),
        0.9,
        0.95,
    )
    assert adv.item() == pytest.approx(1.0)


def test_gae_lambda_one_is_discounted_return_minus_value() -> None:
    r = torch.tensor([[1.0], [2.0], [3.0]])
    v = torch.tensor([[0.1], [0.2], [0.3]])
    f = torch.zeros(3, 1, dtype=torch.bool)
    adv, ret = compute_gae(r, v, f, f, torch.zeros(3, 1), torch.tensor([4.0]), 0.9, 1.0)
    expected_ret = torch.tensor([[1 + 0.9 * 2 + 0.81 * 3 + 0.729 * 4], [2 + 0.9 * 3 + 0.81 * 4], [3 + 0.9 * 4]])
    torch.testing.assert_close(ret, expected_ret)


# ------------------------------------------------------------------ loss terms
def test_clipped_policy_loss_hand_computed() -> None:
    # A=[1,-1], r=[1.5,.5], eps=.2: -A r = [-1.5, .5]; -A clip(r) = [-1.2, .8]; max -> [-1.2, .8]; mean -.2
    loss = clipped_policy_loss(torch.tensor([1.0, -1.0]), torch.tensor([1.5, 0.5]), 0.2)
    assert loss.item() == pytest.approx(-0.2)
    # inside the trust region the loss is the plain surrogate -mean(A r)
    assert clipped_policy_loss(torch.tensor([2.0]), torch.tensor([1.1]), 0.2).item() == pytest.approx(-2.2)


def test_value_loss_kl_clipfrac_entropy_hand_computed() -> None:
    assert value_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 0.0])).item() == pytest.approx(1.25)
    kl = approx_kl(torch.tensor([math.log(2.0), 0.0])).item()
    assert kl == pytest.approx((1.0 - math.log(2.0)) / 2)
    assert clip_fraction(torch.tensor([1.5, 0.5, 1.1]), 0.2).item() == pytest.approx(2 / 3)
    adv = normalize_advantages(torch.tensor([1.0, 2.0, 3.0]))
    torch.testing.assert_close(adv, torch.tensor([-1.0, 0.0, 1.0]), atol=1e-6, rtol=0)
    assert explained_variance(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])) == pytest.approx(1.0)
    # entropy of a masked policy with zero actor output = log(#legal)
    policy = ActorCritic(OBS_DIM, N_ACTIONS)
    torch.nn.init.zeros_(policy.actor[-1].weight)
    mask = torch.zeros(1, N_ACTIONS, dtype=torch.bool)
    mask[0, [1, 4, 9]] = True
    _, logp, entropy, _ = policy.get_action_and_value(torch.zeros(1, OBS_DIM), mask)
    assert entropy.item() == pytest.approx(math.log(3), abs=1e-5)
    assert logp.item() == pytest.approx(-math.log(3), abs=1e-5)


def test_masking_never_samples_an_invalid_action() -> None:
    torch.manual_seed(0)
    policy = ActorCritic(OBS_DIM, N_ACTIONS)
    gen = torch.Generator().manual_seed(1)
    rng = np.random.default_rng(0)
    for _ in range(20):
        obs = torch.as_tensor(rng.uniform(-1, 1, (512, OBS_DIM)), dtype=torch.float32)
        mask = torch.as_tensor(rng.random((512, N_ACTIONS)) < 0.2)
        mask[torch.arange(512), torch.as_tensor(rng.integers(0, N_ACTIONS, 512))] = True  # at least one legal
        action, logp, _, _ = policy.get_action_and_value(obs, mask, generator=gen)
        assert mask[torch.arange(512), action].all()
        assert torch.isfinite(logp).all()
        assert mask[torch.arange(512), torch.as_tensor(policy.act(obs.numpy(), mask.numpy()))].all()
    # a masked action is given ~zero log-probability when scored
    _, logp_bad, _, _ = policy.get_action_and_value(
        obs[:1], mask[:1], torch.as_tensor([int(torch.nonzero(~mask[0])[0])])
    )
    assert logp_bad.item() < -1e6


def test_policy_hash_changes_with_weights() -> None:
    torch.manual_seed(0)
    a = ActorCritic(OBS_DIM, N_ACTIONS)
    torch.manual_seed(0)
    b = ActorCritic(OBS_DIM, N_ACTIONS)
    assert policy_hash(a) == policy_hash(b) and len(policy_hash(a)) == 12
    with torch.no_grad():
        b.critic[0].weight[0, 0] += 1e-3
    assert policy_hash(a) != policy_hash(b)


def test_slice_seeds_are_a_pure_function() -> None:
    assert slice_seeds(3, 7, 1) == slice_seeds(3, 7, 1)
    seeds = {s for u in range(100) for w in range(2) for s in slice_seeds(3, u, w)}
    assert len(seeds) == 400  # distinct per update, per slice, and reset vs sampling


# ------------------------------------------------------------------ learner
def test_same_seed_same_parameters_and_losses() -> None:
    runs = []
    for _ in range(2):
        sink = MemorySink()
        ppo = make_learner(seed=5, sink=sink)
        for _ in range(2):
            ppo.train_iteration()
        runs.append((policy_hash(ppo.policy), sink.series("losses/policy_loss"), sink.series("losses/value_loss")))
    assert runs[0] == runs[1]
    other = make_learner(seed=6)
    other.train_iteration()
    other.train_iteration()
    assert policy_hash(other.policy) != runs[0][0]


def test_rollout_buffer_and_diagnostics() -> None:
    sink = MemorySink()
    ppo = make_learner(sink=sink)
    metrics = ppo.train_iteration()
    buf = ppo.buffer
    assert buf.obs.shape == (32, 8, OBS_DIM) and ppo.global_step == 256
    assert buf.masks[torch.arange(32)[:, None], torch.arange(8)[None, :], buf.actions].all()
    for key in (
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clipfrac",
        "adaptive/clip_range",
        "adaptive/kl_coef",
        "rollout/success_rate",
        "time/sps",
    ):
        assert key in metrics and math.isfinite(metrics[key]), key
    assert metrics["losses/approx_kl"] >= 0.0
    assert sink.rows[0][0] == 256


def test_ppo_learns_the_key_chain() -> None:
    sink = MemorySink()
    ppo = make_learner(seed=1, sink=sink)
    for _ in range(25):
        ppo.train_iteration()
    success = sink.series("rollout/success_rate")
    assert np.mean(success[:2]) < 0.3  # random legal keys rarely walk six rooms in 12 steps
    assert np.mean(success[-3:]) > 0.95
    assert sink.series("rollout/episode_length")[-1] < 6.0  # optimum: 5.5 (start room 0 or 1)


# ------------------------------------------------------------------ adaptive clip / KL
def test_adaptive_controller_scripted_kl_sequence() -> None:
    ctl = AdaptiveKLController(clip_init=0.08, target_kl=0.015, check_every=2, clip_floor=0.01, kl_coef_min=0.01)
    # (KL of two updates) -> expected (clip, beta) after the check; hand-computed from the rules:
    # above 0.015: clip*0.5 (floor .01), beta = max(beta*1.5, .01); below 0.01: clip*1.5 (cap .08), beta*0.5 (<.01 -> 0)
    script = [
        ((0.02, 0.03), (0.04, 0.01)),  # mean .025 > target
        ((0.02, 0.02), (0.02, 0.015)),
        ((0.02, 0.04), (0.01, 0.0225)),  # clip hits the floor
        ((0.012, 0.012), (0.01, 0.0225)),  # .012 in [.01, .015]: hysteresis band, no change
        ((0.004, 0.006), (0.015, 0.01125)),
        ((0.0, 0.0), (0.0225, 0.0)),  # beta .005625 < kl_coef_min -> 0
        ((0.0, 0.0), (0.03375, 0.0)),
        ((0.0, 0.0), (0.050625, 0.0)),
        ((0.0, 0.0), (0.0759375, 0.0)),
        ((0.0, 0.0), (0.08, 0.0)),  # capped at the initial clip range
    ]
    for (kl_a, kl_b), (clip, beta) in script:
        assert ctl.observe(kl_a) is False  # only every second update is a check
        ctl.observe(kl_b)
        assert ctl.clip_range == pytest.approx(clip) and ctl.kl_coef == pytest.approx(beta)
    assert ctl.last_check_kl == 0.0
    clone = AdaptiveKLController()
    clone.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    assert clone.state_dict() == ctl.state_dict()


def test_learner_logs_adaptive_values_every_update() -> None:
    sink = MemorySink()
    ppo = make_learner(sink=sink, kl_check_every=1, target_kl=1e-6, learning_rate=1e-2)
    for _ in range(3):
        ppo.train_iteration()
    clips = sink.series("adaptive/clip_range")
    assert clips == pytest.approx([0.1, 0.05, 0.025])  # every update is above the tiny target
    assert sink.series("adaptive/kl_coef") == pytest.approx([0.01, 0.015, 0.0225])
    assert sink.series("adaptive/clip_range_used") == pytest.approx([0.2, 0.1, 0.05])


def _shipped_train() -> TrainConfig:
    from tasks.config_io import load_config

    return load_config(Path(__file__).resolve().parents[1] / "params.yaml").train


def test_adaptive_kl_fires_several_times_in_a_shipped_run() -> None:
    shipped = _shipped_train()
    assert (
        shipped.num_updates // shipped.kl_check_every == 102
    )  # docs/learning.md "PPO": about 100 checks in 524k steps


@pytest.mark.parametrize(("learning_rate", "action"), [(None, 0.0), (0.05, 1.0)])
def test_adaptive_kl_acts_on_measured_kl_at_the_shipped_cadence(learning_rate: float | None, action: float) -> None:
    """The shipped cadence, target KL and clip range on the toy chain: checks land on updates N and 2N.

    At the shipped learning rate the measured KL sits inside the hysteresis band or below it (the
    clip is already at its cap, beta at zero: nothing to relax, the check holds); at a learning rate
    that moves the policy too far it tightens the clip and raises beta for the next updates.
    """
    shipped = _shipped_train()
    n = shipped.kl_check_every
    sink = MemorySink()
    ppo = make_learner(
        sink=sink,
        kl_check_every=n,
        target_kl=shipped.target_kl,
        clip_range=shipped.clip_range,
        learning_rate=learning_rate or shipped.learning_rate,
    )
    for _ in range(2 * n):
        ppo.train_iteration()
    checked = sink.series("adaptive/checked")
    assert [i + 1 for i, c in enumerate(checked) if c] == [n, 2 * n]
    kls = sink.series("losses/approx_kl")
    assert sink.series("adaptive/kl_at_last_check")[n - 1] == pytest.approx(np.mean(kls[:n]))
    assert sink.series("adaptive/checks")[-1] == 2.0
    first_action = sink.series("adaptive/action")[n - 1]
    assert first_action == action
    clips = sink.series("adaptive/clip_range_used")
    if action > 0:
        assert np.mean(kls[:n]) > shipped.target_kl
        assert clips[n] == pytest.approx(shipped.clip_range / 2) and sink.series("adaptive/kl_coef")[n - 1] > 0
    else:
        assert np.mean(kls[:n]) <= shipped.target_kl and clips[n] == shipped.clip_range


def test_one_update_is_autograd_adam_with_clipped_gradients() -> None:
    ppo = make_learner(seed=11)
    ppo.collect_rollout()
    metrics = ppo.update_policy()
    cfg = ppo.cfg
    assert type(ppo.optimizer) is torch.optim.Adam
    steps = {float(state["step"]) for state in ppo.optimizer.state_dict()["state"].values()}
    assert steps == {cfg.n_epochs * ppo.batch_size / cfg.minibatch_size}
    clipped = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in ppo.policy.parameters()]))
    assert float(clipped) <= cfg.max_grad_norm * (1 + 1e-4)
    assert metrics["losses/grad_norm"] > 0 and np.isfinite(metrics["losses/approx_kl"])


def test_optimizer_state_of_the_former_flat_adam_learner_loads_exactly() -> None:
    """FlatAdam wrote torch Adam's own state format (with ``foreach=False``): such a checkpoint still resumes."""
    ppo = make_learner(seed=3)
    ppo.train_iteration()
    state, tensors = json.loads(json.dumps(ppo.state_json())), ppo.state_tensors()
    state["param_groups"][0]["foreach"] = False
    resumed = make_learner(seed=3)
    resumed.load_state(state, tensors)
    for (idx, ours), theirs in zip(
        resumed.optimizer.state_dict()["state"].items(), ppo.optimizer.state_dict()["state"].values(), strict=True
    ):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(ours[key], theirs[key]), (idx, key)


# ------------------------------------------------------------------ BC warm start, evaluation, convergence
def _key_chain_demonstrations(n_envs: int = 8, steps: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The optimal key in every visited room (the 'goal-reaching episodes' of the toy chain)."""
    pool = KeyChainPool(n_envs)
    batch = pool.reset(seed=0)
    obs, actions, masks = [], [], []
    for _ in range(steps):
        room = batch.obs[:, :6].argmax(1)
        action = (room * 5 + 3) % N_ACTIONS
        obs.append(batch.obs)
        masks.append(batch.action_mask)
        actions.append(action)
        batch = pool.step(action)
    return np.concatenate(obs), np.concatenate(actions), np.concatenate(masks)


def test_behaviour_cloning_imitates_demonstrations() -> None:
    from agentflow_core.evaluation.policy_eval import evaluate_policy, greedy_policy
    from agentflow_core.rl.bc import behaviour_cloning

    obs, actions, masks = _key_chain_demonstrations()
    torch.manual_seed(0)
    policy = ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=[32, 32])
    critic_before = [p.clone() for p in policy.critic.parameters()]
    before = evaluate_policy(KeyChainPool(8), greedy_policy(policy), 32, seed=1).success_rate
    result = behaviour_cloning(policy, obs, actions, masks, epochs=20, batch_size=128, learning_rate=3e-3, seed=0)
    assert result.samples == len(actions) and result.losses[-1] < result.losses[0] * 0.1
    assert result.accuracy == 1.0
    after = evaluate_policy(KeyChainPool(8), greedy_policy(policy), 32, seed=1)
    assert before < 0.2 and after.success_rate == 1.0 and after.mean_length == pytest.approx(5.5, abs=0.5)
    assert all(torch.equal(a, b) for a, b in zip(critic_before, policy.critic.parameters(), strict=True))


def test_evaluate_counts_an_equal_share_per_variant() -> None:
    from agentflow_core.evaluation.policy_eval import evaluate_policy

    pool = KeyChainPool(4)
    result = evaluate_policy(pool, lambda obs, mask: np.array([np.flatnonzero(m)[0] for m in mask]), 9, seed=0)
    assert result.episodes == 10  # ceil(9 / 2 variants) = 5 per variant
    assert {f: p.n for f, p in result.process.by_family.items()} == {"keychain": 10}


def test_policy_convergence_flag_hand_cases() -> None:
    from agentflow_core.rl.convergence import ConvergenceTracker, policy_convergence_flag

    assert not policy_convergence_flag([0.5, 0.6, 0.6])  # fewer than 3 improvements measured
    assert policy_convergence_flag([0.60, 0.601, 0.6012, 0.6015])  # +0.17%, +0.03%, +0.05%
    assert not policy_convergence_flag([0.60, 0.601, 0.61, 0.611])  # +1.5% in the window
    assert not policy_convergence_flag([0.9, 0.5, 0.3, 0.1])  # drops are "< 0.3%", but var(.5,.3,.1) = .027 > .02
    tracker = ConvergenceTracker()
    assert tracker.add(10, 0.5, tiebreak=1.0) and not tracker.add(20, 0.5, tiebreak=0.5) and tracker.add(30, 0.5, 2.0)
    assert tracker.best_step == 30
    clone = ConvergenceTracker()
    clone.load_state_dict(json.loads(json.dumps(tracker.state_dict())))
    assert clone == tracker


# ------------------------------------------------------------------ the one learner path
def _random_minibatch(seed: int, batch: int = 96, masked: bool = True) -> tuple[ActorCritic, tuple[Any, ...]]:
    """A random policy and minibatch whose ratios land on both sides of the clip range."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    policy = ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=[32, 24])
    for p in policy.parameters():  # move off the near-uniform init so logits and values are not trivial
        torch.nn.init.normal_(p, std=0.3, generator=gen)
    obs = torch.rand((batch, OBS_DIM), generator=gen) * 2 - 1
    mask = (torch.rand((batch, N_ACTIONS), generator=gen) < 0.5) if masked else None
    if mask is not None:
        mask[torch.arange(batch), torch.randint(0, N_ACTIONS, (batch,), generator=gen)] = True
    with torch.no_grad():
        actions, logp, _, _ = policy.get_action_and_value(obs, mask, generator=gen)
    old_logprob = logp + 0.4 * torch.randn(batch, generator=gen)  # ratios spread over [e^-1, e^1]
    advantages = torch.randn(batch, generator=gen) * 3 + 0.5
    returns = torch.randn(batch, generator=gen)
    return policy, (obs, mask, actions, old_logprob, advantages, returns)


def test_sample_matches_get_action_and_value() -> None:
    policy, (obs, mask, *_rest) = _random_minibatch(3)
    a, logp, value = policy.sample(obs, mask, torch.Generator().manual_seed(5))
    b, logp_ref, _, value_ref = policy.get_action_and_value(obs, mask, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b)
    torch.testing.assert_close(logp, logp_ref)
    torch.testing.assert_close(value, value_ref)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_policy_matches_cpu_up_to_float_tolerance() -> None:
    torch.manual_seed(0)
    cpu = ActorCritic(OBS_DIM, N_ACTIONS)
    gpu = ActorCritic(OBS_DIM, N_ACTIONS).to("cuda")
    gpu.load_state_dict(cpu.state_dict())
    rng = np.random.default_rng(0)
    obs = torch.as_tensor(rng.uniform(-1, 1, (256, OBS_DIM)), dtype=torch.float32)
    mask = torch.as_tensor(rng.random((256, N_ACTIONS)) < 0.5)
    mask[:, 0] = True
    actions = torch.as_tensor(cpu.act(obs.numpy(), mask.numpy()))
    _, logp_c, ent_c, v_c = cpu.get_action_and_value(obs, mask, actions)
    _, logp_g, ent_g, v_g = gpu.get_action_and_value(obs.cuda(), mask.cuda(), actions.cuda())
    for a, b in ((logp_c, logp_g), (ent_c, ent_g), (v_c, v_g)):
        torch.testing.assert_close(a, b.cpu(), atol=1e-5, rtol=1e-5)
    assert (gpu.act(obs.numpy(), mask.numpy()) == actions.numpy()).mean() > 0.99
