"""A process declared as a state machine, as data: the document, its checks, and its compiled form.

The document (YAML or JSON, named by an env config's ``spec:``; see docs/adding-a-process.md) reads::

    variables:                       # numbers (flags are 0/1), set in declaration order at every reset
      stage: {init: "0"}
      patience: {init: "patience_steps"}                     # an expression over the scenario fields
      outage: {init: {uniform_int: ["0", "2 + busy"]}, hidden: true}   # bounds are expressions
      lucky: {init: {bernoulli: "0.8"}, hidden: true}
      kind: {init: {choice: ["0", "1", "2"], weights: ["1", "1", "2"]}}
    faults:                          # drawn before the outcomes of every applicable action (opt out: faults: false)
      - {p: '0.05 * (network == "packet_loss_5%")', set: {timeout: "1"}, reason: timeout}
    actions:
      SUBMIT:
        when: "stage == 2"           # applicability; else inapplicable (reason, the inapplicable reward)
        reason: not_ready
        cost: "1 + 0.5 * retries"    # business cost of the attempt (time, fees)
        set: {retries: "retries + 1"}                         # effects that always happen
        outcomes:                    # ordered: the first that fires is applied, the rest are skipped
          - {when: "outage > 0", set: {failures: "failures + 1"}, reason: service_down}
          - {p: "0.1 + 0.2 * (kind == 2)", reason: rejected}
          - {set: {stage: "3"}}      # no when, no p: always fires
    tick: {patience: "patience - 1", outage: "outage - (outage > 0)"}   # after every step
    terminals:                       # checked in order after the tick; the first that holds ends the episode
      - {when: "stage == 3", outcome: goal, value: "claim_value"}
      - {when: "patience <= 0", outcome: abandoned, value: "0"}
    oracle:                          # reads every variable, hidden ones included: evaluation only
      rules: [{when: "outage > 0", act: WAIT}]
      fallback: SUBMIT
    reward: {scale: 0.1}             # optional: scale, step (-0.01), inapplicable (-0.05), terminal (default: step)
    audit:                           # labelled raw states for the mapping audit (agentflow_core/adapters/audit.py)
      states:                        # visible variables not set read 0; failure_reason: the last step's
        - {token: SUBMITTED, set: {stage: 3}}
        - {token: TIMED_OUT, set: {stage: 2}, failure_reason: timeout}

Every ``when``, ``p``, ``cost``, ``value``, ``set`` right-hand side and init is a
:mod:`agentflow_core.safe_expr` expression over the scenario fields (string fields compare with
``==``/``!=`` to text), the variables and ``step`` (the step number), compiled once per machine. A
``set`` block is simultaneous: every right-hand side reads the state before the block. An init reads
the scenario and the variables declared before it (later ones still read 0). A probability ``p`` is
clipped to [0, 1]; only a ``p`` strictly between 0 and 1 draws from the episode's generator.
An expression undefined at run time (a division by zero) raises
:class:`~agentflow_core.safe_expr.ExpressionEvalError`: the step crashes (the env wrapper reports an
``EnvCrashError``) rather than go on with a made-up value.

The business value of an episode is the terminal ``value`` minus the sum of the applicable actions'
costs; the step reward is ``scale * (value change of the step) + step`` for an applicable action and
``scale * (value change) + inapplicable`` otherwise (``terminal`` instead of ``step`` on the step a
terminal ends, where the section sets it), so the undiscounted return is ``scale`` times the
business value plus the per-step penalties (with ``scale: 0.1`` a goal worth 100 pays +10, the shared
scale of :mod:`agentflow_core.envs.base`).
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from agentflow_core.envs.base import INAPPLICABLE_REWARD, STEP_REWARD
from agentflow_core.errors import ConfigError
from agentflow_core.safe_expr import Condition, UnsafeExpressionError, compile_condition

OUTCOME_KINDS = ("goal", "handled", "failed", "abandoned")
RANDOM_INITS = ("uniform_int", "uniform", "bernoulli", "choice")
STEP_NAME = "step"
MAX_ENTRIES = 256
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_ACTION = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
_REASON = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
TOP_KEYS = frozenset(
    {"description", "variables", "faults", "actions", "tick", "terminals", "oracle", "reward", "audit"}
)


@dataclass(frozen=True)
class Names:
    """What an expression may read: numeric names and string names (scenario fields of type str)."""

    numbers: frozenset[str]
    strings: frozenset[str]

    @classmethod
    def of_scenario(cls, fields: Mapping[str, Any], extra: Collection[str] = ()) -> Names:
        """Names from a scenario's values (a str value makes a string name), plus ``extra`` numeric names."""
        strings = frozenset(k for k, v in fields.items() if isinstance(v, str))
        return cls(frozenset(fields) - strings | frozenset(extra), strings)


