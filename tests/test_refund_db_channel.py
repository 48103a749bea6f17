"""Refund's SQL channel as data: configs/refund/envs/refund_db_v1.yaml on the generic SQL channel.

``tests/data/refund_db_golden.json`` holds 24 refund episodes (eight scenarios; the expert, random legal
actions and random legal actions that escalate only when nothing else is legal) recorded from the
hand-written SQL env this document replaced. The channel, fed only the env config's data, must
reproduce every token, observation, reward, failure reason and ``applied`` flag -- the random draws
(a dropped request, a review still pending) included.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentflow_core.envs.sql_channel import SQLChannelEnv
from agentflow_core.process import ProcessSpec
from agentflow_core.registry import EnvEntry
from tasks.config_io import parse_config
from tasks.process_io import load_process
from tasks.registry_io import load_registry

REPO = Path(__file__).resolve().parents[1]
REFUND_ENVS = REPO / "configs" / "refund" / "envs"
GOLDEN = REPO / "tests" / "data" / "refund_db_golden.json"


@pytest.fixture(scope="module")
def refund() -> tuple[ProcessSpec, EnvEntry]:
    cfg = parse_config({"process": "refund", "base": {"env_config_dir": str(REFUND_ENVS)}})
    return load_process(cfg), load_registry(cfg).get("refund_db_v1")


def _act(policy: str, process: ProcessSpec, expert: Any, obs: np.ndarray, mask: Any, rng: np.random.Generator) -> int:
    if policy == "expert":
        return int(expert.act(obs, mask))
    legal = np.flatnonzero(mask)
    if policy == "deep":  # random legal actions, escalating only when nothing else is legal
        escalate = process.vocabulary.actions.index("ESCALATE")
        legal = legal[legal != escalate] if len(legal) > 1 else legal
    return int(rng.choice(legal))


def replay(process: ProcessSpec, entry: EnvEntry, episode: dict[str, Any]) -> list[dict[str, Any]]:
    """The episode's policy on the channel, recorded in the golden file's shape."""
    env = entry.make(episode["params"])
    obs, info = env.reset(seed=episode["seed"])
    rng, expert = np.random.default_rng(episode["seed"]), process.expert(entry.family)
    steps: list[dict[str, Any]] = [{"tokens": sorted(info["tokens"]), "obs": [round(float(x), 6) for x in obs]}]
    done = False
    while not done:
        action = _act(episode["policy"], process, expert, obs, info["action_mask"], rng)
        obs, reward, terminated, truncated, info = env.step(action)
        steps.append(
            {
                "action": action,
                "reward": round(float(reward), 6),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                "failure_reason": info.get("failure_reason"),
                "applied": info.get("applied"),
                "tokens": sorted(info["tokens"]),
                "obs": [round(float(x), 6) for x in obs],
            }
        )
        done = terminated or truncated
    env.close()
    return steps


def test_the_data_channel_replays_the_hand_written_envs_episodes(refund: tuple[ProcessSpec, EnvEntry]) -> None:
    process, entry = refund
    golden = json.loads(GOLDEN.read_text())
    assert len(golden) == 24 and entry.class_path == "agentflow_core.envs.sql_channel:SQLChannelEnv"
    for episode in golden:
        assert replay(process, entry, episode) == episode["steps"], (episode["params"], episode["policy"])
    reasons = {s.get("failure_reason") for e in golden for s in e["steps"]}
    assert {"network_timeout", "evidence_required", "review_pending", "escalated", "withdrawn"} <= reasons
    assert {"account_flagged", "not_signed_in"} <= reasons
    assert any(s.get("truncated") for e in golden for s in e["steps"])  # and the step limit


def test_business_value_and_outcome_of_the_endings(refund: tuple[ProcessSpec, EnvEntry]) -> None:
    _, entry = refund
    scenario = entry.scenario({"entry_stage": "under_review", "review_pending_rate": 0.0})
    env = SQLChannelEnv(scenario, "refund_db_v1_t", **entry.kwargs)
    env.reset(seed=0)
    issued = env.step({"type": "sql", "action": "CHECK_STATUS"})
    assert (issued.terminated, issued.reward, issued.info["outcome"], issued.info["business_value"]) == (
        True,
        pytest.approx(10.0),
        "goal",
        100.0,
    )
    env.reset(seed=0)
    escalated = env.step({"type": "sql", "action": "ESCALATE"})  # an ok account handed to support: a failure
    assert (escalated.info["outcome"], escalated.reward) == ("failed", pytest.approx(-1.0))
    assert env.step({"type": "sql", "action": "RETRY"}).info["failure_reason"] == "not_applicable"
    env.close()
