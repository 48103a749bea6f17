"""A business process as data: its vocabulary, outcomes, channels, scripted expert and probe states.

One document per process (``configs/processes/<name>.yaml``, parsed at the edge by
``tasks/process_io.py``; the core never imports yaml) declares::

    name: checkout
    version: "1"                       # vocabulary version, stored with checkpoints and datasets
    tokens: [LOGGED_OUT, ...]          # business-state tokens (the multi-hot block)
    actions:                           # semantic actions, in action-id order, with declared risk
      - {name: LOGIN}
      - {name: CANCEL_ORDER, risk: 0.5}
    features:                          # numeric features (after the tokens): a name, or its declaration
      - user_logged_in
      - {name: balance_ratio, meaning: wallet over price, scale: ratio / 2, observed_with: [LOGGED_IN], unknown: 0}
    legal_actions:                     # action -> tokens that make it legal (any / all / none); unlisted: always
      LOGIN: {any: [LOGGED_OUT, SESSION_EXPIRED]}
    goal: PAYMENT_SUCCESS
    scenario:                          # the business parameters a variant sets (agentflow_core/scenario.py)
      user_tier: {type: str, values: [standard, vip, blocked], default: standard, role: dimension}
      price_factor: {type: float, range: [0.01, 10], default: 1.0, role: perturbation}
      max_episode_steps: {type: int, range: [1, 100000], default: 50}
    handled_outcomes:                  # other terminal tokens that are the right outcome for a variant
      - {dimension: user_tier, value: blocked, tokens: [ESCALATED]}
    channels:                          # env family -> its base env and mapping file
      web_checkout: {env: web_checkout_v2, mapping: web_checkout_v2.json}
    real_channels:                     # sim-to-real: a channel's counterpart on a real system (RealChannelSpec)
      order_db: {description: PostgreSQL (pgserver), kwargs: {url: pgserver}}   # or service: <name>
    escape_action: ESCALATE            # legal whenever a channel maps no other action
    exclusive_tokens:                  # token groups no state may hold two of (the mapping audit checks)
      - [LOGGED_OUT, LOGGED_IN]
    expert:                            # the scripted expert: first rule whose token is present wins
      rules: [{when: USER_BLOCKED, act: ESCALATE}, ...]
      fallback: VIEW_PRODUCT
    probes:                            # consistency-probe states (evaluation/consistency.py): tokens + feature values
      - {name: logged_out, tokens: [LOGGED_OUT], logged_in: false}
      - {name: paying, tokens: [PAYMENT_PAGE], features: {payment_page_loaded: 1.0}}

:meth:`ProcessSpec.from_document` checks everything -- unknown keys, types, duplicates, and that
every token, action, feature and scenario field a rule, outcome or probe names is declared -- and raises one
:class:`~agentflow_core.errors.ConfigError` naming the file and the key. The result is frozen and
picklable (plain tuples), so it travels to workers as data.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agentflow_core.envs.experts import ScriptedExpert
from agentflow_core.errors import ConfigError
from agentflow_core.scenario import FIELD_TYPES, ROLES, STEP_LIMIT_FIELD, ScenarioField, ScenarioSpec
from agentflow_core.semantics import Vocabulary
from agentflow_core.state_contract import FeatureSpec, contract_from_data

MAX_NAMES = 256  # tokens, actions or features per process
MAX_ITEMS = 1024  # rules, outcomes, probes, channels
MAX_RISK = 1.0
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")

TOP_KEYS = frozenset(
    {
        "name",
        "version",
        "description",
        "tokens",
        "actions",
        "features",
        "goal",
        "handled_outcomes",
        "channels",
        "real_channels",
        "expert",
        "probes",
        "escape_action",
        "exclusive_tokens",
        "scenario",
        "legal_actions",
        "supersedes",
    }
)
REQUIRED = frozenset(
    {"name", "version", "tokens", "actions", "features", "goal", "expert", "escape_action", "scenario"}
)
FIELD_KEYS = frozenset({"type", "values", "range", "default", "role", "description"})


@dataclass(frozen=True)
class CanonicalState:
    """A semantic state every channel can be in: its tokens and the feature values it fixes.

    A process lists them as its consistency probes; :mod:`agentflow_core.evaluation.consistency`
    encodes each in every variant and compares the policy's choices. ``features`` are the process's own
    (feature name, value) pairs; ``logged_in``, ``cart_items`` (in items) and ``payment_page`` are
    checkout's stage features, used where the vocabulary has them."""

    name: str
    tokens: frozenset[str]
    logged_in: bool = True
    cart_items: int = 0
    payment_page: bool = False
    features: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ChannelSpec:
    """One channel of a process: the env family, its base env id and its mapping file (a name, not a path)."""

    family: str
    env: str
    mapping: str


