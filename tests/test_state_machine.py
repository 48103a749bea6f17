"""The state-machine simulator channel: each construct, hand-computed transitions, value accounting, the oracle."""

from __future__ import annotations

import copy
import time
from typing import Any

import numpy as np
import pytest

from agentflow_core.envs.machine_spec import parse_machine
from agentflow_core.envs.state_machine import StateMachineEnv
from agentflow_core.errors import ConfigError
from agentflow_core.scenario import ScenarioField, ScenarioSpec, ScenarioValues

SCENARIO = ScenarioSpec(
    (
        ScenarioField("network", "str", "normal", "dimension", ("normal", "flaky")),
        ScenarioField("price", "float", 100.0, "perturbation", None, 1.0, 1000.0),
        ScenarioField("patience", "int", 6),
        ScenarioField("max_episode_steps", "int", 20),
    )
)
MACHINE: dict[str, Any] = {
    "variables": {
        "stage": {"init": "0"},
        "left": {"init": "patience"},  # from the scenario
        "outage": {"init": {"uniform_int": ["1", "1 + (network == 'flaky')"]}, "hidden": True},
        "lucky": {"init": {"bernoulli": "1"}, "hidden": True},
        "kind": {"init": {"choice": ["3", "5"], "weights": ["0", "1"]}},
        "timeouts": {"init": "0"},
    },
    "faults": [{"p": "network == 'flaky'", "set": {"timeouts": "timeouts + 1"}, "reason": "timeout"}],
    "actions": {
        "START": {"when": "stage == 0", "reason": "started", "cost": "1", "set": {"stage": "1"}},
        "PAY": {
            "when": "stage == 1",
            "cost": "2 + stage",  # reads the state before the action
            "outcomes": [
                {"when": "outage > 0", "reason": "gateway_down"},
                {"p": "1 - lucky", "reason": "declined"},
                {"set": {"stage": "2"}},
            ],
        },
        "WAIT": {"faults": False, "cost": "0.5"},
        "QUIT": {"faults": False, "set": {"stage": "9"}},
    },
    "tick": {"left": "left - 1", "outage": "outage - (outage > 0)"},
    "terminals": [
        {"when": "stage == 2", "outcome": "goal", "value": "price"},
        {"when": "stage == 9", "outcome": "failed"},
        {"when": "left <= 0", "outcome": "abandoned", "value": "-5"},
    ],
    "oracle": {
        "rules": [{"when": "stage == 0", "act": "START"}, {"when": "outage > 0", "act": "WAIT"}],
        "fallback": "PAY",
    },
    "reward": {"scale": 0.1},
}


def make(machine: dict[str, Any] | None = None, **params: Any) -> StateMachineEnv:
    return StateMachineEnv(SCENARIO.build(params), "toy_sim_v1", machine or MACHINE)


def act(name: str) -> dict[str, str]:
    return {"type": "machine", "action": name}


def test_inits_hidden_variables_and_the_raw_observation() -> None:
    env = make()
    raw, info = env.reset(seed=3)
    assert raw == {
        "state": {"stage": 0.0, "left": 6.0, "kind": 5.0, "timeouts": 0.0},
        "last": {"failure_reason": None, "applied": 1},
    }
    assert "outage" not in raw["state"] and "lucky" not in raw["state"]  # hidden
    assert env.values["outage"] == 1.0 and env.values["lucky"] == 1.0
    assert info == {"env_id": "toy_sim_v1", "step_id": 0, "failure_reason": None}
    assert (env.family, env.version) == ("toy_sim", 1)