@dataclass(frozen=True)
class Reward:
    """How a step's business value change becomes its reward (see the module docstring)."""

    scale: float = 1.0
    step: float = STEP_REWARD
    inapplicable: float = INAPPLICABLE_REWARD
    terminal: float | None = None  # the step reward of an applicable step a terminal ends (None: ``step``)

    def base(self, applicable: bool, terminated: bool) -> float:
        """The step's reward before the value change: ``inapplicable``, ``terminal`` or ``step``."""
        if not applicable:
            return self.inapplicable
        return self.terminal if terminated and self.terminal is not None else self.step


Assignments = tuple[tuple[str, Condition], ...]


@dataclass(frozen=True)
class Outcome:
    """One branch: fires where ``when`` holds and a draw falls under ``p``; sets variables; names a reason."""

    when: Condition | None
    p: Condition | None
    sets: Assignments
    reason: str | None


@dataclass(frozen=True)
class Action:
    """One native action of the machine."""

    name: str
    when: Condition | None
    reason: str
    cost: Condition | None
    faults: bool
    sets: Assignments
    outcomes: tuple[Outcome, ...]


@dataclass(frozen=True)
class Init:
    """How a variable starts: an expression, or a draw whose arguments are expressions."""

    kind: str  # "expr" or one of RANDOM_INITS
    args: tuple[Condition, ...]
    weights: tuple[Condition, ...] = ()


@dataclass(frozen=True)
class Variable:
    """A machine variable; a hidden one is not in the raw observation."""

    name: str
    init: Init
    hidden: bool


@dataclass(frozen=True)
class Terminal:
    """An ending: where ``when`` holds the episode ends as ``outcome``, worth ``value``."""

    when: Condition
    outcome: str
    value: Condition | None


@dataclass(frozen=True)
class Machine:
    """A compiled state machine (frozen; built once per document and scenario field types)."""

    variables: tuple[Variable, ...]
    actions: Mapping[str, Action]
    faults: tuple[Outcome, ...]
    tick: Assignments
    terminals: tuple[Terminal, ...]
    oracle: tuple[tuple[Condition, str], ...]
    oracle_fallback: str | None
    reward: Reward

    @property
    def visible(self) -> tuple[str, ...]:
        """Names of the variables the raw observation shows."""
        return tuple(v.name for v in self.variables if not v.hidden)