@dataclass(frozen=True)
class RealChannelSpec:
    """A channel's real counterpart (sim-to-real): ``env`` (else the channel's) with ``kwargs`` replaced; a
    ``service`` (entry point group ``agentflow.services``) runs in its own process, the env gets its ``base_url``."""

    family: str
    description: str
    env: str | None = None
    kwargs: tuple[tuple[str, str | float | bool], ...] = ()
    service: str | None = None


@dataclass(frozen=True)
class ProcessSpec:
    """A validated business process (see the module docstring for the document it comes from)."""

    name: str
    vocabulary: Vocabulary
    channels: tuple[ChannelSpec, ...]
    expert_rules: tuple[tuple[str, int], ...]
    expert_fallback: int
    probes: tuple[CanonicalState, ...]
    source: str = "<process>"
    description: str = ""
    real_channels: tuple[RealChannelSpec, ...] = ()

    def expert(self, family: str = "any") -> ScriptedExpert:
        """The scripted expert of this process for ``family`` (the same rules on every channel)."""
        return ScriptedExpert(family, self.expert_rules, self.expert_fallback, self.vocabulary)

    def channel(self, family: str) -> ChannelSpec:
        """The channel of ``family``; a KeyError names the declared ones."""
        for channel in self.channels:
            if channel.family == family:
                return channel
        raise KeyError(f"process {self.name!r} has no channel {family!r}: {[c.family for c in self.channels]}")

    @property
    def base_envs(self) -> tuple[str, ...]:
        """Base env ids of the process's channels, in declaration order."""
        return tuple(c.env for c in self.channels)

    @classmethod
    def from_document(cls, document: Any, source: str = "<process>") -> ProcessSpec:
        """Validate a parsed process document; the first problem raises a ConfigError naming ``source`` and key."""
        return _Parser(source).parse(document)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class _Parser:
    """Checks one document top to bottom; every error names the file and the key path."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, key: str, value: Any, expected: str) -> ConfigError:
        return ConfigError(self.source, key, value, expected)

    def mapping(self, key: str, value: Any, allowed: frozenset[str], required: frozenset[str]) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(key, value, "a mapping")
        unknown = sorted((k for k in value if k not in allowed), key=str)  # keys may be None or numbers
        if unknown:
            raise self.fail(
                f"{key}.{unknown[0]}" if key else str(unknown[0]), value[unknown[0]], f"no such key ({sorted(allowed)})"
            )
        missing = sorted(required - set(value))
        if missing:
            raise self.fail(f"{key}.{missing[0]}" if key else missing[0], None, "a value (required key)")
        return value

    def names(self, key: str, value: Any, *, limit: int = MAX_NAMES) -> tuple[str, ...]:
        if not isinstance(value, list) or not value or len(value) > limit:
            raise self.fail(key, value, f"a non-empty list of at most {limit} names")
        for i, name in enumerate(value):
            if not isinstance(name, str) or not _NAME.match(name):
                raise self.fail(f"{key}.{i}", name, "a name of letters, digits and '_' (starting with a letter)")
        duplicates = sorted({n for n in value if value.count(n) > 1})
        if duplicates:
            raise self.fail(key, duplicates[0], "unique names (declared twice)")
        return tuple(value)

    def member(self, key: str, value: Any, declared: tuple[str, ...], what: str) -> str:
        if value not in declared:
            raise self.fail(
                key, value, f"a declared {what} (one of {list(declared)[:8]}{'...' if len(declared) > 8 else ''})"
            )
        return str(value)

    def items(self, key: str, value: Any, *, allow_empty: bool = False) -> list[Any]:
        if value is None and allow_empty:
            return []
        if not isinstance(value, list) or (not value and not allow_empty) or len(value) > MAX_ITEMS:
            raise self.fail(key, value, f"a list of at most {MAX_ITEMS} items")
        return value

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str) or not value or len(value) > 200:
            raise self.fail(key, value, "a non-empty string of at most 200 characters")
        return value

    def parse(self, document: Any) -> ProcessSpec:
        doc = self.mapping("", document, TOP_KEYS, REQUIRED)
        name = self.text("name", doc["name"])
        if not _NAME.match(name):
            raise self.fail("name", name, "a name of letters, digits and '_'")
        version = doc["version"]
        if not isinstance(version, str | int) or isinstance(version, bool) or not str(version):
            raise self.fail("version", version, "a string or integer")
        tokens = self.names("tokens", doc["tokens"])
        specs = self.features(doc["features"], tokens)
        features = self.names("features", [s.name for s in specs])
        actions, risks = self.actions(doc["actions"])
        goal = self.member("goal", doc["goal"], tokens, "token")
        scenario = self.scenario(doc["scenario"])
        outcomes = self.outcomes(doc.get("handled_outcomes"), tokens, scenario)
        escape = self.member("escape_action", doc["escape_action"], actions, "action")
        exclusive = self.exclusive(doc.get("exclusive_tokens"), tokens)
        legal = self.legal(doc.get("legal_actions"), tokens, actions)
        contract = contract_from_data(actions, escape, legal, specs, self.supersedes(doc.get("supersedes"), tokens))
        vocabulary = Vocabulary(
            str(version), tokens, actions, features, risks, goal, outcomes, escape, exclusive, scenario, contract
        )
        rules, fallback = self.expert(doc["expert"], tokens, actions)
        channels = self.channels(doc.get("channels"))
        return ProcessSpec(
            name=name,
            vocabulary=vocabulary,
            channels=channels,
            expert_rules=rules,
            expert_fallback=fallback,
            probes=self.probes(doc.get("probes"), tokens, features),
            source=self.source,
            description=str(doc.get("description", "")),
            real_channels=self.real_channels(doc.get("real_channels"), channels),
        )

    def features(self, value: Any, tokens: tuple[str, ...]) -> tuple[FeatureSpec, ...]:
        keys = frozenset({"name", "meaning", "scale", "unknown", "observed_with", "range"})
        out = []
        for i, entry in enumerate(self.items("features", value)):
            if isinstance(entry, str):
                out.append(FeatureSpec(entry))
                continue
            item = self.mapping(f"features.{i}", entry, keys, frozenset({"name"}))
            unknown = item.get("unknown", 0.0)
            if isinstance(unknown, bool) or not isinstance(unknown, int | float) or not math.isfinite(unknown):
                raise self.fail(f"features.{i}.unknown", unknown, "a finite number")
            bounds = item.get("range", [0.0, 1.0])
            if not isinstance(bounds, list) or len(bounds) != 2 or not all(isinstance(x, int | float) for x in bounds):
                raise self.fail(f"features.{i}.range", bounds, "[low, high] numbers")
            low, high = bounds
            gate = self.names(f"features.{i}.observed_with", item["observed_with"]) if "observed_with" in item else ()
            for j, token in enumerate(gate):
                self.member(f"features.{i}.observed_with.{j}", token, tokens, "token")
            out.append(
                FeatureSpec(
                    str(item["name"]),
                    str(item.get("meaning", "")),
                    str(item.get("scale", "")),
                    float(unknown),
                    frozenset(gate),
                    float(low),
                    float(high),
                )
            )
        return tuple(out)

    def supersedes(self, value: Any, tokens: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail("supersedes", value, "a mapping of token -> the tokens it replaces")
        out = {}
        for token, old in value.items():
            self.member("supersedes", token, tokens, "token")
            listed = self.names(f"supersedes.{token}", old)
            for j, name in enumerate(listed):
                self.member(f"supersedes.{token}.{j}", name, tokens, "token")
            out[str(token)] = listed
        return out

    def legal(
        self, value: Any, tokens: tuple[str, ...], actions: tuple[str, ...]
    ) -> dict[str, dict[str, tuple[str, ...]]]:
        if value is None:
            return {}
        if not isinstance(value, Mapping):
            raise self.fail("legal_actions", value, "a mapping of action -> {any, all, none} token lists")
        out: dict[str, dict[str, tuple[str, ...]]] = {}
        for action, rule in value.items():
            self.member("legal_actions", action, actions, "action")
            item = self.mapping(f"legal_actions.{action}", rule or {}, frozenset({"any", "all", "none"}), frozenset())
            out[action] = {}
            for kind, names in item.items():
                listed = self.names(f"legal_actions.{action}.{kind}", names)
                for j, token in enumerate(listed):
                    self.member(f"legal_actions.{action}.{kind}.{j}", token, tokens, "token")
                out[action][kind] = listed
        return out

    def actions(self, value: Any) -> tuple[tuple[str, ...], tuple[float, ...]]:
        entries = self.items("actions", value)
        names: list[str] = []
        risks: list[float] = []
        for i, entry in enumerate(entries):
            item = self.mapping(f"actions.{i}", entry, frozenset({"name", "risk"}), frozenset({"name"}))
            risk = item.get("risk", 0.0)
            if isinstance(risk, bool) or not isinstance(risk, int | float) or not math.isfinite(risk):
                raise self.fail(f"actions.{i}.risk", risk, f"a finite number in [0, {MAX_RISK}]")
            if not 0.0 <= float(risk) <= MAX_RISK:
                raise self.fail(f"actions.{i}.risk", risk, f"a finite number in [0, {MAX_RISK}]")
            names.append(item["name"])
            risks.append(float(risk))
        return self.names("actions", names), tuple(risks)

    def scenario(self, value: Any) -> ScenarioSpec:
        if not isinstance(value, Mapping) or not value or len(value) > MAX_NAMES:
            raise self.fail("scenario", value, f"a mapping of at most {MAX_NAMES} field name -> {{type, default, ...}}")
        fields = tuple(self.scenario_field(name, entry) for name, entry in value.items())
        if STEP_LIMIT_FIELD not in {f.name for f in fields}:
            raise self.fail(f"scenario.{STEP_LIMIT_FIELD}", None, "a declared int field (the episode step limit)")
        if fields[[f.name for f in fields].index(STEP_LIMIT_FIELD)].type != "int":
            raise self.fail(f"scenario.{STEP_LIMIT_FIELD}.type", "not int", "int")
        return ScenarioSpec(fields)

    def scenario_field(self, name: Any, entry: Any) -> ScenarioField:
        key = f"scenario.{name}"
        if not isinstance(name, str) or not _NAME.match(name):
            raise self.fail("scenario", name, "field names of letters, digits and '_' (starting with a letter)")
        item = self.mapping(key, entry, FIELD_KEYS, frozenset({"type", "default"}))
        kind = item["type"]
        if kind not in FIELD_TYPES:
            raise self.fail(f"{key}.type", kind, f"one of {list(FIELD_TYPES)}")
        role = item.get("role", "fixed")
        if role not in ROLES:
            raise self.fail(f"{key}.role", role, f"one of {list(ROLES)}")
        values = None
        if "values" in item:
            if not isinstance(item["values"], list) or not item["values"] or len(item["values"]) > MAX_ITEMS:
                raise self.fail(f"{key}.values", item["values"], f"a non-empty list of at most {MAX_ITEMS} values")
            values = tuple(item["values"])
        low = high = None
        if "range" in item:
            bounds = item["range"]
            numbers = isinstance(bounds, list) and len(bounds) == 2 and all(_finite(b) for b in bounds)
            if kind not in ("int", "float") or not numbers or bounds[0] > bounds[1] or values is not None:
                raise self.fail(f"{key}.range", bounds, "[low, high] of a number field without values")
            low, high = float(bounds[0]), float(bounds[1])
        field = ScenarioField(name, kind, item["default"], role, values, low, high)
        for i, choice in enumerate(values or ()):
            if (problem := ScenarioField(name, kind, choice).problem(choice)) is not None:
                raise self.fail(f"{key}.values.{i}", choice, problem)
        if (problem := field.problem(item["default"])) is not None:
            raise self.fail(f"{key}.default", item["default"], problem)
        if role == "perturbation" and kind != "bool" and values is None and low is None:
            raise self.fail(key, dict(item), "values or a range (a perturbation is drawn from them)")
        return field

    def outcomes(
        self, value: Any, tokens: tuple[str, ...], scenario: ScenarioSpec
    ) -> dict[tuple[str, str], frozenset[str]]:
        out: dict[tuple[str, str], frozenset[str]] = {}
        keys = frozenset({"dimension", "value", "tokens"})
        for i, entry in enumerate(self.items("handled_outcomes", value, allow_empty=True)):
            item = self.mapping(f"handled_outcomes.{i}", entry, keys, keys)
            dimension = self.member(
                f"handled_outcomes.{i}.dimension", item["dimension"], scenario.names, "scenario field"
            )
            if scenario.field(dimension).problem(item["value"]) is not None:
                raise self.fail(f"handled_outcomes.{i}.value", item["value"], scenario.field(dimension).expected)
            dim_value = self.text(f"handled_outcomes.{i}.value", str(item["value"]))
            names = self.names(f"handled_outcomes.{i}.tokens", item["tokens"])
            for j, token in enumerate(names):
                self.member(f"handled_outcomes.{i}.tokens.{j}", token, tokens, "token")
            if (dimension, dim_value) in out:
                raise self.fail(f"handled_outcomes.{i}", [dimension, dim_value], "one entry per (dimension, value)")
            out[(dimension, dim_value)] = frozenset(names)
        return out

    def exclusive(self, value: Any, tokens: tuple[str, ...]) -> tuple[frozenset[str], ...]:
        groups = []
        for i, entry in enumerate(self.items("exclusive_tokens", value, allow_empty=True)):
            names = self.names(f"exclusive_tokens.{i}", entry)
            if len(names) < 2:
                raise self.fail(f"exclusive_tokens.{i}", entry, "a group of at least two tokens")
            for j, token in enumerate(names):
                self.member(f"exclusive_tokens.{i}.{j}", token, tokens, "token")
            groups.append(frozenset(names))
        return tuple(groups)

    def channels(self, value: Any) -> tuple[ChannelSpec, ...]:
        if value is None:
            return ()
        if not isinstance(value, Mapping) or len(value) > MAX_ITEMS:
            raise self.fail("channels", value, "a mapping of env family -> {env, mapping}")
        out = []
        keys = frozenset({"env", "mapping"})
        for family, entry in value.items():
            if not isinstance(family, str) or not _NAME.match(family):
                raise self.fail("channels", family, "env family names of letters, digits and '_'")
            item = self.mapping(f"channels.{family}", entry, keys, keys)
            env = self.text(f"channels.{family}.env", item["env"])
            mapping = self.text(f"channels.{family}.mapping", item["mapping"])
            if "/" in mapping or "\\" in mapping or mapping.startswith("."):
                raise self.fail(f"channels.{family}.mapping", mapping, "a file name (no directories)")
            if not env.startswith(family):
                raise self.fail(f"channels.{family}.env", env, f"a base env id of family {family!r}")
            out.append(ChannelSpec(family, env, mapping))
        return tuple(out)

    def real_channels(self, value: Any, channels: tuple[ChannelSpec, ...]) -> tuple[RealChannelSpec, ...]:
        out, keys, value = [], frozenset({"description", "env", "kwargs", "service"}), value or {}
        families = frozenset(value) if isinstance(value, Mapping) else frozenset()
        for family, entry in self.mapping("real_channels", value, families, frozenset()).items():
            key = f"real_channels.{self.member('real_channels', family, tuple(c.family for c in channels), 'channel')}"
            item, kwargs = self.mapping(key, entry, keys, frozenset()), entry.get("kwargs") or {}
            names = frozenset(kwargs) if isinstance(kwargs, Mapping) else frozenset()
            for name, v in self.mapping(f"{key}.kwargs", kwargs, names, frozenset()).items():
                if not _NAME.match(str(name)) or not (isinstance(v, str | bool) or _finite(v)):
                    raise self.fail(f"{key}.kwargs.{name}", v, "text, a finite number or true/false")
            if item.get("service") is not None and not _NAME.match(str(item["service"])):
                raise self.fail(f"{key}.service", item["service"], "an installed service's name (agentflow.services)")
            env = None if item.get("env") is None else self.text(f"{key}.env", item["env"])
            description = self.text(f"{key}.description", item.get("description", f"{family} on a real system"))
            out.append(RealChannelSpec(family, description, env, tuple(kwargs.items()), item.get("service")))
        return tuple(out)

    def expert(
        self, value: Any, tokens: tuple[str, ...], actions: tuple[str, ...]
    ) -> tuple[tuple[tuple[str, int], ...], int]:
        expert = self.mapping("expert", value, frozenset({"rules", "fallback"}), frozenset({"rules", "fallback"}))
        rules = []
        keys = frozenset({"when", "act"})
        for i, entry in enumerate(self.items("expert.rules", expert["rules"])):
            item = self.mapping(f"expert.rules.{i}", entry, keys, keys)
            token = self.member(f"expert.rules.{i}.when", item["when"], tokens, "token")
            action = self.member(f"expert.rules.{i}.act", item["act"], actions, "action")
            rules.append((token, actions.index(action)))
        fallback = self.member("expert.fallback", expert["fallback"], actions, "action")
        return tuple(rules), actions.index(fallback)

    def probe_features(self, key: str, value: Any, features: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
        if value is None:
            return ()
        if not isinstance(value, Mapping) or len(value) > MAX_NAMES:
            raise self.fail(key, value, "a mapping of declared feature -> number")
        out = []
        for name, number in value.items():
            self.member(f"{key}.{name}", name, features, "feature")
            if not _finite(number):
                raise self.fail(f"{key}.{name}", number, "a finite number")
            out.append((str(name), float(number)))
        return tuple(out)

    def probes(self, value: Any, tokens: tuple[str, ...], features: tuple[str, ...]) -> tuple[CanonicalState, ...]:
        out = []
        keys = frozenset({"name", "tokens", "features", "logged_in", "cart_items", "payment_page"})
        for i, entry in enumerate(self.items("probes", value, allow_empty=True)):
            item = self.mapping(f"probes.{i}", entry, keys, frozenset({"name", "tokens"}))
            names = self.names(f"probes.{i}.tokens", item["tokens"])
            for j, token in enumerate(names):
                self.member(f"probes.{i}.tokens.{j}", token, tokens, "token")
            flags = {}
            for flag in ("logged_in", "payment_page"):
                if flag in item and not isinstance(item[flag], bool):
                    raise self.fail(f"probes.{i}.{flag}", item[flag], "true or false")
                flags[flag] = bool(item.get(flag, flag == "logged_in"))
            cart = item.get("cart_items", 0)
            if isinstance(cart, bool) or not isinstance(cart, int) or not 0 <= cart <= 1000:
                raise self.fail(f"probes.{i}.cart_items", cart, "an integer in [0, 1000]")
            out.append(
                CanonicalState(
                    self.text(f"probes.{i}.name", item["name"]),
                    frozenset(names),
                    logged_in=flags["logged_in"],
                    cart_items=cart,
                    payment_page=flags["payment_page"],
                    features=self.probe_features(f"probes.{i}.features", item.get("features"), features),
                )
            )
        return tuple(out)
