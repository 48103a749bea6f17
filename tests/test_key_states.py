"""Key states mined from exploration episodes (agentflow_core.rl.key_states) on hand-built episodes."""

from __future__ import annotations

import numpy as np
import pytest

from agentflow_core.rl.key_states import KeyStateLimits, mine_key_states
from agentflow_core.rl.trajectories import Episode

ACCEPTED = frozenset({"DONE"})


def episode(variant: str, tokens: list[list[str]], reward: float = 0.0) -> Episode:
    """A terminated episode whose states after each step are ``tokens`` and whose last step pays ``reward``."""
    n = len(tokens)
    rewards = np.zeros(n, np.float32)
    rewards[-1] = reward
    return Episode(
        episode_id=f"{variant}-{id(tokens)}",
        env_id="env",
        variant_hash=variant,
        obs=np.zeros((n, 1), np.float32),
        action_mask=np.ones((n, 1), bool),
        actions=np.zeros(n, np.int64),
        rewards=rewards,
        env_rewards=rewards,
        tokens=tokens,
        terminated=True,
        truncated=False,
        failure_reason=None,
        goal="DONE",
    )


def world() -> list[Episode]:
    """Warm variant ``w``: 10 episodes via KEY to DONE. Cold variant ``c``: 1 of 10 via KEY to DONE, 9 fail via COMMON."""
    eps = [episode("w", [["START"], ["COMMON"], ["KEY"], ["DONE"]], reward=10.0) for _ in range(10)]
    eps += [episode("c", [["START"], ["COMMON"], ["KEY"], ["DONE"]], reward=10.0)]
    eps += [episode("c", [["START"], ["COMMON"], ["COMMON"], ["FAILED"]]) for _ in range(9)]
    return eps


def test_the_token_before_the_outcome_that_is_rare_on_cold_variants_is_found() -> None:
    limits = KeyStateLimits(min_episodes=5, max_cold_share=0.1, cold_threshold=0.3, weight=0.5)
    keys = mine_key_states(world(), {"w": ACCEPTED, "c": ACCEPTED}, limits)
    assert [k.token for k in keys] == ["KEY"]
    (key,) = keys
    # P(DONE | KEY) = 11/11, P(DONE) = 11/20: lift 0.45; KEY on 1 of the cold variant's 40 steps
    assert key.lift == pytest.approx(1.0 - 11 / 20)
    assert key.cold_share == pytest.approx(1 / 40)
    assert key.episodes == 11
    assert key.reward == pytest.approx(0.5 * 0.45 * 10.0)


def test_outcome_tokens_reset_tokens_and_common_cold_tokens_are_not_key_states() -> None:
    limits = KeyStateLimits(min_episodes=5, max_cold_share=0.01)
    assert mine_key_states(world(), {"w": ACCEPTED, "c": ACCEPTED}, limits) == []  # KEY's cold share 0.025 > 0.01


def test_variants_without_an_accepted_outcome_are_skipped() -> None:
    assert mine_key_states(world(), {}, KeyStateLimits(min_episodes=1)) == []