def test_hand_computed_episode_costs_outcomes_tick_and_value() -> None:
    env = make()
    env.reset(seed=0)
    # START: cost 1, stage 0 -> 1; tick: left 6 -> 5, outage 1 -> 0. Reward 0.1 * -1 - 0.01.
    r = env.step(act("START"))
    assert (r.reward, r.terminated, r.info["cost"], r.info["business_value"]) == (
        pytest.approx(-0.11),
        False,
        1.0,
        -1.0,
    )
    assert r.obs["state"]["stage"] == 1.0 and r.obs["state"]["left"] == 5.0 and env.values["outage"] == 0.0
    # START again: inapplicable, its own reason, no cost, the inapplicable reward.
    r = env.step(act("START"))
    assert (r.reward, r.info["failure_reason"], r.info["applied"], r.info["cost"]) == (-0.05, "started", False, 0.0)
    assert r.obs["last"] == {"failure_reason": "started", "applied": 0}
    # PAY: cost 2 + stage(1) = 3; outage is over and lucky == 1 (p = 0): the last outcome sets stage 2 -> goal.
    r = env.step(act("PAY"))
    assert r.terminated and not r.truncated and r.info["outcome"] == "goal"
    assert r.info["business_value"] == pytest.approx(100.0 - 1.0 - 3.0)
    assert r.reward == pytest.approx(0.1 * (100.0 - 3.0) - 0.01)


def test_ordered_outcomes_first_that_fires_wins() -> None:
    env = make()
    env.reset(seed=0)
    env.step(act("START"))
    env.values["outage"] = 2.0  # a hidden outage under way
    r = env.step(act("PAY"))
    assert r.info["failure_reason"] == "gateway_down" and r.obs["state"]["stage"] == 1.0
    env.values["lucky"] = 0.0  # p = 1 - lucky = 1: declined, certainly
    env.values["outage"] = 0.0
    r = env.step(act("PAY"))
    assert r.info["failure_reason"] == "declined" and not r.terminated


def test_faults_from_a_string_scenario_field_skip_the_action() -> None:
    env = make(network="flaky")
    env.reset(seed=0)
    r = env.step(act("START"))  # the fault (p = 1 on a flaky network) fires: no effect, cost still paid
    assert (r.info["failure_reason"], r.obs["state"]["stage"], r.obs["state"]["timeouts"]) == ("timeout", 0.0, 1.0)
    assert r.info["cost"] == 1.0 and r.info["applied"]
    r = env.step(act("WAIT"))  # faults: false
    assert r.info["failure_reason"] is None and r.info["cost"] == 0.5


def test_terminal_order_truncation_and_unknown_actions() -> None:
    env = make(patience=3)
    env.reset(seed=0)
    assert env.step(act("NOPE")).info["failure_reason"] == "unknown_action"
    env.step(act("WAIT"))
    r = env.step(act("WAIT"))  # left 3 -> 0: abandoned, worth -5
    assert r.terminated and r.info["outcome"] == "abandoned"
    assert r.info["business_value"] == pytest.approx(-0.5 - 0.5 - 5.0)
    env = make(patience=100, max_episode_steps=2)
    env.reset(seed=0)
    env.step(act("WAIT"))
    r = env.step(act("WAIT"))
    assert r.truncated and not r.terminated and r.info["outcome"] == "truncated"
    assert r.info["failure_reason"] == "max_steps"
    env.reset(seed=0)
    assert env.step(act("QUIT")).info["outcome"] == "failed"


def test_the_oracle_reads_hidden_variables() -> None:
    env = make()
    env.reset(seed=0)
    assert env.oracle_action() == "START"
    env.step(act("START"))
    env.values["outage"] = 3.0
    assert env.oracle_action() == "WAIT"  # only the hidden outage says so
    env.values["outage"] = 0.0
    assert env.oracle_action() == "PAY"


def test_random_inits_follow_their_bounds_and_the_seed() -> None:
    machine = copy.deepcopy(MACHINE)
    machine["variables"]["u"] = {"init": {"uniform_int": ["2", "price / 10"]}}
    machine["variables"]["x"] = {"init": {"uniform": ["0", "1"]}}
    machine["variables"]["b"] = {"init": {"bernoulli": "0.5"}}
    machine["variables"]["c"] = {"init": {"choice": ["1", "2", "3"]}}
    env = make(machine)
    draws = []
    for seed in range(200):
        raw, _ = env.reset(seed=seed)
        draws.append((raw["state"]["u"], raw["state"]["x"], raw["state"]["b"], raw["state"]["c"]))
    u, x, b, c = (np.array(d) for d in zip(*draws, strict=True))
    assert set(u) == set(range(2, 11)) and ((x >= 0) & (x < 1)).all()
    assert 0.3 < b.mean() < 0.7 and set(c) == {1.0, 2.0, 3.0}
    assert make(machine).reset(seed=5) == env.reset(seed=5)


