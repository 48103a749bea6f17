"""Coverage definition, ε schedule, ε-greedy sampling, exploration over a real pool, trajectory shards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pool_fixtures import TinyFactory, tiny_variants

from agentflow_core.config import AgentFlowConfig, ExploreConfig, PoolConfig, RewardConfig
from agentflow_core.envs.experts import expert_for
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.rl.coverage import CoverageTracker, epsilon_for
from agentflow_core.rl.exploration import ExploreProgress, epsilon_greedy, explore, sample_legal
from agentflow_core.rl.reward import RewardFunction
from agentflow_core.rl.trajectories import (
    TrajectoryWriter,
    behaviour_cloning_arrays,
    goal_episodes,
    iter_episodes,
    read_card,
    read_steps,
    schema,
)
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, OBS_DIM, encode
from tasks.context import PhaseContext

TINY_TOKENS = ["LOGGED_OUT", "LOGGED_IN", "PRODUCT_VIEWED", "PAYMENT_SUCCESS"]


@pytest.mark.parametrize(
    ("coverage", "epsilon"),
    [(0.0, 0.95), (0.79, 0.95), (0.8, 0.95), (0.85, 0.625), (0.9, 0.3), (0.9001, 0.1), (1.0, 0.1)],
)
def test_epsilon_schedule(coverage: float, epsilon: float) -> None:
    assert epsilon_for(coverage, ExploreConfig()) == pytest.approx(epsilon)


def test_coverage_hand_computed() -> None:
    tracker = CoverageTracker(["LOGGED_OUT", "LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"], vocabulary=CHECKOUT)
    tracker.observe([["LOGGED_OUT"]])
    tracker.update([["LOGGED_IN", "CART_EMPTY"]], [["LOGGED_OUT"]])
    # seen 3 of 4 reachable tokens; edges LOGGED_OUT->LOGGED_IN, LOGGED_OUT->CART_EMPTY
    assert tracker.token_coverage == 0.75 and tracker.edge_coverage == 1.0 and tracker.ratio == 0.75
    tracker.add_reference([["LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"]], [["LOGGED_IN", "CART_EMPTY"]])
    assert tracker.edge_coverage == 0.5 and tracker.ratio == 0.5  # 2 explored of 4 known edges
    tracker.update(
        encode(["LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"], {})[None], encode(["LOGGED_IN", "CART_EMPTY"], {})[None]
    )
    assert tracker.token_coverage == 1.0 and tracker.edge_coverage == 1.0 and tracker.ratio == 1.0
    tracker.update([["LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"]], [["LOGGED_IN", "CART_EMPTY", "PRODUCT_VIEWED"]])
    graph = json.loads(json.dumps(tracker.graph()))  # JSON-able
    edges = {(e["source"], e["target"]): (e["count"], e["reference"]) for e in graph["edges"]}
    assert edges == {
        ("LOGGED_OUT", "LOGGED_IN"): (1, False),
        ("LOGGED_OUT", "CART_EMPTY"): (1, False),
        ("LOGGED_IN", "PRODUCT_VIEWED"): (1, True),
        ("CART_EMPTY", "PRODUCT_VIEWED"): (1, True),
    }
    visits = {n["token"]: n["visits"] for n in graph["nodes"]}
    assert visits["LOGGED_IN"] == 3 and visits["LOGGED_OUT"] == 1 and visits["PRODUCT_VIEWED"] == 2
    assert graph["state_coverage_ratio"] == 1.0
    with pytest.raises(ValueError, match="unknown"):
        CoverageTracker(["NOT_A_TOKEN"], vocabulary=CHECKOUT)


def test_sample_legal_is_uniform_over_legal_actions() -> None:
    rng = np.random.default_rng(0)
    masks = np.zeros((30_000, N_ACTIONS), bool)
    masks[:, [0, 4, 7]] = True
    actions = sample_legal(masks, rng)
    assert set(np.unique(actions).tolist()) == {0, 4, 7}
    np.testing.assert_allclose(np.bincount(actions, minlength=N_ACTIONS)[[0, 4, 7]] / 30_000, 1 / 3, atol=0.02)


def test_epsilon_greedy_rate() -> None:
    rng = np.random.default_rng(1)
    masks = np.ones((20_000, N_ACTIONS), bool)
    greedy = np.full(20_000, 3)
    actions, explored = epsilon_greedy(greedy, masks, 0.0, rng)
    assert (actions == 3).all() and not explored.any()
    actions, explored = epsilon_greedy(greedy, masks, 0.25, rng)
    assert explored.mean() == pytest.approx(0.25, abs=0.015)
    assert (actions[~explored] == 3).all()


def tiny_pool(n: int = 8) -> InProcessPool:
    return InProcessPool(tiny_variants(4), TinyFactory(), n, PoolConfig(num_workers=1), seed=0)


def run_tiny(out: Path, seed: int = 0, total_steps: int = 800) -> tuple:
    cfg = ExploreConfig(total_steps=total_steps, num_envs=8, shard_rows=300)
    expert = expert_for("any")
    progress: list[ExploreProgress] = []
    pool = tiny_pool()
    try:
        writer = TrajectoryWriter(out, cfg.shard_rows, card={"phase": "test"}, vocabulary=CHECKOUT)
        reward_fn = RewardFunction(
            RewardConfig(shaping=[{"condition": "LOGGED_IN", "reward": 0.5}]), pool.num_envs, vocabulary=CHECKOUT
        )
        result = explore(
            pool,
            expert.act_batch,
            cfg,
            np.random.default_rng(seed),
            writer,
            seed=seed,
            tracker=CoverageTracker(TINY_TOKENS, vocabulary=CHECKOUT),
            reward_fn=reward_fn,
            policy_hash="expert-test",
            reference_fn=expert.act_batch,
            reference_pool_steps=10,
            on_progress=progress.append,
        )
        card = writer.close()
    finally:
        pool.close()
    return result, card, progress


def test_explore_on_tiny_pool(tmp_path: Path) -> None:
    result, card, progress = run_tiny(tmp_path / "a")
    assert result.steps == 800 and card["rows"] == 800
    assert [s["rows"] for s in card["shards"]] == [300, 300, 200]
    assert not list((tmp_path / "a").glob("*.tmp"))
    # the tiny shop's four tokens are all reached, and every expert edge is reproduced
    assert result.token_coverage == 1.0 and result.state_coverage_ratio == 1.0
    assert result.final_epsilon == pytest.approx(0.1)
    assert result.goal_episodes > 0 and result.episodes >= result.goal_episodes
    assert progress and progress[-1].steps == 800 and progress[-1].state_coverage_ratio == 1.0
    assert card["policy_hashes"] == ["expert-test"] and card["phase"] == "test"
    assert card["env_versions"] == {f"tiny_shop_v1_{i:04d}": "1" for i in range(4)}
    table = read_steps(tmp_path / "a", vocabulary=CHECKOUT)
    assert table.schema.equals(schema(CHECKOUT)) and table.num_rows == 800
    # business vs shaped reward are both recorded; the LOGGED_IN shaping term pays once per episode
    shaping = table.group_by("episode_id").aggregate([("shaping_reward", "sum")]).column("shaping_reward_sum")
    assert set(np.round(shaping.to_numpy(), 6).tolist()) <= {0.0, 0.5}
    episodes = list(iter_episodes(tmp_path / "a", vocabulary=CHECKOUT))
    assert len(episodes) == card["episodes"]
    for ep in episodes:
        assert ep.actions.shape == (len(ep),) and ep.obs.shape == (len(ep), 31)
        if ep.complete:
            assert ep.terminated or ep.failure_reason == "max_steps"
    goals = list(goal_episodes(tmp_path / "a", vocabulary=CHECKOUT))
    assert len(goals) == card["goal_episodes"] == result.goal_episodes
    for ep in goals:
        assert ep.tokens[-1] == ["PAYMENT_SUCCESS"] and ep.env_rewards[-1] == pytest.approx(10.0)
        assert ep.rewards[-1] == pytest.approx(10.0)  # token table PAYMENT_SUCCESS
        assert ep.actions[-1] == 6  # SUBMIT_PAYMENT
        assert ep.action_mask[np.arange(len(ep)), ep.actions].all()  # only legal actions were taken
    accepted = {v.content_hash: frozenset({"PAYMENT_SUCCESS"}) for v in tiny_variants(4)}
    obs, actions, masks = behaviour_cloning_arrays(tmp_path / "a", accepted, vocabulary=CHECKOUT)
    assert len(obs) == sum(len(e) for e in goals) and obs.shape[1] == 31 and masks.shape[1] == N_ACTIONS
    first = tiny_variants(1)[0].content_hash  # a variant left out of ``accepted`` gives no BC rows
    only_first = behaviour_cloning_arrays(tmp_path / "a", {first: accepted[first]}, vocabulary=CHECKOUT)[0]
    assert len(only_first) == sum(len(e) for e in goals if e.variant_hash == first) < len(obs)


def test_explore_is_deterministic(tmp_path: Path) -> None:
    run_tiny(tmp_path / "a", total_steps=240)
    run_tiny(tmp_path / "b", total_steps=240)
    cols = ["episode_id", "env_id", "action", "explored", "tokens", "reward", "terminated"]
    assert (
        read_steps(tmp_path / "a", vocabulary=CHECKOUT)
        .select(cols)
        .equals(read_steps(tmp_path / "b", vocabulary=CHECKOUT).select(cols))
    )


def test_shard_checksum_is_verified(tmp_path: Path) -> None:
    run_tiny(tmp_path / "a", total_steps=80)
    shard = tmp_path / "a" / read_card(tmp_path / "a")["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x00")
    with pytest.raises(ValueError, match="sha256"):
        read_steps(tmp_path / "a", vocabulary=CHECKOUT)


def test_run_explore_step_writes_dataset_and_metrics(tmp_path: Path) -> None:
    from agentflow_core.splits import write_split_catalogue
    from tasks.steps.explore import run_explore

    write_split_catalogue(
        tiny_variants(4), tmp_path / "variants", {"generator": "test"}, validation=0.1, test=0.1, seed=0, dimensions=[]
    )
    cfg = AgentFlowConfig.model_validate(
        {
            "explore": {
                "total_steps": 400,
                "num_envs": 8,
                "shard_rows": 1000,
                "reference_pool_steps": 10,
                "remediation": {"max_steps": 0},
            },
            "pool": {"num_workers": 1},
        }
    )
    seen: list[ExploreProgress] = []
    summary = run_explore(
        PhaseContext.of(cfg),
        tmp_path / "variants",
        tmp_path / "explore",
        tmp_path / "metrics.json",
        on_progress=seen.append,
        pool_factory=lambda c, variants, num_envs, **_: InProcessPool(variants, TinyFactory(), num_envs, c.cfg.pool),
        class_paths=["pool_fixtures:TinyShopEnv"],
    )
    # the tiny family declares no RAW_STATES, so all 23 tokens count as reachable: coverage 4/23
    assert summary["reachable_tokens"] == 23
    assert summary["token_coverage"] == pytest.approx(4 / 23)
    assert summary["state_coverage_ratio"] == pytest.approx(4 / 23)
    assert summary["rows"] == 400 and summary["shards"] == 1 and seen
    assert (
        not summary["passed"]
        and summary["gate"] == "explore gate failed: state_coverage_ratio=0.1739 (required >= 0.92)"
    )
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["state_coverage_ratio"] == pytest.approx(4 / 23) and metrics["mean_epsilon"] == pytest.approx(0.95)
    assert (tmp_path / "explore" / "coverage.json").is_file()
    assert read_card(tmp_path / "explore")["rows"] == 400


@pytest.mark.slow
def test_run_explore_on_registry_envs(tmp_path: Path, local_config: Any) -> None:
    """End to end over the three real channel families built from ``configs/envs`` by the real pool."""
    from agentflow_core.splits import read_splits, write_split_catalogue
    from agentflow_core.variants import VariantSpec, content_hash
    from tasks.steps.explore import run_explore

    specs = []
    for base, family in [
        ("web_checkout_v2", "web_checkout"),
        ("order_db_v1", "order_db"),
        ("payment_api_v1", "payment_api"),
    ]:
        for stage, tier in [("login", "vip"), ("payment", "standard"), ("checkout", "blocked")]:
            params = {"start_stage": stage, "user_tier": tier, "network": "packet_loss_5%", "inventory": 0}
            specs.append(VariantSpec(f"{base}_{stage}_{tier}", base, family, params, content_hash(base, params)))
    write_split_catalogue(
        specs, tmp_path / "variants", {"generator": "test"}, validation=0.1, test=0.1, seed=0, dimensions=["user_tier"]
    )
    specs = read_splits(tmp_path / "variants")["train"]
    cfg = local_config(
        explore={"total_steps": 1600, "num_envs": 16, "reference_pool_steps": 20, "remediation": {"max_steps": 0}},
        pool={"num_workers": 1},
    )
    summary = run_explore(PhaseContext.of(cfg), tmp_path / "variants", tmp_path / "explore", tmp_path / "metrics.json")
    # PAGE_NOT_FOUND: every family's mapping can emit it, no semantic action leads to it (UNREACHABLE_TOKENS)
    assert summary["rows"] == 1600 and summary["reachable_tokens"] == 22
    assert list(summary["unreachable_tokens"]) == ["PAGE_NOT_FOUND"]
    assert 0.5 <= summary["token_coverage"] <= 1.0 and 0.0 < summary["edge_coverage"] <= 1.0
    card = read_card(tmp_path / "explore")
    assert card["env_versions"] == {s.env_id: ("2" if s.family == "web_checkout" else "1") for s in specs}
    table = read_steps(tmp_path / "explore", vocabulary=CHECKOUT)
    masks = np.asarray(table.column("action_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False)).reshape(
        -1, N_ACTIONS
    )
    assert masks[np.arange(table.num_rows), table.column("action").to_numpy()].all()
    graph = json.loads((tmp_path / "explore" / "coverage.json").read_text())
    assert graph["state_coverage_ratio"] == pytest.approx(summary["state_coverage_ratio"])


@pytest.mark.parametrize("behaviour", ["expert", "policy"])
def test_behaviour_policy_is_the_expert_or_the_network_ppo_starts_from(behaviour: str) -> None:
    import torch

    from agentflow_core.rl.policy import ActorCritic, policy_hash
    from tasks.steps.explore import behaviour_policy

    cfg = AgentFlowConfig.model_validate({"explore": {"behaviour": behaviour}, "base": {"seed": 3}})
    act, digest = behaviour_policy(PhaseContext.of(cfg))
    obs = np.zeros((4, OBS_DIM), np.float32)
    masks = np.ones((4, N_ACTIONS), bool)
    actions = act(obs, masks)
    assert actions.shape == (4,) and ((actions >= 0) & (actions < N_ACTIONS)).all()
    if behaviour == "expert":
        assert digest.startswith("expert-")
    else:
        torch.manual_seed(3)  # run_train's initialisation for the same seed
        assert digest == policy_hash(ActorCritic(OBS_DIM, N_ACTIONS, hidden_sizes=cfg.train.hidden_sizes))


@pytest.mark.parametrize(("gate", "expected_steps"), [(0.1, 400), (1.0, 400 + 240)])
def test_remediation_runs_until_the_gate_or_its_step_budget(tmp_path: Path, gate: float, expected_steps: int) -> None:
    """Below the gate after total_steps, exploration goes on with the raised epsilon for at most max_steps."""
    from agentflow_core.splits import write_split_catalogue
    from tasks.steps.explore import run_explore

    write_split_catalogue(
        tiny_variants(4), tmp_path / "variants", {"generator": "test"}, validation=0.1, test=0.1, seed=0, dimensions=[]
    )
    cfg = AgentFlowConfig.model_validate(
        {
            "explore": {
                "total_steps": 400,
                "num_envs": 8,
                "reference_pool_steps": 10,
                "min_state_coverage": gate,
                "remediation": {"max_steps": 240, "epsilon": 1.0},
            },
            "pool": {"num_workers": 1},
        }
    )
    summary = run_explore(
        PhaseContext.of(cfg),
        tmp_path / "variants",
        tmp_path / "explore",
        tmp_path / "metrics.json",
        pool_factory=lambda c, variants, num_envs, **_: InProcessPool(variants, TinyFactory(), num_envs, c.cfg.pool),
        class_paths=["pool_fixtures:TinyShopEnv"],
    )
    assert summary["explore_steps"] == expected_steps and summary["rows"] == expected_steps
    assert summary["remediation_steps"] == expected_steps - 400
    assert summary["passed"] is (gate < 1.0)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["budget/explore/steps"] == expected_steps and metrics["budget/explore/budget_steps"] == 640
