"""The physical-env + adapter contract, checked on EVERY env in the registry (configs/envs).

A new family (or an OpenAPI-generated env) gets these tests by adding its YAML; nothing here names
a family.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from gymnasium.utils.env_checker import check_env

from agentflow_core.envs.base import StepResult
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.order_db.postgres import EMBEDDED_POSTGRES, acquire_embedded, embedded_users, release_embedded
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import EnvCrashError, EnvInvalidError
from agentflow_core.registry import EnvEntry, EnvRegistry
from agentflow_core.semantics import GOAL_TOKEN, N_ACTIONS, OBS_DIM, SemanticAction

REPO = Path(__file__).resolve().parents[1]
REGISTERED = EnvRegistry(REPO / "configs/envs", yaml.safe_load).entries()
# The SQL channel's contract holds on a real PostgreSQL server too (embedded through pgserver).
ON_POSTGRES = [
    dataclasses.replace(e, kwargs={**e.kwargs, "url": EMBEDDED_POSTGRES}) for e in REGISTERED if e.family == "order_db"
]
# The web channel on a real browser (headless Chromium on the storefront web app): the real-env registry.
REAL = EnvRegistry(REPO / "configs/real_envs", yaml.safe_load).entries()
ENTRIES = REGISTERED + ON_POSTGRES + REAL
IDS = [e.env_id for e in REGISTERED] + [f"{e.env_id}-postgresql" for e in ON_POSTGRES] + [e.env_id for e in REAL]


@pytest.fixture(scope="module", autouse=True)
def shared_browser(browser_session: None) -> None:
    """The browser env's cases share the session's one Chromium."""


@pytest.fixture(scope="module", autouse=True)
def embedded_postgres() -> Iterator[None]:
    """One server for the module (each env is one more user of it), stopped at the end."""
    acquire_embedded()
    yield
    release_embedded()
    assert embedded_users() == 0


@pytest.fixture(params=ENTRIES, ids=IDS)
def entry(request: pytest.FixtureRequest) -> EnvEntry:
    return request.param


def test_postgresql_entries_really_run_on_postgresql() -> None:
    env = ON_POSTGRES[0].make()
    assert env.physical.engine.dialect.name == "postgresql"  # type: ignore[attr-defined]
    env.close()


def test_the_registry_holds_every_family() -> None:
    assert {e.family for e in ENTRIES} >= {"web_checkout", "order_db", "payment_api", "web_browser"}


def test_gymnasium_check_env_passes(entry: EnvEntry) -> None:
    env = entry.make()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env, skip_render_check=True)
    assert [str(w.message) for w in caught if "gymnasium" in w.filename] == []
    env.close()


def _legal_action(rng: np.random.Generator, info: Mapping[str, Any]) -> int:
    return int(rng.choice(np.flatnonzero(info["action_mask"])))


def test_reset_and_step_types_and_info(entry: EnvEntry) -> None:
    env = entry.make()
    obs, info = env.reset(seed=3)
    assert obs.dtype == np.float32 and obs.shape == (OBS_DIM,) and env.observation_space.contains(obs)
    assert info["env_id"].startswith(entry.family + "_v") and info["env_id"] == env.env_id
    assert info["step_id"] == 0 and "failure_reason" in info and info["failure_reason"] is None
    assert info["action_mask"].shape == (N_ACTIONS,) and info["action_mask"].dtype == bool and info["action_mask"].any()
    assert info["tokens"], "a fresh episode must show at least one business-state token"
    rng = np.random.default_rng(0)
    for step_id in range(1, 6):
        obs, reward, terminated, truncated, info = env.step(_legal_action(rng, info))
        assert env.observation_space.contains(obs)
        assert type(reward) is float and math.isfinite(reward)
        assert type(terminated) is bool and type(truncated) is bool
        assert info["step_id"] == step_id and "failure_reason" in info
        assert info["env_id"] == env.env_id and 0.0 <= info["risk"] <= 1.0
        if terminated or truncated:
            obs, info = env.reset()
            assert info["step_id"] == 0
            break
    env.close()


def _rollout(entry: EnvEntry, seed: int, n_steps: int) -> list[tuple[Any, ...]]:
    """Random legal actions (from a fixed generator) on a noisy variant, resetting at episode end."""
    env = entry.make({"network": "packet_loss_5%", "card_decline_rate": 0.5, "start_stage": "checkout"})
    rng = np.random.default_rng(1234)
    obs, info = env.reset(seed=seed)
    trace: list[tuple[Any, ...]] = [(obs.tobytes(), tuple(info["tokens"]))]
    for _ in range(n_steps):
        obs, reward, terminated, truncated, info = env.step(_legal_action(rng, info))
        trace.append((obs.tobytes(), reward, terminated, truncated, tuple(info["tokens"]), info["failure_reason"]))
        if terminated or truncated:
            obs, info = env.reset()
            trace.append((obs.tobytes(), tuple(info["tokens"])))
    env.close()
    return trace


def test_same_seed_same_actions_same_trajectory(entry: EnvEntry) -> None:
    first, second = _rollout(entry, seed=7, n_steps=60), _rollout(entry, seed=7, n_steps=60)
    assert first == second


def test_truncated_is_not_terminated(entry: EnvEntry) -> None:
    env = entry.make({"max_episode_steps": 4})
    _, info = env.reset(seed=0)
    for step_id in range(1, 5):
        _, _, terminated, truncated, info = env.step(SemanticAction.RETRY)
        assert terminated is False
        assert truncated is (step_id == 4), f"step {step_id}: truncated={truncated}"
    assert info["failure_reason"] == "max_steps"
    env.close()


def test_scripted_expert_reaches_payment_success(entry: EnvEntry) -> None:
    expert = expert_for(entry.family)
    env = entry.make()
    lengths = []
    for seed in range(8):
        obs, info = env.reset(seed=seed)
        terminated = truncated = False
        while not (terminated or truncated):
            obs, reward, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
        assert (terminated, truncated) == (True, False), f"seed {seed}: {info['tokens']} {info['failure_reason']}"
        assert GOAL_TOKEN in info["tokens"] and info["failure_reason"] is None and reward > 0
        lengths.append(info["step_id"])
    assert max(lengths) < env.max_episode_steps
    env.close()


@dataclasses.dataclass
class FaultyPhysical:
    """Fault injector around a real physical env: NaN reward or an exception on a chosen step."""

    inner: Any
    fault: str
    on_step: int = 2

    def __post_init__(self) -> None:
        self.env_id, self.family, self.version = self.inner.env_id, self.inner.family, self.inner.version
        self.scenario, self.calls = self.inner.scenario, 0

    def reset(self, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        self.calls = 0
        return self.inner.reset(seed=seed)

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        self.calls += 1
        result = self.inner.step(native_action)
        if self.calls == self.on_step:
            if self.fault == "nan":
                return dataclasses.replace(result, reward=float("nan"))
            raise ConnectionResetError("channel went away")
        return result

    def close(self) -> None:
        self.inner.close()


@pytest.mark.parametrize(("fault", "error"), [("nan", EnvInvalidError), ("raise", EnvCrashError)])
def test_channel_misbehaviour_becomes_a_typed_error(entry: EnvEntry, fault: str, error: type[Exception]) -> None:
    made = entry.make()
    env = SemanticEnv(FaultyPhysical(made.physical, fault), made.adapter)
    env.reset(seed=0)
    env.step(SemanticAction.LOGIN)
    with pytest.raises(error) as excinfo:
        env.step(SemanticAction.VIEW_PRODUCT)
    assert excinfo.value.env_id == made.env_id and excinfo.value.step_id == 2
    assert made.env_id in str(excinfo.value) and "step 2" in str(excinfo.value)
    env.close()