class SpecReader:
    """Key-checked reading of a channel document; every error is a ConfigError naming the source and key."""

    def __init__(self, source: str, names: Names) -> None:
        self.source, self.names = source, names

    def fail(self, key: str, value: Any, expected: str) -> ConfigError:
        """The ConfigError for ``key``."""
        return ConfigError(self.source, key, value, expected)

    def mapping(self, key: str, value: Any, allowed: Collection[str], required: Collection[str] = ()) -> dict:
        """``value`` as a mapping with only ``allowed`` keys and every ``required`` one."""
        if not isinstance(value, Mapping):
            raise self.fail(key, value, "a mapping")
        for name in value:
            if name not in allowed:
                raise self.fail(f"{key}.{name}" if key else str(name), value[name], f"no such key ({sorted(allowed)})")
        for name in required:
            if name not in value:
                raise self.fail(f"{key}.{name}" if key else name, None, "a value (required key)")
        return dict(value)

    def items(self, key: str, value: Any) -> list[Any]:
        """``value`` as a list (None: empty)."""
        if value is None:
            return []
        if not isinstance(value, list) or len(value) > MAX_ENTRIES:
            raise self.fail(key, value, f"a list of at most {MAX_ENTRIES} entries")
        return value

    def expr(self, key: str, value: Any) -> Condition:
        """An expression: a string, or a number/bool written bare in YAML."""
        if isinstance(value, bool) or (isinstance(value, int | float) and math.isfinite(value)):
            value = str(float(value))
        try:
            return compile_condition(value, self.names.numbers, self.names.strings)
        except UnsafeExpressionError as exc:
            raise self.fail(key, value, f"a safe expression ({exc.reason})") from None

    def optional_expr(self, key: str, value: Any) -> Condition | None:
        """An expression, or None when absent."""
        return None if value is None else self.expr(key, value)

    def number(self, key: str, value: Any, default: float) -> float:
        """A finite number, ``default`` when absent."""
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(key, value, "a finite number")
        return float(value)

    def reason(self, key: str, value: Any, default: str | None = None) -> str | None:
        """A failure reason (snake case), ``default`` when absent."""
        if value is None:
            return default
        if not isinstance(value, str) or not _REASON.match(value):
            raise self.fail(key, value, "a failure reason of lowercase letters, digits and '_'")
        return value

    def assignments(self, key: str, value: Any, variables: Collection[str]) -> Assignments:
        """A ``set`` block: declared variable -> expression."""
        if value is None:
            return ()
        if not isinstance(value, Mapping):
            raise self.fail(key, value, "a mapping of variable -> expression")
        out = []
        for name, expr in value.items():
            if name not in variables:
                raise self.fail(f"{key}.{name}", expr, f"a declared variable ({sorted(variables)[:8]})")
            out.append((str(name), self.expr(f"{key}.{name}", expr)))
        return tuple(out)

    def outcomes(self, key: str, value: Any, variables: Collection[str]) -> tuple[Outcome, ...]:
        """An ordered list of outcomes (``when``, ``p``, ``set``, ``reason``)."""
        out = []
        for i, entry in enumerate(self.items(key, value)):
            item = self.mapping(f"{key}.{i}", entry, ("when", "p", "set", "reason"))
            out.append(
                Outcome(
                    self.optional_expr(f"{key}.{i}.when", item.get("when")),
                    self.optional_expr(f"{key}.{i}.p", item.get("p")),
                    self.assignments(f"{key}.{i}.set", item.get("set"), variables),
                    self.reason(f"{key}.{i}.reason", item.get("reason")),
                )
            )
        return tuple(out)

    def reward(self, value: Any) -> Reward:
        """The ``reward`` section (scale, step, inapplicable, terminal)."""
        item = self.mapping("reward", value or {}, ("scale", "step", "inapplicable", "terminal"))
        terminal = item.get("terminal")
        return Reward(
            self.number("reward.scale", item.get("scale"), 1.0),
            self.number("reward.step", item.get("step"), STEP_REWARD),
            self.number("reward.inapplicable", item.get("inapplicable"), INAPPLICABLE_REWARD),
            None if terminal is None else self.number("reward.terminal", terminal, 0.0),
        )

    def action_name(self, key: str, value: Any) -> str:
        """An action name (letters, digits, '_')."""
        if not isinstance(value, str) or not _ACTION.match(value):
            raise self.fail(key, value, "an action name of letters, digits and '_'")
        return value


def _variable_names(reader: SpecReader, value: Any, taken: Collection[str]) -> list[str]:
    if not isinstance(value, Mapping) or not value or len(value) > MAX_ENTRIES:
        raise reader.fail("variables", value, f"a mapping of 1 to {MAX_ENTRIES} variables")
    for name in value:
        if not isinstance(name, str) or not _NAME.match(name):
            raise reader.fail("variables", name, "variable names of lowercase letters, digits and '_'")
        if name in taken:
            raise reader.fail(f"variables.{name}", name, "a name that is not a scenario field nor 'step'")
    return list(value)


