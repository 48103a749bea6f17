"""Reward modes, shaping, per-env normalisation and the real loopback reward-model service."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import httpx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentflow_core.config import RewardConfig
from agentflow_core.pool.base import PoolBatch
from agentflow_core.rl.normalize import PerEnvRewardNormalizer
from agentflow_core.rl.reward import RewardFunction, token_reward_vector
from agentflow_core.rl.reward_model import MLPRewardModel, RewardModelClient, RewardModelServer
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, OBS_DIM, TOKEN_INDEX, encode


def enc(tokens: Sequence[str], **features: float) -> np.ndarray:
    return encode(tokens, features)


def batch(
    next_states: Sequence[tuple[Sequence[str], dict[str, float]]],
    env_reward: Sequence[float] = (),
    terminated: Sequence[bool] = (),
    reset_obs: dict[int, Sequence[str]] | None = None,
) -> PoolBatch:
    """A pool step: ``next_states`` are s_{t+1}; where an env terminated, ``reset_obs`` is its new first obs."""
    n = len(next_states)
    final = np.stack([enc(t, **f) for t, f in next_states])
    term = np.array(terminated or [False] * n)
    obs = final.copy()
    for i, tokens in (reset_obs or {}).items():
        obs[i] = enc(tokens)
    return PoolBatch(
        obs=obs,
        action_mask=np.ones((n, N_ACTIONS), bool),
        reward=np.array(env_reward or [-0.01] * n, dtype=np.float32),
        terminated=term,
        truncated=np.zeros(n, bool),
        final_obs=final,
        infos=[{} for _ in range(n)],
    )


S = dict  # readability: S() = no features


def test_token_table_pays_new_tokens_positive_once_per_episode_negative_every_time() -> None:
    cfg = RewardConfig(
        mode="token_table", token_rewards={"PAYMENT_SUCCESS": 10.0, "PAYMENT_PAGE": 1.0, "INVALID_CARD": -1.0}
    )
    rf = RewardFunction(cfg, num_envs=2, vocabulary=CHECKOUT)
    rf.reset(np.stack([enc(["LOGGED_IN"]), enc(["PAYMENT_PAGE"])]))
    steps = [
        batch([(["PAYMENT_PAGE"], S()), (["INVALID_CARD"], S())]),
        batch(
            [(["INVALID_CARD"], S()), (["PAYMENT_PAGE"], S())]
        ),  # env1: PAYMENT_PAGE was only present at reset -> pays
        batch([(["PAYMENT_PAGE"], S()), (["INVALID_CARD"], S())]),  # env0: already paid this episode; env1: -1 again
        batch(
            [(["PAYMENT_SUCCESS"], S()), (["PAYMENT_PAGE"], S())],
            terminated=[True, False],
            reset_obs={0: ["LOGGED_OUT"]},
        ),
        batch([(["PAYMENT_PAGE"], S()), (["PAYMENT_PAGE", "INVALID_CARD"], S())]),  # env0 new episode: pays again
    ]
    expected = [[1.0, -1.0], [-1.0, 1.0], [0.0, -1.0], [10.0, 0.0], [1.0, -1.0]]
    for b, want in zip(steps, expected, strict=True):
        comps = rf.step(b)
        np.testing.assert_allclose(comps.base, want)
        np.testing.assert_allclose(comps.total, want)
        np.testing.assert_allclose(comps.env_reward, [-0.01, -0.01], rtol=1e-6)
        assert comps.shaping.tolist() == [0.0, 0.0]


def test_scalar_mode_is_the_env_reward() -> None:
    rf = RewardFunction(RewardConfig(mode="scalar"), num_envs=2, vocabulary=CHECKOUT)
    rf.reset(np.stack([enc(["LOGGED_OUT"])] * 2))
    comps = rf.step(batch([(["PAYMENT_SUCCESS"], S()), (["LOGGED_IN"], S())], env_reward=[10.0, -0.05]))
    np.testing.assert_allclose(comps.base, [10.0, -0.05], rtol=1e-6)


def test_env_business_reward_and_risk_penalty_join_the_token_reward() -> None:
    cfg = RewardConfig(
        mode="token_table",
        token_rewards={"PAYMENT_SUCCESS": 10.0},
        env_reward_weight=1.0,
        risk_penalty=2.0,
        risk_threshold=0.3,
    )
    rf = RewardFunction(cfg, num_envs=3, vocabulary=CHECKOUT)
    rf.reset(np.stack([enc(["PAYMENT_PAGE"]), enc(["LOGGED_IN"]), enc(["ORDER_PENDING"])]))
    step = batch(
        [(["PAYMENT_SUCCESS"], S()), (["ESCALATED"], S()), (["ORDER_CANCELLED"], S())],
        env_reward=[10.0, 1.0, -2.0],
        terminated=[True, True, True],
    )
    step.infos[2]["risk"] = 0.5  # cancelling an order: a risky step
    step.infos[0]["risk"] = 0.1  # submitting a payment: below the threshold
    parts = rf.step(step)
    np.testing.assert_allclose(parts.base, [10.0, 0.0, 0.0])
    np.testing.assert_allclose(parts.env, [10.0, 1.0, -2.0])  # escalating a blocked user is learned
    np.testing.assert_allclose(parts.risk, [0.0, 0.0, 2.0])
    np.testing.assert_allclose(parts.total, [20.0, 1.0, -4.0])


def test_scalar_mode_does_not_count_the_env_reward_twice() -> None:
    rf = RewardFunction(RewardConfig(mode="scalar", env_reward_weight=1.0), num_envs=1, vocabulary=CHECKOUT)
    rf.reset(np.stack([enc(["PAYMENT_PAGE"])]))
    parts = rf.step(batch([(["PAYMENT_SUCCESS"], S())], env_reward=[10.0], terminated=[True]))
    assert float(parts.total[0]) == pytest.approx(10.0) and float(parts.env[0]) == 0.0


def test_training_reward_logs_each_component_per_env_step() -> None:
    from agentflow_core.rl.ppo import TrainingReward

    cfg = RewardConfig(mode="token_table", env_reward_weight=1.0, risk_penalty=1.0)
    reward = TrainingReward(RewardFunction(cfg, num_envs=2, vocabulary=CHECKOUT), None, key_of=lambda info: "x")
    reward.reset(batch([(["PAYMENT_PAGE"], S()), (["LOGGED_OUT"], S())]))
    first = batch(
        [(["PAYMENT_SUCCESS"], S()), (["LOGGED_IN"], S())], env_reward=[10.0, -0.01], terminated=[True, False]
    )
    first.infos[1]["risk"] = 0.9
    np.testing.assert_allclose(reward(first), [20.0, -1.01], rtol=1e-6)
    m = reward.metrics()
    assert m["reward/base"] == pytest.approx(5.0) and m["reward/env"] == pytest.approx((10.0 - 0.01) / 2)
    assert m["reward/risk"] == pytest.approx(0.5) and m["reward/total"] == pytest.approx((20.0 - 1.01) / 2)
    assert reward.metrics() == {}  # read once per rollout


def test_shaping_once_per_episode_per_term_with_components() -> None:
    cfg = RewardConfig(
        mode="token_table",
        token_rewards={"PAYMENT_SUCCESS": 10.0},
        shaping=[
            {"condition": "PAYMENT_PAGE and cart_items > 0", "reward": 2.0, "weight": 0.5},
            {"condition": "INVALID_CARD", "reward": -1.0},
        ],
    )
    rf = RewardFunction(cfg, num_envs=2, vocabulary=CHECKOUT)
    rf.reset(np.stack([enc(["LOGGED_IN"]), enc(["LOGGED_IN"])]))
    c1 = rf.step(batch([(["PAYMENT_PAGE"], {"cart_items": 0.1}), (["PAYMENT_PAGE"], S())]))  # env1: cart empty
    np.testing.assert_allclose(c1.shaping, [1.0, 0.0])
    assert c1.fired.tolist() == [[True, False], [False, False]]
    c2 = rf.step(
        batch([(["PAYMENT_PAGE", "INVALID_CARD"], {"cart_items": 0.1}), (["PAYMENT_PAGE"], {"cart_items": 0.2})])
    )
    np.testing.assert_allclose(c2.shaping, [-1.0, 1.0])  # term 0 already paid for env0
    c3 = rf.step(
        batch(
            [(["PAYMENT_SUCCESS"], {"cart_items": 0.1}), (["PAYMENT_PAGE", "INVALID_CARD"], {"cart_items": 0.2})],
            terminated=[True, False],
            reset_obs={0: ["LOGGED_IN"]},
        )
    )
    np.testing.assert_allclose(c3.base, [10.0, 0.0])
    np.testing.assert_allclose(c3.shaping, [0.0, -1.0])
    np.testing.assert_allclose(c3.total, [10.0, -1.0])
    c4 = rf.step(
        batch([(["PAYMENT_PAGE"], {"cart_items": 0.1}), (["PAYMENT_PAGE", "INVALID_CARD"], {"cart_items": 0.2})])
    )
    np.testing.assert_allclose(c4.shaping, [1.0, 0.0])  # env0's new episode pays again; env1 is farmed out


def test_shaping_total_per_episode_is_bounded_under_farming() -> None:
    cfg = RewardConfig(mode="token_table", token_rewards={}, shaping=[{"condition": "PAYMENT_PAGE", "reward": 1.0}])
    rf = RewardFunction(cfg, num_envs=1, vocabulary=CHECKOUT)
    rf.reset(enc(["LOGGED_IN"])[None])
    total = 0.0
    for k in range(40):  # oscillate in and out of the condition
        total += float(rf.step(batch([(["PAYMENT_PAGE"] if k % 2 == 0 else ["INVALID_CARD"], S())])).total[0])
    assert total == 1.0


def test_token_reward_vector_order() -> None:
    table = token_reward_vector({"PAYMENT_SUCCESS": 10.0, "ESCALATED": -1.0}, vocabulary=CHECKOUT)
    assert table[TOKEN_INDEX["PAYMENT_SUCCESS"]] == 10.0 and table[TOKEN_INDEX["ESCALATED"]] == -1.0
    assert table.sum() == 9.0


# ---------------------------------------------------------------------------------- normalisation


def test_normalizer_per_env_hand_computed() -> None:
    norm = PerEnvRewardNormalizer()
    norm.update(["a", "b", "a", "a", "b", "a"], np.array([1.0, 10.0, 2.0, 3.0, 10.0, 4.0]))
    assert norm.stats["a"].count == 4 and norm.stats["a"].mean == pytest.approx(2.5)
    assert norm.stats["a"].var == pytest.approx(1.25)  # population variance of 1..4
    assert norm.stats["b"].mean == 10.0 and norm.stats["b"].std == 0.0
    out = norm.normalize(["a", "b", "a"], np.array([4.0, 10.0, 1.0]), update=False)
    np.testing.assert_allclose(out, [1.5 / np.sqrt(1.25), 0.0, -1.5 / np.sqrt(1.25)], rtol=1e-6)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["web", "db", "api"]), st.floats(-100, 100)), min_size=1, max_size=60),
    st.integers(1, 7),
)
def test_batched_welford_equals_numpy(pairs: list[tuple[str, float]], chunk: int) -> None:
    norm = PerEnvRewardNormalizer()
    for start in range(0, len(pairs), chunk):
        part = pairs[start : start + chunk]
        norm.update([k for k, _ in part], np.array([r for _, r in part]))
    for key in {k for k, _ in pairs}:
        values = np.array([r for k, r in pairs if k == key])
        assert norm.stats[key].count == len(values)
        assert norm.stats[key].mean == pytest.approx(values.mean(), abs=1e-9)
        assert norm.stats[key].var == pytest.approx(values.var(), rel=1e-6, abs=1e-6)


def test_normalizer_state_roundtrip_and_merges() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(1.0, 2.0, 50), rng.normal(-3.0, 0.5, 30)
    one = PerEnvRewardNormalizer()
    one.update(["x"] * 50, a)
    two = PerEnvRewardNormalizer()
    two.update(["x"] * 30 + ["y"] * 30, np.r_[b, b])
    one.merge(two)
    both = np.r_[a, b]
    assert one.stats["x"].mean == pytest.approx(both.mean()) and one.stats["x"].var == pytest.approx(both.var())
    restored = PerEnvRewardNormalizer()
    restored.load_state_dict(json.loads(json.dumps(one.state_dict())))
    assert restored.state_dict() == one.state_dict()
    calibrated = PerEnvRewardNormalizer()
    calibrated.merge_stats("x", count=len(both), mean=float(both.mean()), var=float(both.var()))
    assert calibrated.stats["x"].std == pytest.approx(both.std())
    with pytest.raises(ValueError, match="version"):
        restored.load_state_dict({"version": 99})


# ---------------------------------------------------------------------------------- reward model


def two_layer_model() -> MLPRewardModel:
    w1 = np.zeros((OBS_DIM, 2))
    w1[TOKEN_INDEX["PAYMENT_SUCCESS"], 0] = 1.0
    w1[TOKEN_INDEX["INVALID_CARD"], 1] = -1.0
    return MLPRewardModel((w1, np.array([[2.0], [3.0]])), (np.array([0.0, 0.5]), np.array([0.1])))


def test_mlp_scores_hand_computed_and_roundtrip(tmp_path) -> None:
    model = two_layer_model()
    obs = np.stack([enc(["PAYMENT_SUCCESS"]), enc(["INVALID_CARD"]), enc([])])
    # h = relu(x W1 + b1): [1, .5] -> 2 + 1.5 + .1; [0, -.5] -> .1; [0, .5] -> 1.5 + .1
    np.testing.assert_allclose(model.score(obs), [3.6, 0.1, 1.6], rtol=1e-6)
    for name in ("w.json", "w.safetensors"):
        model.save(tmp_path / name)
        np.testing.assert_allclose(MLPRewardModel.load(tmp_path / name).score(obs), [3.6, 0.1, 1.6], rtol=1e-6)
    with pytest.raises(ValueError, match="one output"):
        MLPRewardModel((np.zeros((OBS_DIM, 2)),), (np.zeros(2),))


def test_server_scores_one_request_per_batch() -> None:
    model = two_layer_model()
    obs = np.stack([enc(["PAYMENT_SUCCESS"])] * 4 + [enc(["INVALID_CARD"])] * 4)
    with RewardModelServer(model) as server:
        client = RewardModelClient(server.url, timeout_s=2.0)
        scores = client.score(obs, fallback=np.full(8, -99.0))
        client.close()
        assert server.requests == 1
        assert httpx.get(f"{server.url}/health").json() == {"status": "ok", "obs_dim": OBS_DIM}
        bad = httpx.post(f"{server.url}/score", json={"obs": [[1.0, 2.0]]})
        assert bad.status_code == 400 and "shape" in bad.json()["error"]
    np.testing.assert_allclose(scores, [3.6] * 4 + [0.1] * 4, rtol=1e-6)
    assert client.failures == 0 and client.last_ok


def _score_against_a_slow_server() -> tuple[RewardModelClient, np.ndarray, float]:
    with RewardModelServer(two_layer_model(), latency_s=0.5) as server:
        client = RewardModelClient(server.url, timeout_s=0.1)
        start = time.perf_counter()
        scores = client.score(np.stack([enc(["PAYMENT_SUCCESS"])] * 3), fallback=[1.0, 2.0, 3.0])
        elapsed = time.perf_counter() - start
        client.close()
    return client, scores, elapsed


@pytest.mark.timing
def test_client_timeout_fires_before_the_slow_answer() -> None:
    assert _score_against_a_slow_server()[2] < 0.4


def test_client_timeout_falls_back_and_counts() -> None:
    client, scores, _ = _score_against_a_slow_server()
    assert scores.tolist() == [1.0, 2.0, 3.0]
    assert client.failures == 1 and client.failure_reasons == {"timeout": 1} and not client.last_ok


def test_client_server_down_falls_back_and_counts() -> None:
    server = RewardModelServer(two_layer_model())
    url = server.url
    server.close()  # port released: nothing listens there any more
    client = RewardModelClient(url, timeout_s=0.5)
    for _ in range(3):
        assert client.score(np.stack([enc([])] * 2), fallback=[0.5, 0.5]).tolist() == [0.5, 0.5]
    client.close()
    assert client.failures == 3 and client.failure_reasons == {"unreachable": 3}
    assert client.failure_rate == 1.0


def test_model_mode_scores_next_state_and_falls_back_to_token_table() -> None:
    model = MLPRewardModel.from_token_rewards({"PAYMENT_PAGE": 0.5, "PAYMENT_SUCCESS": 5.0}, CHECKOUT)
    cfg = RewardConfig(mode="model", model_url="http://127.0.0.1:1", token_rewards={"PAYMENT_SUCCESS": 10.0})
    with RewardModelServer(model) as server:
        client = RewardModelClient(server.url, timeout_s=2.0)
        rf = RewardFunction(cfg, num_envs=2, model=client, vocabulary=CHECKOUT)
        rf.reset(np.stack([enc(["LOGGED_IN"])] * 2))
        comps = rf.step(batch([(["PAYMENT_PAGE"], S()), (["PAYMENT_PAGE", "PAYMENT_SUCCESS"], S())]))
        np.testing.assert_allclose(comps.base, [0.5, 5.5])
        assert comps.model_ok
    comps = rf.step(batch([(["PAYMENT_SUCCESS"], S()), (["PAYMENT_SUCCESS"], S())]))  # server gone: token table
    client.close()
    np.testing.assert_allclose(comps.base, [10.0, 0.0])  # env1 already got PAYMENT_SUCCESS this episode
    assert not comps.model_ok and client.failures == 1
    with pytest.raises(ValueError, match="RewardModelClient"):
        RewardFunction(cfg, num_envs=1, vocabulary=CHECKOUT)
