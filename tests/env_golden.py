"""Fixed trajectories of every registered family, digested step by step: the golden record of env behaviour.

A fast path in a channel (statements compiled once, fewer round trips, cheaper HTTP) must leave
every observation, reward, termination and info unchanged. :func:`record` drives one env per family
(re-targeted with ``reconfigure`` from scenario to scenario) through scenarios chosen to reach
network drops and timeouts, constraint violations, declines and top-ups, blocked users, session
and order expiry and truncation, with the scripted expert and with random legal actions. Each step
keeps its action, reward, flags and failure reason in clear and a digest of everything else (raw
channel observation, channel info, semantic vector and mask). Run this file to re-record
``tests/data/env_golden.json`` -- only from an implementation whose behaviour is the reference.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from pool_fixtures import registry_catalogue

from agentflow_core.envs.base import StepResult
from agentflow_core.semantics import SemanticAction
from agentflow_core.variants import VariantSpec, content_hash
from tasks.process_io import load_process

GOLDEN = Path(__file__).resolve().parent / "data" / "env_golden.json"
STEPS_PER_RUN = 36
SCENARIOS: tuple[dict[str, Any], ...] = (
    {},
    {"network": "packet_loss_5%", "user_tier": "vip", "start_stage": "product_detail", "balance": 80.0},
    {"network": "latency_500ms", "start_stage": "checkout", "card_decline_rate": 0.9},
    {"user_tier": "blocked", "start_stage": "product_detail"},
    {
        "network": "packet_loss_5%",
        "start_stage": "payment",
        "inventory": 0,
        "session_timeout_steps": 3,
        "max_episode_steps": 12,
    },
    {"start_stage": "product_detail", "inventory": 0, "balance": 50.0, "price_factor": 1.37},
    {"network": "latency_500ms", "user_tier": "vip", "start_stage": "payment", "card_decline_rate": 1.0},
)

POLICIES = ("expert", "random", "wander")
# Actions that can end an episode (paying included): "wander" avoids them to reach expiry and truncation.
_ENDING = np.array([SemanticAction.ESCALATE, SemanticAction.CANCEL_ORDER, SemanticAction.SUBMIT_PAYMENT])


class _Recorder:
    """Passes a physical env through and keeps what it returned (the raw channel output)."""

    def __init__(self, physical: Any) -> None:
        self.physical = physical
        self.env_id = physical.env_id
        self.scenario = physical.scenario
        self.last: Any = None

    def reset(self, seed: int | None = None) -> tuple[Any, Any]:
        self.last = self.physical.reset(seed=seed)
        return self.last

    def step(self, native_action: Any) -> StepResult:
        self.last = self.physical.step(native_action)
        return self.last

    def reconfigure(self, scenario: Any, env_id: str) -> None:
        self.physical.reconfigure(scenario, env_id)
        self.scenario, self.env_id = scenario, env_id

    def close(self) -> None:
        self.physical.close()


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, StepResult):
        return value.as_dict()
    raise TypeError(f"unexpected {type(value).__name__} in a trajectory")


def _digest(*parts: Any) -> str:
    text = json.dumps(parts, sort_keys=True, default=_plain, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _run(env: Any, recorder: _Recorder, family: str, policy: str, seed: int) -> list[list[Any]]:
    rng = np.random.default_rng(seed)
    expert = load_process(name="checkout").expert(family)  # the expert as data (configs/processes/checkout.yaml)
    episode = 0
    obs, info = env.reset(seed=seed)
    rows: list[list[Any]] = [["reset", _digest(recorder.last, obs, info)]]
    for _ in range(STEPS_PER_RUN):
        mask = info["action_mask"]
        legal = np.flatnonzero(mask)
        if policy == "wander":  # random, but never ends the episode by choice: reaches expiry and truncation
            legal = np.setdiff1d(legal, _ENDING) if np.setdiff1d(legal, _ENDING).size else legal
        action = expert.act(obs, mask) if policy == "expert" else int(rng.choice(legal))
        obs, reward, terminated, truncated, info = env.step(action)
        rows.append([action, reward, terminated, truncated, info["failure_reason"], _digest(recorder.last, obs, info)])
        if terminated or truncated:
            episode += 1
            obs, info = env.reset(seed=seed + episode)
            rows.append(["reset", _digest(recorder.last, obs, info)])
    return rows


def record(family: str) -> dict[str, list[list[Any]]]:
    """Every run of one family: ``"<scenario index>/<policy>"`` -> its rows."""
    entries, factory, _ = registry_catalogue()
    entry = next(e for e in entries if e.family == family)
    runs: dict[str, list[list[Any]]] = {}
    env: Any = None
    try:
        for index, params in enumerate(SCENARIOS):
            variant = VariantSpec(
                f"{entry.env_id}_golden_{index}", entry.env_id, family, params, content_hash(entry.env_id, params)
            )
            env = factory(variant) if env is None else factory.reuse(env, variant)
            recorder = env.physical if isinstance(env.physical, _Recorder) else _Recorder(env.physical)
            env.physical = recorder
            for policy in POLICIES:
                runs[f"{index}/{policy}"] = _run(env, recorder, family, policy, seed=100 + index)
    finally:
        if env is not None:
            env.close()
    return runs


FAMILIES = ("order_db", "payment_api", "web_checkout")

if __name__ == "__main__":
    recorded = {family: record(family) for family in FAMILIES}
    GOLDEN.write_text(json.dumps(recorded, separators=(",", ":")) + "\n")
    sys.stdout.write(f"wrote {GOLDEN} ({GOLDEN.stat().st_size} bytes)\n")