def _init(reader: SpecReader, key: str, value: Any) -> Init:
    if not isinstance(value, Mapping):
        return Init("expr", (reader.expr(key, value),))
    item = reader.mapping(key, value, (*RANDOM_INITS, "weights"))
    kinds = [k for k in RANDOM_INITS if k in item]
    if len(kinds) != 1:
        raise reader.fail(key, value, f"one of {list(RANDOM_INITS)}")
    kind, args = kinds[0], item[kinds[0]]
    if kind == "bernoulli":
        return Init(kind, (reader.expr(f"{key}.bernoulli", args),))
    if kind in ("uniform_int", "uniform") and (not isinstance(args, list) or len(args) != 2):
        raise reader.fail(f"{key}.{kind}", args, "[low, high] expressions")
    if kind == "choice" and (not isinstance(args, list) or not args or len(args) > MAX_ENTRIES):
        raise reader.fail(f"{key}.choice", args, "a non-empty list of expressions")
    compiled = tuple(reader.expr(f"{key}.{kind}.{i}", a) for i, a in enumerate(args))
    weights = item.get("weights")
    if weights is not None and (kind != "choice" or not isinstance(weights, list) or len(weights) != len(args)):
        raise reader.fail(f"{key}.weights", weights, "one weight expression per choice")
    return Init(kind, compiled, tuple(reader.expr(f"{key}.weights.{i}", w) for i, w in enumerate(weights or ())))


def _actions(reader: SpecReader, value: Any, variables: Collection[str]) -> dict[str, Action]:
    if not isinstance(value, Mapping) or not value or len(value) > MAX_ENTRIES:
        raise reader.fail("actions", value, f"a mapping of 1 to {MAX_ENTRIES} action name -> definition")
    keys = ("when", "reason", "cost", "faults", "set", "outcomes", "description")
    out = {}
    for name, entry in value.items():
        key = f"actions.{reader.action_name('actions', name)}"
        item = reader.mapping(key, entry or {}, keys)
        faults = item.get("faults", True)
        if not isinstance(faults, bool):
            raise reader.fail(f"{key}.faults", faults, "true or false")
        out[name] = Action(
            name,
            reader.optional_expr(f"{key}.when", item.get("when")),
            reader.reason(f"{key}.reason", item.get("reason"), "not_applicable") or "not_applicable",
            reader.optional_expr(f"{key}.cost", item.get("cost")),
            faults,
            reader.assignments(f"{key}.set", item.get("set"), variables),
            reader.outcomes(f"{key}.outcomes", item.get("outcomes"), variables),
        )
    return out


def _terminals(reader: SpecReader, value: Any) -> tuple[Terminal, ...]:
    out = []
    for i, entry in enumerate(reader.items("terminals", value)):
        item = reader.mapping(f"terminals.{i}", entry, ("when", "outcome", "value"), ("when", "outcome"))
        if item["outcome"] not in OUTCOME_KINDS:
            raise reader.fail(f"terminals.{i}.outcome", item["outcome"], f"one of {list(OUTCOME_KINDS)}")
        out.append(
            Terminal(
                reader.expr(f"terminals.{i}.when", item["when"]),
                str(item["outcome"]),
                reader.optional_expr(f"terminals.{i}.value", item.get("value")),
            )
        )
    if not out:
        raise reader.fail("terminals", value, "at least one terminal condition")
    return tuple(out)


def _oracle(
    reader: SpecReader, value: Any, actions: Collection[str]
) -> tuple[tuple[tuple[Condition, str], ...], str | None]:
    if value is None:
        return (), None
    item = reader.mapping("oracle", value, ("rules", "fallback"), ("fallback",))
    rules = []
    for i, entry in enumerate(reader.items("oracle.rules", item.get("rules"))):
        rule = reader.mapping(f"oracle.rules.{i}", entry, ("when", "act"), ("when", "act"))
        if rule["act"] not in actions:
            raise reader.fail(f"oracle.rules.{i}.act", rule["act"], f"a machine action ({sorted(actions)[:8]})")
        rules.append((reader.expr(f"oracle.rules.{i}.when", rule["when"]), str(rule["act"])))
    if item["fallback"] not in actions:
        raise reader.fail("oracle.fallback", item["fallback"], f"a machine action ({sorted(actions)[:8]})")
    return tuple(rules), str(item["fallback"])


