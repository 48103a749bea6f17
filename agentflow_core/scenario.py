"""A process's scenario as data: the business parameters a variant can set, and which of them vary how.

A process document declares its scenario fields (``scenario:`` in ``configs/processes/<name>.yaml``)::

    scenario:
      account:   {type: str, values: [ok, flagged], default: ok, role: dimension}
      order_value: {type: float, range: [10, 1000], default: 100, role: perturbation}
      max_episode_steps: {type: int, range: [1, 10000], default: 30}

``role`` says how the variant catalogue may vary a field: ``dimension`` (a cartesian axis,
``variants.dimensions``), ``perturbation`` (a sampled range, ``variants.perturbations``) or ``fixed``
(the default: set per base env in its ``params``, never varied). Every process declares
``max_episode_steps`` (the env wrapper truncates there). :meth:`ScenarioSpec.build` turns a plain
mapping into :class:`ScenarioValues`, the typed, validated mapping a process's envs receive.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

FieldType = Literal["str", "int", "float", "bool"]
Role = Literal["dimension", "perturbation", "fixed"]
FIELD_TYPES: tuple[str, ...] = ("str", "int", "float", "bool")
ROLES: tuple[str, ...] = ("dimension", "perturbation", "fixed")
STEP_LIMIT_FIELD = "max_episode_steps"


@dataclass(frozen=True)
class ScenarioField:
    """One declared field: its type, its allowed values (``values``) or inclusive range, default and role."""

    name: str
    type: FieldType
    default: Any
    role: Role = "fixed"
    values: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None

    @property
    def expected(self) -> str:
        """What a value must be, in words (error messages)."""
        if self.values is not None:
            return f"one of {list(self.values)}"
        if self.low is not None and self.high is not None:
            kind = {"int": "an int", "float": "a float"}.get(self.type, self.type)
            return f"{kind} in [{self.low:g}, {self.high:g}]"
        return {"str": "a string", "int": "an int", "float": "a float", "bool": "true or false"}[self.type]

    def problem(self, value: Any) -> str | None:
        """None when ``value`` is valid for this field, else what was expected."""
        ok = {
            "str": isinstance(value, str),
            "bool": isinstance(value, bool),
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value),
        }[self.type]
        if not ok:
            return self.expected
        if self.values is not None and value not in self.values:
            return self.expected
        if self.low is not None and self.high is not None and not self.low <= value <= self.high:
            return self.expected
        return None

    def coerce(self, value: Any) -> Any:
        """The value in the field's Python type (an int for a float field becomes a float); a ValueError if invalid."""
        expected = self.problem(value)
        if expected is not None:
            raise ValueError(f"scenario.{self.name}: got {value!r}, expected {expected}")
        return float(value) if self.type == "float" else value


@dataclass(frozen=True)
class ScenarioSpec:
    """The declared fields of one process's scenario, in declaration order."""

    fields: tuple[ScenarioField, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Field names in declaration order."""
        return tuple(f.name for f in self.fields)

    def field(self, name: str) -> ScenarioField:
        """The field ``name``; a KeyError names the declared ones."""
        for item in self.fields:
            if item.name == name:
                return item
        raise KeyError(f"no scenario field {name!r}, expected one of {list(self.names)}")

    def with_role(self, role: Role) -> tuple[str, ...]:
        """Names of the fields declared with ``role``."""
        return tuple(f.name for f in self.fields if f.role == role)

    def defaults(self) -> dict[str, Any]:
        """Every field at its default."""
        return {f.name: f.default for f in self.fields}

    def build(self, params: Mapping[str, Any]) -> ScenarioValues:
        """The defaults with ``params`` on top, validated: unknown names and bad values raise a ValueError."""
        unknown = sorted(set(params) - set(self.names))
        if unknown:
            raise ValueError(f"scenario: unknown key(s) {unknown}, expected a subset of {sorted(self.names)}")
        merged = {**self.defaults(), **dict(params)}
        return ScenarioValues({f.name: f.coerce(merged[f.name]) for f in self.fields})


class ScenarioValues(Mapping[str, Any]):
    """A validated scenario: a read-only mapping of every declared field (see :meth:`ScenarioSpec.build`)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"ScenarioValues({self._values!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._values) == dict(other)

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, repr(v)) for k, v in self._values.items())))

    @property
    def max_episode_steps(self) -> int:
        """The step limit every process declares (the env wrapper truncates there)."""
        return int(self._values[STEP_LIMIT_FIELD])

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (JSON, logging; :meth:`ScenarioSpec.build` rebuilds it)."""
        return dict(self._values)
