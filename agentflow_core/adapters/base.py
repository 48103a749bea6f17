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

import logging
import math
from collections.abc import Collection, Hashable, Mapping
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
    rule_bits,
)
from agentflow_core.adapters.schema import _json_path, validate_mapping
from agentflow_core.errors import MappingError
from agentflow_core.semantics import SemanticObs, Vocabulary

logger = logging.getLogger("agentflow.adapter")


_FLOAT32_SAFE = 3.0e38  # |x| below this stays finite as float32; beyond it the exact numpy check runs
_CACHE_LIMIT = 4096  # distinct token sets / masks kept per adapter (a handful occur in practice)

# (tokens, sorted tokens, multi-hot block, legal mask, features presented as unknown) per token set
TokenEntry = tuple[frozenset[str], tuple[str, ...], np.ndarray, np.ndarray, tuple[tuple[int, int, float], ...]]


class BaseSemanticAdapter:
    """Shared rule engine. Subclasses implement ``match`` and ``extract`` for their channel.

    ``WHEN_SCHEMA`` is the template's JSON Schema for one leaf condition; it is checked at load
    so that a typo in a rule fails with the JSON path of the rule instead of never matching.

    Two evaluations of the same rules exist. The *reference* engine (``holds``/``match``/
    ``extract``/``available``, :meth:`reference_observation`, :meth:`reference_action_mask`)
    interprets the mapping document directly and logs every decision at DEBUG. The *compiled*
    engine (:meth:`adapt_step`, and ``adapt_observation``/``action_mask`` while DEBUG is off) turns
    every token rule, feature rule and action condition into closures once, at load: a step reads
    each raw value a rule needs once (:meth:`reader`), ORs precomputed token bits, and looks the
    token set and mask up in caches that hold the multi-hot block, the sorted token tuple and the
    mask array. Templates speed a leaf up by overriding :meth:`compile_leaf`,
    :meth:`compile_feature` and :meth:`compile_available`; by default those call ``match``,
    ``extract`` and ``available``, so a new template needs only the two hooks.
    ``tests/test_adapter_equivalence.py`` checks both engines agree bit for bit.
    """

    template: ClassVar[str] = ""
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {"type": "object"}

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
        self._readers: list[Reader] = [identity]
        self._reader_index: dict[Hashable, int] = {}
        self._keyed: dict[int, tuple[Predicate, int, tuple[Any, ...]]] = {}
        own_holds = type(self).holds is not BaseSemanticAdapter.holds
        self._token_tables, self._token_plan = self._plan(
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
        self._feature_names: tuple[str, ...] = tuple(r["feature"] for r in self.feature_rules) + self.unobservable
        self._feature_plan: tuple[tuple[int, Reader, float, float, Any, Any], ...] = tuple(
            (
                self._feature_index[r["feature"]],
                self.compile_feature(r["source"]),
                float(r.get("scale", 1.0)),
                float(r.get("default", 0.0)),
                *r.get("clip", (0.0, 1.0)),
            )
            for r in self.feature_rules
        )
        # Clip bounds a float32 cannot hold leave the finiteness of the vector to the exact numpy check.
        self._wide_clip = not all(
            -_FLOAT32_SAFE <= b <= _FLOAT32_SAFE for *_, lo, hi in self._feature_plan for b in (lo, hi)
        )
        always, plan = 0, []
        for action, native in sorted(self.native_actions.items()):
            predicate = self.compile_available(native, ["actions", self.vocabulary.actions[action]])
            if predicate is None:
                always |= 1 << action
            else:
                plan.append((predicate, 1 << action))
        self._mask_always = always
        self._mask_tables, self._mask_plan = self._plan(plan)
        self._token_cache: dict[int, TokenEntry] = {}
        self._mask_cache: dict[int, np.ndarray] = {}
        cls = type(self)
        self._compiled_step_ok = cls.adapt_observation is BaseSemanticAdapter.adapt_observation
        self._plain_reward = cls.adapt_reward is BaseSemanticAdapter.adapt_reward

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

    def _token_entry(self, bits: int) -> TokenEntry:
        entry = self._token_cache.get(bits)
        if entry is None:
            tokens = self.contract.canonical(
                frozenset(t for i, t in enumerate(self.vocabulary.tokens) if bits >> i & 1)
            )
            block = np.zeros(self.vocabulary.obs_dim, dtype=np.float32)
            block[[self._token_index[t] for t in tokens]] = 1.0
            block.flags.writeable = False
            if len(self._token_cache) >= _CACHE_LIMIT:
                self._token_cache.clear()
            entry = self._token_cache[bits] = (
                tokens,
                tuple(sorted(tokens)),
                block,
                self.contract.legal_mask(tokens),
                self._hidden(tokens),
            )
        return entry

    def _hidden(self, tokens: frozenset[str]) -> tuple[tuple[int, int, float], ...]:
        """(position among the step's feature values, block index, presented value) of every feature the
        process presents as unknown in this business state: unobservable on this channel, or gated off."""
        out = []
        for position, name in enumerate(self._feature_names):
            spec = self.contract.feature(name)
            if name in self.unobservable or (spec.observed_with and spec.observed_with.isdisjoint(tokens)):
                out.append((position, self._feature_index[name], spec.unknown))
        return tuple(out)

    def _mask(self, values: list[Any]) -> np.ndarray:
        bits = rule_bits(self._mask_always, self._mask_tables, self._mask_plan, values)
        mask = self._mask_cache.get(bits)
        if mask is None:
            mask = np.zeros(self._n_actions, dtype=bool)
            mask[[a for a in range(self._n_actions) if bits >> a & 1]] = True
            if not bits:  # never leave the policy without a legal move
                mask[self._escape] = True
            mask.flags.writeable = False
            if len(self._mask_cache) >= _CACHE_LIMIT:
                self._mask_cache.clear()
            self._mask_cache[bits] = mask
        return mask

    def _compiled_step(self, raw: Any, context: Mapping[str, float] | None) -> AdaptedStep:
        values = [read(raw) for read in self._readers]
        bits = rule_bits(0, self._token_tables, self._token_plan, values)
        tokens, ordered, block, legal, hidden = self._token_cache.get(bits) or self._token_entry(bits)
        block_features = [0.0] * self._n_features
        finite = not self._wide_clip
        if context:
            for name, value in context.items():
                block_features[self._feature_index[name]] = value
                if not -_FLOAT32_SAFE <= value <= _FLOAT32_SAFE:
                    finite = False
        rule_values: list[float] = []
        for index, read, scale, default, lo, hi in self._feature_plan:
            found = read(raw)
            value = default if found is None else float(found) * scale
            if value - value == 0.0:  # finite (inf - inf and nan - nan are nan); min(max(value, lo), hi):
                if value < lo:
                    value = lo
                if value > hi:
                    value = hi
            else:
                finite = False
            rule_values.append(value)
            block_features[index] = value
        if hidden:
            rule_values.extend(0.0 for _ in self.unobservable)
            for position, index, unknown in hidden:
                rule_values[position] = block_features[index] = unknown
        vec = block.copy()
        vec[self._n_tokens :] = block_features
        if not finite:
            finite = bool(np.isfinite(vec).all())
        mask = legal if self.process_masks else self._mask(values)
        return AdaptedStep(vec, mask, tokens, ordered, finite, context, self._feature_names, rule_values)

    # ------------------------------------------------------------------ public step API
    def adapt_step(self, raw: Any, context: Mapping[str, float] | None = None) -> AdaptedStep:
        """Encoded vector, tokens, mask (and SemanticObs on demand) of one raw observation in one pass.

        With DEBUG on for ``agentflow.adapter``, or in a template that overrides ``adapt_observation``
        or ``action_mask``, this goes through those methods so logging and overrides take effect.
        """
        if self._compiled_step_ok and not logger.isEnabledFor(logging.DEBUG):
            return self._compiled_step(raw, context)
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
        return self._compiled_step(raw, context).obs

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
        return self._compiled_step(raw, None).mask.copy()

    def channel_action_mask(self, raw: Any) -> np.ndarray:
        """What the channel itself could issue in ``raw``: mapped and available (the audit compares it to the process)."""
        return self._mask([read(raw) for read in self._readers]).copy()

    def producible_tokens(self) -> set[str]:
        """Tokens at least one rule can emit (the audit compares this to the vocabulary)."""
        return {t for r in self.token_rules for t in r["emit"]}