def parse_machine(document: Any, fields: Mapping[str, Any], source: str = "<machine>") -> Machine:
    """Check and compile a machine document for a scenario with ``fields`` (name -> a value of its type)."""
    first = SpecReader(source, Names.of_scenario(fields))
    top = first.mapping("", document, TOP_KEYS, ("variables", "actions"))
    variables = _variable_names(first, top["variables"], {*fields, STEP_NAME})
    reader = SpecReader(source, Names.of_scenario(fields, (*variables, STEP_NAME)))
    declared = []
    for name in variables:
        entry = top["variables"][name]
        item = reader.mapping(f"variables.{name}", entry, ("init", "hidden", "description"), ("init",))
        hidden = item.get("hidden", False)
        if not isinstance(hidden, bool):
            raise reader.fail(f"variables.{name}.hidden", hidden, "true or false")
        declared.append(Variable(name, _init(reader, f"variables.{name}.init", item["init"]), hidden))
    actions = _actions(reader, top["actions"], variables)
    rules, fallback = _oracle(reader, top.get("oracle"), actions)
    return Machine(
        variables=tuple(declared),
        actions=actions,
        faults=reader.outcomes("faults", top.get("faults"), variables),
        tick=reader.assignments("tick", top.get("tick"), variables),
        terminals=_terminals(reader, top.get("terminals")),
        oracle=rules,
        oracle_fallback=fallback,
        reward=reader.reward(top.get("reward")),
    )


def audit_samples(document: Any, base: Mapping[str, Any], source: str, *, nested: bool) -> list[tuple[Any, str]]:
    """Labelled raw states of a channel document's ``audit`` section: ``base`` with each state's ``set`` on top.

    ``nested``: ``base`` and ``set`` are {table: {column: value}} (merged per table), else {name: value}.
    Each raw state gets ``last`` (``failure_reason``, ``applied``) like the channel's own observations.
    """
    reader = SpecReader(source, Names(frozenset(), frozenset()))
    audit = reader.mapping("audit", document or {}, ("base", "states"))
    base = {**base, **reader.mapping("audit.base", audit.get("base") or {}, _Everything())}
    out = []
    for i, entry in enumerate(reader.items("audit.states", audit.get("states"))):
        item = reader.mapping(f"audit.states.{i}", entry, ("token", "set", "failure_reason"), ("token",))
        changes = reader.mapping(f"audit.states.{i}.set", item.get("set") or {}, _Everything())
        for name, value in changes.items():
            if name not in base:
                raise reader.fail(f"audit.states.{i}.set.{name}", value, f"one of {sorted(base)[:8]}")
        raw: dict[str, Any] = {k: dict(v) if nested else v for k, v in base.items()}
        for name, value in changes.items():
            if nested:
                raw[name].update(reader.mapping(f"audit.states.{i}.set.{name}", value, _Everything()))
            else:
                raw[name] = value
        reason = reader.reason(f"audit.states.{i}.failure_reason", item.get("failure_reason"))
        last = {"failure_reason": reason, "applied": 1}
        out.append(({**raw, "last": last} if nested else {"state": raw, "last": last}, str(item["token"])))
    return out


class _Everything(frozenset[str]):
    """Allowed keys of a mapping whose keys are the author's own names."""

    def __contains__(self, item: object) -> bool:
        return True


def field_types(fields: Mapping[str, Any]) -> tuple[tuple[str, bool], ...]:
    """The part of a scenario a compiled machine depends on: each field's name and whether it is a string."""
    return tuple((k, isinstance(v, str)) for k, v in fields.items())


@functools.lru_cache(maxsize=64)
def _cached(document_json: str, types: tuple[tuple[str, bool], ...], source: str) -> Machine:
    fields = {name: ("" if is_text else 0.0) for name, is_text in types}
    return parse_machine(json.loads(document_json), fields, source)


def compiled_machine(document: Mapping[str, Any], fields: Mapping[str, Any], source: str = "<machine>") -> Machine:
    """:func:`parse_machine`, cached: envs of one machine and scenario shape share one compiled form.

    The cache key keeps the document's key order (no ``sort_keys``): variables are initialised in
    declaration order, so a re-sorted document would be another machine.
    """
    return _cached(json.dumps(document, default=str), field_types(fields), source)


def check_native_actions(native_type: str, declared: Any, actions: Mapping[str, Any]) -> None:
    """Every mapped native action is ``{"type": native_type, "action": <declared>}``; a ValueError names the first not."""
    names = sorted(declared) if isinstance(declared, Mapping) else []
    for semantic, native in actions.items():
        if not isinstance(native, Mapping) or native.get("type") != native_type or native.get("action") not in names:
            raise ValueError(
                f"{semantic}: got {native!r}, expected {{type: {native_type}, action: one of {names[:8]}}}"
            )
