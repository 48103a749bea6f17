"""The discriminator reward validator: it learns the expert's steps, scores episodes, down-weights suspicious ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentflow_core.evaluation.records import EpisodeRecord, StepRecord
from agentflow_core.evaluation.validator import (
    Discriminator,
    RolloutValidator,
    episode_authenticity,
    features,
    fit_discriminator,
    load_discriminator,
    policy_negatives,
    save_discriminator,
    validate_episodes,
)
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, N_TOKENS, OBS_DIM, TOKENS
from tasks.context import PhaseContext

# a toy expert: in the state with token k active it takes action k % N_ACTIONS; every action is legal
STATES = 6


def _expert_data(n: int = 600) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    k = rng.integers(0, STATES, n)
    obs = np.zeros((n, OBS_DIM), np.float32)
    obs[np.arange(n), k] = 1.0
    return obs, np.ones((n, N_ACTIONS), bool), (k % N_ACTIONS).astype(np.int64)


@pytest.fixture(scope="module")
def model() -> Discriminator:
    obs, masks, actions = _expert_data()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the product runs it (tasks.determinism); many threads only contend here
    try:
        fitted, fit = fit_discriminator(obs, masks, actions, n_tokens=N_TOKENS, hidden=32, epochs=1, seed=0)
    finally:
        torch.set_num_threads(threads)
    assert fit.heldout_accuracy > 0.95 and fit.expert_samples == 600
    return fitted


def _episode(eid: str, states: list[int], actions: list[int]) -> tuple[EpisodeRecord, list[StepRecord]]:
    steps = [
        StepRecord(
            eid, "web-1", "web", {}, t + 1, frozenset({TOKENS[s]}), a, frozenset(), 0.1, 0.5, 0.0, False, False, None
        )
        for t, (s, a) in enumerate(zip(states, actions, strict=True))
    ]
    record = EpisodeRecord(eid, "web-1", "web", {}, len(steps), 1.0, 5.0, 1.0, False, False, None, 0)
    return record, steps


def test_policy_negatives_are_other_legal_actions() -> None:
    masks = np.array([[True, True, False] + [False] * (N_ACTIONS - 3), [True] + [False] * (N_ACTIONS - 1)])
    neg = policy_negatives(masks, np.array([0, 0]), np.random.default_rng(0))
    assert neg.tolist() == [1, 0]  # the only other legal action; a lone legal action stays
    x = features(np.eye(2, N_TOKENS, dtype=np.float32), np.array([3, 4]), N_TOKENS, N_ACTIONS)
    assert x.shape == (2, N_TOKENS + N_ACTIONS) and x[0, N_TOKENS + 3] == 1.0 and x[1, 1] == 1.0


def test_expert_episodes_pass_and_loops_are_flagged(model: Discriminator, tmp_path: Path) -> None:
    save_discriminator(model, tmp_path / "d.safetensors")
    model = load_discriminator(tmp_path / "d.safetensors")
    honest, honest_steps = _episode("honest", [0, 1, 2, 3], [0, 1, 2, 3])
    # a loop alternating two states with actions the expert never takes there
    loop, loop_steps = _episode("loop", [1, 2] * 5, [3, 4] * 5)
    report = validate_episodes(model, [honest, loop], honest_steps + loop_steps, threshold=0.5, vocabulary=CHECKOUT)
    assert report.flagged == 1 and report.rate == 0.5
    assert [e["episode_id"] for e in report.examples] == ["loop"]
    score = episode_authenticity(model, honest_steps + loop_steps, CHECKOUT)
    assert score["honest"] > 0.8 and score["loop"] < 0.5


def test_rollout_reweight_scales_positive_rewards_of_suspicious_episodes_only(model: Discriminator) -> None:
    hook = RolloutValidator(model, threshold=0.5, weight=0.1)
    n_steps, num_envs = 4, 2
    obs = np.zeros((n_steps, num_envs, OBS_DIM), np.float32)
    obs[:, :, 1] = 1.0  # state 1 everywhere: the expert takes action 1
    actions = np.array([[1, 8], [1, 8], [8, 8], [8, 1]])
    done = np.zeros((n_steps, num_envs), bool)
    done[1, 0] = True  # slot 0: expert episode (steps 0-1), then a suspicious one (steps 2-3)
    rewards = np.array([[1.0, 1.0], [-1.0, 2.0], [3.0, -2.0], [4.0, 1.0]], np.float32)
    out = hook.reweight(obs, actions, done, rewards)
    expected = rewards.copy()
    expected[2:, 0] = [0.3, 0.4]  # slot 0's second episode: positive rewards x 0.1
    expected[:, 1] = [0.1, 0.2, -2.0, 0.1]  # slot 1: 3 of 4 steps off-expert -> suspicious; the penalty stays
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    metrics = hook.metrics()
    assert metrics["validator/suspicious_share"] == 2 / 3
    assert hook.metrics()["validator/suspicious_share"] == 0.0  # reading starts a new window


def test_bench_catches_planted_hacking_and_passes_the_expert_on_the_tiny_catalogue(tiny_config: Any) -> None:
    """The bench's path end to end (catalogue, exploration, the validator phase, planted and honest episodes)."""
    from benchmarks.validator_bench import HABITS, run_validator_bench
    from tasks.paths import DataPaths
    from tasks.steps.explore import run_explore
    from tasks.steps.validator import load_validator, run_validator
    from tasks.steps.variants import run_variants

    explore = {"total_steps": 1500, "epsilon_high": 0.2, "epsilon_mid": 0.2, "epsilon_low": 0.2}
    cfg = tiny_config(explore=explore)
    paths = DataPaths.of(cfg)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_variants(PhaseContext.of(cfg), paths.variants)
        run_explore(PhaseContext.of(cfg), paths.variants, paths.trajectories)
        fit = run_validator(PhaseContext.of(cfg), metrics_path=paths.metrics_file("validator"))
        model = load_validator(PhaseContext.of(cfg))
        assert fit["passed"] and model is not None
        result = run_validator_bench(PhaseContext.of(cfg), model, episodes=24)
    finally:
        torch.set_num_threads(threads)
    assert set(result["per_behaviour"]) == set(HABITS)
    assert result["planted_episodes"] >= 24 and result["honest_episodes"] == 24
    assert result["caught_rate"] >= 0.9 and result["false_positive_rate"] <= 0.05
    assert result["targets_met"] == {"caught_rate": True, "false_positive_rate": True}


def test_report_tree_lists_the_suspicious_episodes(model: Discriminator) -> None:
    from agentflow_core.evaluation.report import _validator_nodes

    honest, honest_steps = _episode("honest", [0, 1, 2], [0, 1, 2])
    loop, loop_steps = _episode("loop", [1, 2] * 3, [7, 8] * 3)
    verdict = validate_episodes(
        model, [honest, loop], honest_steps + loop_steps, threshold=0.5, vocabulary=CHECKOUT
    ).to_dict()
    (node,) = _validator_nodes(verdict)
    assert node.label.startswith("Reward Validator: 1 suspicious episode(s) (50.0%)")
    assert [c.label.split(":")[0] for c in node.children] == ["web-1"]
    assert _validator_nodes(None) == []  # validator off: no line