def _trajectory(env: StateMachineEnv, seed: int) -> list[Any]:
    out: list[Any] = [env.reset(seed=seed)]
    rng = np.random.default_rng(seed)
    for _ in range(15):
        r = env.step(act(str(rng.choice(["START", "PAY", "WAIT"]))))
        out.append((r.obs, r.reward, r.terminated, r.truncated, r.info))
        if r.done:
            break
    return out


def test_determinism_per_seed_and_reconfigure_equals_fresh() -> None:
    machine = copy.deepcopy(MACHINE)
    machine["faults"][0]["p"] = "0.5 * (network == 'flaky')"
    machine["actions"]["PAY"]["outcomes"][1]["p"] = "0.4"
    a, b = make(machine, network="flaky"), make(machine, network="flaky")
    assert all(_trajectory(a, s) == _trajectory(b, s) for s in range(10))
    reused = make(machine, network="normal", patience=2)
    _trajectory(reused, 1)
    reused.reconfigure(SCENARIO.build({"network": "flaky"}), "toy_sim_v1")
    assert all(_trajectory(reused, s) == _trajectory(a, s) for s in range(10))


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"variables": {"price": {"init": "0"}}}, "variables.price"),  # a scenario field
        ({"variables": {"Stage": {"init": "0"}}}, "variables"),
        ({"tick": {"nope": "1"}}, "tick.nope"),
        ({"actions": {"PAY": {"when": "__import__('os')"}}}, "actions.PAY.when"),
        ({"actions": {"PAY": {"cost": "network + 1"}}}, "actions.PAY.cost"),
        ({"terminals": [{"when": "1", "outcome": "won"}]}, "terminals.0.outcome"),
        ({"terminals": []}, "terminals"),
        ({"oracle": {"rules": [{"when": "1", "act": "FLY"}], "fallback": "PAY"}}, "oracle.rules.0.act"),
        ({"variables": {"v": {"init": {"uniform_int": ["1"]}}}}, "variables.v.init.uniform_int"),
        ({"variables": {"v": {"init": {"choice": ["1"], "weights": ["1", "2"]}}}}, "variables.v.init.weights"),
    ],
)
def test_bad_documents_name_the_key(patch: dict[str, Any], key: str) -> None:
    machine = {**copy.deepcopy(MACHINE), **patch}
    fields = {"network": "normal", "price": 1.0, "patience": 1.0, "max_episode_steps": 1.0}
    with pytest.raises(ConfigError) as info:
        parse_machine(machine, fields, "toy.yaml")
    assert info.value.key.startswith(key) and "toy.yaml" in str(info.value)


def test_a_step_is_cheap() -> None:
    env = make(network="flaky", patience=10**4, max_episode_steps=10**5)
    env.reset(seed=0)
    env.step(act("START"))
    n = 5000
    start = time.perf_counter()
    for _ in range(n):
        env.step(act("WAIT"))
        env.step(act("PAY"))
    per_step = (time.perf_counter() - start) / (2 * n)
    assert per_step < 60e-6, f"{per_step * 1e6:.1f} us per step (target 30 us on an idle core)"


def test_scenario_values_and_checkout_scenarios_are_both_accepted() -> None:
    from agentflow_core.envs.base import Scenario

    values = ScenarioValues({"network": "normal", "price": 5.0, "patience": 2, "max_episode_steps": 3})
    reused = make()
    reused.reconfigure(values, "toy_sim_v1")
    assert reused.reset(seed=0)[0]["state"]["left"] == 2.0
    machine = {
        "variables": {"x": {"init": "balance"}},
        "actions": {"A": {}},
        "terminals": [{"when": "x < 0", "outcome": "failed"}],
    }
    env = StateMachineEnv(Scenario(), "checkout_sim_v1", machine)
    assert env.reset(seed=0)[0]["state"] == {"x": 500.0}
