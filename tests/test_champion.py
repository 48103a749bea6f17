"""Champion/challenger: the pure canary decision, the stable slice, and a real slice evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentflow_core.evaluation.champion import champion_slice, decide_promotion, reward_gain, slice_position
from agentflow_core.evaluation.paired import paired_difference
from agentflow_core.semantics import N_ACTIONS, OBS_DIM
from agentflow_core.variants import VariantSpec, content_hash
from tasks.context import PhaseContext


def test_promotes_when_consistent_and_better() -> None:
    paired = paired_difference([0.5, 0.4, 0.6, 0.5, 0.5])  # better on every variant: lower bound 0.41 > 0
    d = decide_promotion(7.0, 6.5, 0.9, min_consistency=0.85, min_reward_gain=0.05, paired=paired)
    assert d.promote
    assert d.numbers["reward_gain"] == pytest.approx(0.5 / 6.5)
    assert "promote" in d.reason and "0.900" in d.reason and "+7.7%" in d.reason


def test_a_gain_within_the_sampling_noise_keeps_the_champion() -> None:
    # the same +7.7% mean gain, but two variants of five got worse: the paired bound straddles 0
    noisy = paired_difference([3.0, -2.0, 2.5, -1.5, 0.5])
    assert noisy.mean == pytest.approx(0.5) and noisy.low < 0
    d = decide_promotion(7.0, 6.5, 0.9, paired=noisy)
    assert not d.promote and "within the slice's sampling noise" in d.reason
    assert not decide_promotion(7.0, 6.5, 0.9).promote  # no paired figures: not shown better


def test_rejects_with_the_numbers_in_the_reason() -> None:
    diverged = decide_promotion(8.0, 6.0, 0.6)
    assert not diverged.promote
    assert "inconsistent across the slice's channels" in diverged.reason and "0.600" in diverged.reason
    told = decide_promotion(8.0, 6.0, 0.9, agreement=0.4)
    assert "agrees with the champion on 0.400" in told.reason and told.numbers["agreement_with_champion"] == 0.4
    small_gain = decide_promotion(6.2, 6.0, 0.95)
    assert not small_gain.promote
    assert "reward does not improve enough" in small_gain.reason and "+3.3%" in small_gain.reason
    assert "6.200" in small_gain.reason and "6.000" in small_gain.reason


def test_no_champion_promotes() -> None:
    d = decide_promotion(3.0, None, None)
    assert d.promote and d.reason.startswith("no champion yet")


def test_reward_gain_uses_the_champion_magnitude() -> None:
    assert reward_gain(-0.5, -1.0) == pytest.approx(0.5)
    assert reward_gain(1.0, 0.0) > 1e6


def test_slice_is_stable_and_about_the_fraction() -> None:
    specs = [
        VariantSpec(f"v_{i}", "b", "f", {"inventory": i}, content_hash("b", {"inventory": i})) for i in range(2000)
    ]
    first = champion_slice(specs, 0.1)
    assert [s.env_id for s in first] == [s.env_id for s in champion_slice(list(reversed(specs)), 0.1)][::-1]
    assert 150 < len(first) < 250
    assert all(slice_position(s.env_id) < 0.1 for s in first)
    assert len(champion_slice(specs[:3], 1e-9)) == 1


def test_real_slice_evaluation_keeps_and_promotes(tmp_path: Path, local_config: Any) -> None:
    from agentflow_core.rl.checkpoint import save_checkpoint
    from agentflow_core.rl.policy import ActorCritic
    from agentflow_core.semantics import VOCAB_VERSION
    from tasks.steps.report import run_champion_challenger

    cfg = local_config(
        variants={"samples_per_combination": 2},
        stress={"num_envs": 8},
        report={"champion_episodes": 30, "champion_slice": 1.0},
    )
    untrained = save_checkpoint(
        tmp_path / "ckpt",
        "update_00000000",
        ActorCritic(OBS_DIM, N_ACTIONS).state_dict(),
        {},
        {"vocab_version": VOCAB_VERSION, "hidden_sizes": [64, 64]},
    )
    same = run_champion_challenger(PhaseContext.of(cfg), "expert", "expert")
    assert not same["promote"] and same["numbers"]["agreement_with_champion"] == 1.0
    assert same["numbers"]["reward_gain"] == 0.0 and "reward does not improve enough" in same["reason"]
    assert same["slice_variants"] >= 1 and same["states_compared"] > 0
    better = run_champion_challenger(PhaseContext.of(cfg), "expert", untrained)
    assert better["numbers"]["challenger_return"] > better["numbers"]["champion_return"]
    # better, consistent on its own (the rules read tokens only) and unlike the untrained champion: promoted
    assert better["numbers"]["agreement_with_champion"] < 0.85 and better["numbers"]["consistency"] == 1.0
    assert better["promote"], better["reason"]
    first = run_champion_challenger(PhaseContext.of(cfg), "expert", None)
    assert first["promote"] and first["reason"].startswith("no champion yet")
