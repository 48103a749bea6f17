"""Semantic adapters: raw channel output -> shared business-state tokens, semantic -> native actions.

Mapping rules are data (a JSON/YAML document validated against
:data:`~agentflow_core.adapters.schema.MAPPING_SCHEMA`), not
code. A template (web, db, api) contributes only how one leaf condition is matched against its
channel's raw output (:meth:`BaseSemanticAdapter.match`) and how a numeric feature is read
(:meth:`BaseSemanticAdapter.extract`); everything else -- rule evaluation, ``all``/``any``/``not``
combinators, feature scaling, action translation, masks and decision logging -- is shared.

What the policy sees is the process's, not the channel's: the legal-action mask, superseded tokens
and the presentation of gated or unobservable features come from the vocabulary's
:class:`~agentflow_core.state_contract.StateContract`, computed from the tokens the rules emit, so
one business state gives one observation on every channel (docs/adapters-equivalence.md). A
mapping's ``requires`` conditions say what its channel could issue; the audit compares them to
the process (:meth:`BaseSemanticAdapter.channel_action_mask`).

Every rule is compiled once, at load, into closures (see :class:`BaseSemanticAdapter`); the plain
interpreter of the same rules stays as the reference engine and the DEBUG path.

Decision logging uses the ``agentflow.adapter`` logger at DEBUG level; the CLI turns it on when
``DEBUG_ADAPTER=1`` (the library itself reads no environment variables).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Collection, Hashable, Mapping
from typing import Any, ClassVar

import jsonschema
import numpy as np

from agentflow_core.adapters.compiled import (
    AdaptedStep,
    Predicate,
    Reader,
    Table,
    conjunction,
    disjunction,
    dispatchable,
    identity,
)
from agentflow_core.adapters.schema import _json_path, validate_mapping
from agentflow_core.adapters.step_plan import StepPlan
from agentflow_core.errors import MappingError
from agentflow_core.semantics import SemanticObs, Vocabulary

logger = logging.getLogger("agentflow.adapter")


_PLAN_LIMIT = 256  # step plans kept (one per distinct mapping document, source and vocabulary)
_PLANS: dict[tuple[Any, ...], tuple[Vocabulary, StepPlan]] = {}
# what a template's compiled plan is made by (see BaseSemanticAdapter._declares)
_COMPILE_HOOKS = (
    "compile_leaf",
    "compile_feature",
    "compile_feature_read",
    "compile_values",
    "compile_available",
    "holds",
    "check_mapping",
)


class BaseSemanticAdapter:
    """Shared rule engine. Subclasses implement ``match`` and ``extract`` for their channel.

    ``WHEN_SCHEMA`` is the template's JSON Schema for one leaf condition; it is checked at load
    so that a typo in a rule fails with the JSON path of the rule instead of never matching.

    Two evaluations of the same rules exist. The *reference* engine (``holds``/``match``/
    ``extract``/``available``, :meth:`reference_observation`, :meth:`reference_action_mask`)
    interprets the mapping document directly and logs every decision at DEBUG. The *compiled*
    engine (:meth:`adapt_step`, and ``adapt_observation``/``action_mask`` while DEBUG is off) turns
    every token rule, feature rule and action condition into closures once, at load, held by a
    :class:`~agentflow_core.adapters.step_plan.StepPlan`: a step reads each raw value a rule or
    feature needs once (:meth:`reader`, all at once where the template has :meth:`compile_values`)
    and looks the step's whole outcome (tokens, mask, the vector without its context features) up
    by those values; a new key ORs precomputed token bits and reads the token set's multi-hot block,
    sorted tuple and mask from caches. Templates speed a leaf up by overriding :meth:`compile_leaf`,
    :meth:`compile_feature` and :meth:`compile_available`; by default those call ``match``,
    ``extract`` and ``available``, so a new template needs only the two hooks.
    ``tests/test_adapter_equivalence.py`` checks both engines agree bit for bit.

    ``SHARED_PLAN``: the template's compiled closures depend on nothing but the mapping, its source and
    the vocabulary, so adapters built from the same ones share one plan (and its caches).
    ``MEMO_STEPS``: its compiled predicates read only the per-step reader values (never ``values[0]``,
    the raw observation), so a step's outcome may be kept per distinct values. The defaults of the
    hooks read ``values[0]``: both are off unless a template turns them on.
    """

    template: ClassVar[str] = ""
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {"type": "object"}
    SHARED_PLAN: ClassVar[bool] = False
    MEMO_STEPS: ClassVar[bool] = False

    def __init__(self, mapping: Mapping[str, Any], source: str = "<mapping>", *, vocabulary: Vocabulary) -> None:
        self.source = source
        self.vocabulary = vocabulary  # the process's tokens, actions and features
        self._token_index, self._feature_index = vocabulary.token_index(), vocabulary.feature_index()
        self._n_tokens, self._n_features = vocabulary.n_tokens, vocabulary.n_features
        self._n_actions, self._escape = vocabulary.n_actions, vocabulary.action_id(vocabulary.escape_action)
        self.mapping = validate_mapping(mapping, source, expected_template=self.template or None, vocabulary=vocabulary)
        for i, rule in enumerate(self.mapping["token_rules"]):
            self._check_when(rule["when"], ["token_rules", i, "when"])
        self.token_rules: list[dict[str, Any]] = list(self.mapping["token_rules"])
        self.feature_rules: list[dict[str, Any]] = list(self.mapping.get("feature_rules", []))
        self.native_actions: dict[int, dict[str, Any]] = {
            vocabulary.action_id(name): dict(native) for name, native in self.mapping["actions"].items()
        }
        self.reward_scale = float(self.mapping.get("reward", {}).get("scale", 1.0))
        # What the policy sees is the process's: legal actions and gated/unobservable features from the tokens.
        self.contract = vocabulary.state_contract
        # a vocabulary without a declaration (a test double, an old process) leaves the mask to its channel
        self.process_masks = vocabulary.contract is not None
        self.unobservable: tuple[str, ...] = tuple(self.mapping.get("unobservable_features", []))
        self.check_mapping()
        self._compile()

    # ------------------------------------------------------------------ template hooks
    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Does one leaf condition hold for this raw observation?"""
        raise NotImplementedError(f"{type(self).__name__} must implement match()")

    def extract(self, source: str, raw: Any) -> float | None:
        """Read the numeric value named by ``source`` from the raw observation (None if absent)."""
        raise NotImplementedError(f"{type(self).__name__} must implement extract()")

    def available(self, native_action: Mapping[str, Any], raw: Any) -> bool:
        """Can this native action be issued in this raw state? Channels that know override it."""
        return True

    def check_mapping(self) -> None:
        """Template-specific load-time checks beyond the leaf schema; runs before compilation."""

    def compile_leaf(self, when: Mapping[str, Any], path: list[Any]) -> Predicate:
        """One leaf as a predicate over the step's reader values; default: ``match`` on the raw observation."""
        match = self.match
        return lambda values: match(when, values[0])

    def compile_feature(self, source: str) -> Reader:
        """A feature source as ``raw -> float | None``; default: ``extract``."""
        extract = self.extract
        return lambda raw: extract(source, raw)

    def compile_feature_read(self, source: str) -> tuple[int, Callable[[Any], Any] | None]:
        """A feature source as (reader index, reader value -> number or None; None: the value is the number).

        Default: :meth:`compile_feature` as its own reader. A template whose feature sources are values its
        rules read too (a column) returns that reader and the conversion, so a step reads it once.
        """
        return self.reader(("feature", source), self.compile_feature(source)), None

    def compile_values(self) -> Callable[[Any], list[Any]] | None:
        """Called once the rules are compiled: one function computing every reader's value (the list a
        predicate indexes) from a raw observation, or None to call the readers one by one."""
        return None

    def compile_available(self, native_action: Mapping[str, Any], path: list[Any]) -> Predicate | None:
        """Availability of one native action as a predicate (None: always available); default: ``available``."""
        if type(self).available is BaseSemanticAdapter.available:
            return None
        available = self.available
        return lambda values: available(native_action, values[0])

    def keyed_leaf(self, index: int, keys: Collection[Any], predicate: Predicate) -> Predicate:
        """Declare that ``predicate(values)`` is exactly ``values[index] == k`` for some ``k`` in ``keys``.

        Token rules and action conditions that are such a leaf on the same reader are then decided
        together by one dict lookup per step (when the keys are hashable and not NaN; otherwise, and
        for an unhashable value, the predicates run one by one). Returns ``predicate``.
        """
        self._keyed[id(predicate)] = (predicate, index, tuple(keys))
        return predicate

    def reader(self, key: Hashable, read: Reader) -> int:
        """Index of the per-step value ``read(raw)`` in a compiled predicate's ``values``.

        Leaves that ask for the same ``key`` share one read per step (``values[0]`` is the raw observation).
        """
        index = self._reader_index.get(key)
        if index is None:
            index = self._reader_index[key] = len(self._readers)
            self._readers.append(read)
        return index

    # ------------------------------------------------------------------ reference engine
    def _check_when(self, when: Mapping[str, Any], path: list[Any]) -> None:
        for combinator in ("all", "any"):
            if combinator in when:
                if set(when) != {combinator} or not isinstance(when[combinator], list):
                    raise MappingError(
                        self.source, _json_path(path), f"'{combinator}' must be the only key and hold a list"
                    )
                for j, sub in enumerate(when[combinator]):
                    self._check_when(sub, [*path, combinator, j])
                return
        if "not" in when:
            if set(when) != {"not"} or not isinstance(when["not"], Mapping):
                raise MappingError(self.source, _json_path(path), "'not' must be the only key and hold an object")
            self._check_when(when["not"], [*path, "not"])
            return
        errors = sorted(jsonschema.Draft202012Validator(self.WHEN_SCHEMA).iter_errors(when), key=lambda e: list(e.path))
        if errors:
            err = errors[0]
            raise MappingError(self.source, _json_path([*path, *err.path]), err.message)

    def holds(self, when: Mapping[str, Any], raw: Any) -> bool:
        """Evaluate a condition with ``all``/``any``/``not`` combinators."""
        if "all" in when:
            return all(self.holds(sub, raw) for sub in when["all"])
        if "any" in when:
            return any(self.holds(sub, raw) for sub in when["any"])
        if "not" in when:
            return not self.holds(when["not"], raw)
        return self.match(when, raw)

    def explain(self, raw: Any) -> list[tuple[str, tuple[str, ...]]]:
        """The (rule id, emitted tokens) of every rule that fires on ``raw``."""
        return [(r["id"], tuple(r["emit"])) for r in self.token_rules if self.holds(r["when"], raw)]

    def reference_observation(self, raw: Any, context: Mapping[str, float] | None = None) -> SemanticObs:
        """The mapping interpreted rule by rule, each decision logged at DEBUG (the oracle of the compiled engine)."""
        debug = logger.isEnabledFor(logging.DEBUG)
        tokens: set[str] = set()
        for rule in self.token_rules:
            if self.holds(rule["when"], raw):
                tokens.update(rule["emit"])
                if debug:
                    logger.debug(
                        "family=%s rule=%s when=%s -> %s raw=%.300r",
                        self.mapping["family"],
                        rule["id"],
                        rule["when"],
                        rule["emit"],
                        raw,
                    )
        features: dict[str, float] = dict(context or {})
        for rule in self.feature_rules:
            value = self.extract(rule["source"], raw)
            value = float(rule.get("default", 0.0)) if value is None else float(value) * float(rule.get("scale", 1.0))
            lo, hi = rule.get("clip", (0.0, 1.0))
            features[rule["feature"]] = min(max(value, lo), hi) if math.isfinite(value) else value
            if debug:
                logger.debug(
                    "family=%s feature_rule=%s source=%s -> %s=%s",
                    self.mapping["family"],
                    rule["id"],
                    rule["source"],
                    rule["feature"],
                    features[rule["feature"]],
                )
        tokens = set(self.contract.canonical(frozenset(tokens)))
        for name in self.unobservable:
            features[name] = self.contract.feature(name).unknown
        for spec in self.contract.gated():
            if spec.name in features and spec.observed_with.isdisjoint(tokens):
                features[spec.name] = spec.unknown
        return SemanticObs(frozenset(tokens), features)

    def reference_action_mask(self, raw: Any) -> np.ndarray:
        """The process's legal actions in the business state the reference engine reads from ``raw``."""
        if not self.process_masks:
            return self.reference_channel_mask(raw)
        return self.contract.legal_mask(self.reference_observation(raw).tokens).copy()

    def reference_channel_mask(self, raw: Any) -> np.ndarray:
        """What the channel itself could issue: mapped and ``available``, ESCALATE if nothing is (for the audit)."""
        mask = np.zeros(self._n_actions, dtype=bool)
        for action, native in self.native_actions.items():
            mask[action] = self.available(native, raw)
        if not mask.any():  # never leave the policy without a legal move
            mask[self._escape] = True
        return mask

    # ------------------------------------------------------------------ compiled engine
    def _compile(self) -> None:
        """The mapping's :class:`StepPlan`, built once per (template, source, mapping, vocabulary) when the
        template declares ``SHARED_PLAN``: envs over the same mapping share its closures and caches."""
        key = self._plan_key()
        shared = _PLANS.get(key) if key is not None else None
        if shared is not None and shared[0] is self.vocabulary:
            plan = shared[1]
        else:
            plan = self._build_plan()
            if key is not None:
                if len(_PLANS) >= _PLAN_LIMIT:
                    _PLANS.clear()
                _PLANS[key] = (self.vocabulary, plan)
        self._step_plan = plan
        cls = type(self)
        self._compiled_step_ok = cls.adapt_observation is BaseSemanticAdapter.adapt_observation
        self._plain_reward = cls.adapt_reward is BaseSemanticAdapter.adapt_reward

    def _declares(self, flag: str) -> bool:
        """Is ``flag`` on, and are the compile hooks those of the class that turned it on? (A subclass that
        overrides one may read the raw observation or its own state: it gets neither sharing nor the memo.)"""
        cls = type(self)
        owner = next(c for c in cls.__mro__ if flag in c.__dict__)
        return bool(getattr(cls, flag)) and all(getattr(cls, hook) is getattr(owner, hook) for hook in _COMPILE_HOOKS)

    def _plan_key(self) -> tuple[Any, ...] | None:
        if not self._declares("SHARED_PLAN"):
            return None
        try:
            document = json.dumps(self.mapping, sort_keys=True)
        except (TypeError, ValueError):  # a value JSON cannot write: this adapter compiles its own
            return None
        return type(self), self.source, document, id(self.vocabulary)  # the entry holds the vocabulary itself

    def _build_plan(self) -> StepPlan:
        self._readers: list[Reader] = [identity]
        self._reader_index: dict[Hashable, int] = {}
        self._keyed: dict[int, tuple[Predicate, int, tuple[Any, ...]]] = {}
        own_holds = type(self).holds is not BaseSemanticAdapter.holds
        token_rules = self._plan(
            [
                (
                    self._compile_holds(rule["when"])
                    if own_holds
                    else self._compile_tree(rule["when"], ["token_rules", i, "when"]),
                    sum(1 << self._token_index[t] for t in set(rule["emit"])),
                )
                for i, rule in enumerate(self.token_rules)
            ]
        )
        features = tuple(
            (
                self._feature_index[r["feature"]],
                *self.compile_feature_read(r["source"]),
                float(r.get("scale", 1.0)),
                float(r.get("default", 0.0)),
                *r.get("clip", (0.0, 1.0)),
            )
            for r in self.feature_rules
        )
        always, plan = 0, []
        for action, native in sorted(self.native_actions.items()):
            predicate = self.compile_available(native, ["actions", self.vocabulary.actions[action]])
            if predicate is None:
                always |= 1 << action
            else:
                plan.append((predicate, 1 << action))
        return StepPlan(
            self.vocabulary,
            self._readers,
            self.compile_values(),
            token_rules,
            (always, self._plan(plan)),
            self.process_masks,
            features,
            tuple(r["feature"] for r in self.feature_rules) + self.unobservable,
            self.unobservable,
            memo=self._declares("MEMO_STEPS"),
        )

    def _plan(
        self, entries: list[tuple[Predicate, int]]
    ) -> tuple[tuple[Table, ...], tuple[tuple[Predicate, int], ...]]:
        """Split (predicate, bits) pairs into per-reader lookup tables (keyed leaves) and the rest."""
        grouped: dict[int, list[tuple[Predicate, int, tuple[Any, ...]]]] = {}
        rest: list[tuple[Predicate, int]] = []
        for predicate, bits in entries:
            keyed = self._keyed.get(id(predicate))
            if keyed is not None and keyed[0] is predicate and all(dispatchable(k) for k in keyed[2]):
                grouped.setdefault(keyed[1], []).append((predicate, bits, keyed[2]))
            else:
                rest.append((predicate, bits))
        tables: list[Table] = []
        for index, members in grouped.items():
            table: dict[Any, int] = {}
            for _, bits, keys in members:
                for key in keys:  # equal keys (1, 1.0, True) share one entry: OR their bits
                    table[key] = table.get(key, 0) | bits
            tables.append((index, table, tuple((p, b) for p, b, _ in members)))
        return tuple(tables), tuple(rest)

    def _compile_holds(self, when: Mapping[str, Any]) -> Predicate:
        holds = self.holds  # a template with its own combinator semantics keeps them
        return lambda values: holds(when, values[0])

    def _compile_tree(self, when: Mapping[str, Any], path: list[Any]) -> Predicate:
        """A condition (combinators included) as one closure over the step's reader values."""
        if "all" in when:
            return conjunction(tuple(self._compile_tree(s, [*path, "all", j]) for j, s in enumerate(when["all"])))
        if "any" in when:
            return disjunction(tuple(self._compile_tree(s, [*path, "any", j]) for j, s in enumerate(when["any"])))
        if "not" in when:
            inner = self._compile_tree(when["not"], [*path, "not"])
            return lambda values: not inner(values)
        return self.compile_leaf(when, path)

    # ------------------------------------------------------------------ public step API
    def adapt_step(self, raw: Any, context: Mapping[str, float] | None = None) -> AdaptedStep:
        """Encoded vector, tokens, mask (and SemanticObs on demand) of one raw observation in one pass.

        With DEBUG on for ``agentflow.adapter``, or in a template that overrides ``adapt_observation``
        or ``action_mask``, this goes through those methods so logging and overrides take effect.
        """
        if self._compiled_step_ok and not logger.isEnabledFor(logging.DEBUG):
            return self._step_plan.step(raw, context)
        obs = self.adapt_observation(raw, context)
        vec = self.vocabulary.encode(obs.tokens, obs.features)
        mask = self.contract.legal_mask(obs.tokens) if self.process_masks else self.channel_action_mask(raw)
        return AdaptedStep(
            vec, mask, obs.tokens, tuple(sorted(obs.tokens)), bool(np.isfinite(vec).all()), None, (), [], obs
        )

    def adapt_observation(self, raw: Any, context: Mapping[str, float] | None = None) -> SemanticObs:
        """Map raw channel output to tokens + features.

        ``context`` supplies features the wrapper knows and the channel does not (``step_fraction``).
        With DEBUG on this is :meth:`reference_observation` (every decision logged).
        """
        if logger.isEnabledFor(logging.DEBUG):
            return self.reference_observation(raw, context)
        return self._step_plan.step(raw, context).obs

    def adapt_action(self, action: int) -> dict[str, Any]:
        """Translate a semantic action into the channel-native action of the mapping file."""
        native = self.native_actions.get(int(action))
        if native is None:
            return {"type": "noop", "semantic": self.vocabulary.actions[int(action)]}
        return dict(native)

    def adapt_reward(self, raw_reward: float, obs: SemanticObs, info: Mapping[str, Any]) -> float:
        """Scalar reward in the shared scale. Token-table and model rewards live in ``rl.reward``."""
        return float(raw_reward) * self.reward_scale

    def step_reward(self, raw_reward: float, step: AdaptedStep, info: Mapping[str, Any]) -> float:
        """``adapt_reward`` for an :class:`AdaptedStep`; builds the SemanticObs only for a template that reads it."""
        if self._plain_reward:
            return float(raw_reward) * self.reward_scale
        return self.adapt_reward(raw_reward, step.obs, info)

    def action_mask(self, raw: Any) -> np.ndarray:
        """The process's legal actions in the business state of ``raw`` (a fresh array; the same on every channel)."""
        return self._step_plan.step(raw, None).mask.copy()

    def channel_action_mask(self, raw: Any) -> np.ndarray:
        """What the channel itself could issue in ``raw``: mapped and available (the audit compares it to the process)."""
        plan = self._step_plan
        return plan.channel_mask(plan.read_all(raw)).copy()

    def producible_tokens(self) -> set[str]:
        """Tokens at least one rule can emit (the audit compares this to the vocabulary)."""
        return {t for r in self.token_rules for t in r["emit"]}
