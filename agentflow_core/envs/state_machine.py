"""The state-machine simulator channel: a process declared as a machine (data) run as a physical env.

Registered like any channel (``class_path: agentflow_core.envs.state_machine:StateMachineEnv``); the
env config's ``spec:`` names the machine document (:mod:`agentflow_core.envs.machine_spec` describes
it). A native action is ``{"type": "machine", "action": "<machine action>"}``; the raw observation is
the visible variables and what the last step did::

    {"state": {"stage": 2.0, "timeouts": 1.0}, "last": {"failure_reason": "timeout", "applied": 1}}

so the ``db`` mapping template reads it by column (``state.stage``, ``last.failure_reason``). Hidden
variables are never in it; :meth:`StateMachineEnv.oracle_action` reads them (evaluation only). ``info``
carries ``cost`` (this step's), ``business_value`` (the episode's so far: terminal value minus costs)
and ``outcome`` (the terminal's kind, ``truncated`` at the step limit, else None).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from agentflow_core.envs.base import StepResult
from agentflow_core.envs.machine_spec import (
    STEP_NAME,
    Assignments,
    Init,
    Machine,
    Outcome,
    audit_samples,
    check_native_actions,
    compiled_machine,
    parse_machine,
)
from agentflow_core.errors import ConfigError
from agentflow_core.semantics import Vocabulary

NATIVE_TYPE = "machine"
_ENV_ID = re.compile(r"^(?P<family>[a-z][a-z0-9_]*)_v(?P<version>\d+)")


def scenario_fields(scenario: Any) -> dict[str, Any]:
    """A scenario (a process's ScenarioValues or the Scenario dataclass) as the values expressions read."""
    values = scenario.to_dict() if hasattr(scenario, "to_dict") else dict(scenario)
    return {k: (v if isinstance(v, str) else float(v)) for k, v in values.items()}


def family_and_version(env_id: str) -> tuple[str, int]:
    """``refund_sim_v1_20260101`` -> (``refund_sim``, 1), the env_id convention of docs/design.md §2.1."""
    match = _ENV_ID.match(env_id)
    return (match["family"], int(match["version"])) if match else ("state_machine", 1)


class StateMachineEnv:
    """Physical env that runs a machine document (see the module docstring)."""

    def __init__(self, scenario: Any, env_id: str, spec: Mapping[str, Any], source: str = "<machine>") -> None:
        self.spec, self.source = spec, source
        self.np_random = np.random.default_rng()
        self.reconfigure(scenario, env_id)

    @classmethod
    def check_spec(cls, spec: Any, vocabulary: Vocabulary, source: str = "<machine>") -> None:
        """Compile the machine for ``vocabulary``'s scenario fields: a bad document fails at registry load."""
        fields = {f.name: ("" if f.type == "str" else 0.0) for f in vocabulary.scenario.fields}
        parse_machine(spec, fields, source)
        cls.raw_states(spec, source)

    @classmethod
    def check_native(cls, spec: Mapping[str, Any], actions: Mapping[str, Any]) -> None:
        """The mapping's native actions name this machine's actions (a ValueError names the first that does not)."""
        check_native_actions(NATIVE_TYPE, spec.get("actions"), actions)

    @classmethod
    def raw_states(cls, spec: Mapping[str, Any], source: str = "<machine>") -> list[tuple[Any, str]]:
        """The labelled raw states of the machine's ``audit`` section (the mapping audit's samples)."""
        variables = spec.get("variables") or {}
        visible = {name: 0.0 for name, item in variables.items() if not (item or {}).get("hidden", False)}
        return audit_samples(spec.get("audit"), visible, source, nested=False)

    def reconfigure(self, scenario: Any, env_id: str) -> None:
        """Re-target to another variant; the next ``reset`` starts its first episode (as if built fresh)."""
        self.scenario, self.env_id = scenario, env_id
        self.family, self.version = family_and_version(env_id)
        fields = scenario_fields(scenario)
        self.machine: Machine = compiled_machine(self.spec, fields, self.source)
        self._visible = self.machine.visible
        self._fields = fields
        self.max_steps = int(fields.get("max_episode_steps", 200))
        self.values: dict[str, Any] = {}
        self.step_id = 0
        self.business_value = 0.0
        self.done = False

    # ------------------------------------------------------------------ episode
    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """Start an episode: draw the variables' initial values from a generator seeded by ``seed``."""
        self.np_random = np.random.default_rng(seed)
        self.step_id, self.business_value, self.done = 0, 0.0, False
        values = dict(self._fields)
        values[STEP_NAME] = 0.0
        for variable in self.machine.variables:
            values[variable.name] = 0.0
        for variable in self.machine.variables:
            values[variable.name] = self._draw(variable.init, values)
        self.values = values
        return self._observation(None, True), {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        """Apply one native action, then the tick, then the terminal conditions (module docstring of machine_spec)."""
        machine, values = self.machine, self.values
        self.step_id += 1
        values[STEP_NAME] = float(self.step_id)
        name = native_action.get("action") if native_action.get("type") == NATIVE_TYPE else None
        action = machine.actions.get(name) if isinstance(name, str) else None
        cost, reason, applied = 0.0, None, False
        if action is None:
            reason = "unknown_action"
        elif action.when is not None and not action.when.value(values):
            reason = action.reason
        else:
            applied = True
            cost = action.cost.value(values) if action.cost is not None else 0.0
            fired = self._fire(machine.faults, values) if action.faults else None
            if fired is None:
                self._assign(action.sets, values)
                fired = self._fire(action.outcomes, values)
            reason = None if fired is None else fired.reason
        self._assign(machine.tick, values)
        delta, outcome = -cost, None
        for terminal in machine.terminals:
            if terminal.when.value(values):
                outcome = terminal.outcome
                delta += terminal.value.value(values) if terminal.value is not None else 0.0
                break
        terminated = outcome is not None
        truncated = not terminated and self.step_id >= self.max_steps
        self.business_value += delta
        self.done = terminated or truncated
        reward = machine.reward.scale * delta + machine.reward.base(applied, terminated)
        info = {
            "env_id": self.env_id,
            "step_id": self.step_id,
            "failure_reason": reason if not truncated else reason or "max_steps",
            "applied": applied,
            "cost": cost,
            "business_value": self.business_value,
            "outcome": "truncated" if truncated else outcome,
        }
        return StepResult(self._observation(reason, applied), float(reward), terminated, truncated, info)

    def oracle_action(self) -> str:
        """The oracle's native action in the current state (it reads hidden variables: evaluation only)."""
        if self.machine.oracle_fallback is None:
            raise ConfigError(self.source, "oracle", None, "an oracle section (rules and fallback)")
        for when, act in self.machine.oracle:
            if when.value(self.values):
                return act
        return self.machine.oracle_fallback

    def close(self) -> None:
        """Nothing to release: the machine lives in memory."""

    # ------------------------------------------------------------------ helpers
    def _observation(self, reason: str | None, applied: bool) -> dict[str, Any]:
        values = self.values
        return {
            "state": {name: values[name] for name in self._visible},
            "last": {"failure_reason": reason, "applied": int(applied)},
        }

    def _draw(self, init: Init, values: dict[str, Any]) -> float:
        args = [a.value(values) for a in init.args]
        rng = self.np_random
        if init.kind == "expr":
            return args[0]
        if init.kind == "bernoulli":
            return 1.0 if _fires(args[0], rng) else 0.0
        if init.kind == "uniform_int":
            low, high = int(np.floor(args[0])), int(np.floor(args[1]))
            return float(rng.integers(low, max(low, high) + 1))
        if init.kind == "uniform":
            return float(rng.uniform(args[0], max(args[0], args[1])))
        weights = np.array([max(w.value(values), 0.0) for w in init.weights] or [1.0] * len(args))
        total = float(weights.sum())
        index = int(rng.choice(len(args), p=weights / total)) if total > 0 else 0
        return args[index]

    def _fire(self, outcomes: tuple[Outcome, ...], values: dict[str, Any]) -> Outcome | None:
        for outcome in outcomes:
            if outcome.when is not None and not outcome.when.value(values):
                continue
            if outcome.p is not None and not _fires(outcome.p.value(values), self.np_random):
                continue
            self._assign(outcome.sets, values)
            return outcome
        return None

    @staticmethod
    def _assign(sets: Assignments, values: dict[str, Any]) -> None:
        if len(sets) == 1:
            name, expr = sets[0]
            values[name] = expr.value(values)
            return
        new = [(name, expr.value(values)) for name, expr in sets]  # simultaneous: all read the old state
        for name, value in new:
            values[name] = value


def _fires(p: float, rng: np.random.Generator) -> bool:
    """A draw under ``p`` clipped to [0, 1]; certain outcomes draw nothing (hand-computable transitions)."""
    if p <= 0.0:
        return False
    if p >= 1.0:
        return True
    return bool(rng.random() < p)
