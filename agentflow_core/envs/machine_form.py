"""What a raw form of a state-machine process shares: one :class:`StateMachineEnv` inside makes every
business decision, and the form only changes how its state looks (machine_sql.py, machine_web.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agentflow_core.envs.state_machine import StateMachineEnv
from agentflow_core.semantics import Vocabulary


class MachineForm:
    """Identity, variant and oracle of a form, delegated to the machine it wraps (``self.sim``)."""

    def __init__(self, scenario: Any, env_id: str, spec: Mapping[str, Any], source: str = "<machine>") -> None:
        self.sim = StateMachineEnv(scenario, env_id, spec, source)

    @classmethod
    def check_spec(cls, spec: Any, vocabulary: Vocabulary, source: str = "<machine>") -> None:
        """The machine document, checked as the simulator channel checks it."""
        StateMachineEnv.check_spec(spec, vocabulary, source)

    @property
    def env_id(self) -> str:
        """The variant's env id."""
        return self.sim.env_id

    @property
    def family(self) -> str:
        """The env family (from the env id)."""
        return self.sim.family

    @property
    def version(self) -> int:
        """The env version (from the env id)."""
        return self.sim.version

    @property
    def max_steps(self) -> int:
        """The step limit of the current variant."""
        return self.sim.max_steps

    def reconfigure(self, scenario: Any, env_id: str) -> None:
        """Re-target to another variant; the next ``reset`` starts its first episode."""
        self.sim.reconfigure(scenario, env_id)

    def oracle_action(self) -> str:
        """The oracle's machine action in the current state (reads hidden variables: evaluation only)."""
        return self.sim.oracle_action()
