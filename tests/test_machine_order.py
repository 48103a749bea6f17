"""A state machine's variables start in declaration order, also when their names do not sort that way."""

from __future__ import annotations

import numpy as np

from agentflow_core.envs.state_machine import StateMachineEnv


def test_an_init_reads_the_variables_declared_before_it_whatever_their_names() -> None:
    # "z_first" sorts after "a_then": a document re-sorted by name would initialise a_then from z_first = 0
    spec = {
        "variables": {"z_first": {"init": "3"}, "a_then": {"init": "z_first * 2"}},
        "actions": {"NOOP": {}},
        "terminals": [{"when": "a_then == 99", "outcome": "goal"}],
    }
    env = StateMachineEnv({"max_episode_steps": 5.0}, "order_v1", spec)
    env.reset(seed=0)
    assert env.values["z_first"] == 3.0 and env.values["a_then"] == 6.0
    assert np.isfinite(env.values["a_then"])
