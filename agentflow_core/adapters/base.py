"""Semantic adapters: raw channel output -> shared business-state tokens, semantic -> native actions.

Mapping rules are data (a JSON/YAML document validated against :data:`MAPPING_SCHEMA`), not
code. A template (web, db, api) contributes only how one leaf condition is matched against its
channel's raw output (:meth:`BaseSemanticAdapter.match`) and how a numeric feature is read
(:meth:`BaseSemanticAdapter.extract`); everything else -- rule evaluation, ``all``/``any``/``not``
combinators, feature scaling, action translation, masks and decision logging -- is shared.

Decision logging uses the ``agentflow.adapter`` logger at DEBUG level; the CLI turns it on when
``DEBUG_ADAPTER=1`` (the library itself reads no environment variables).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import jsonschema
import numpy as np

from agentflow_core.errors import MappingError
from agentflow_core.semantics import ACTIONS, FEATURES, N_ACTIONS, TOKENS, SemanticAction, SemanticObs

logger = logging.getLogger("agentflow.adapter")

MAPPING_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["family", "template", "version", "token_rules", "actions"],
    "additionalProperties": False,
    "properties": {
        "family": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
        "template": {"enum": ["web", "db", "api"]},
        "version": {"type": "integer", "minimum": 1},
        "description": {"type": "string"},
        "token_rules": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["id", "when", "emit"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "when": {"type": "object"},
                    "emit": {"type": "array", "minItems": 1, "items": {"enum": list(TOKENS)}},
                    "note": {"type": "string"},
                },
            },
        },
        "feature_rules": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["id", "feature", "source"],
                "additionalProperties": False,
                "properties": {
                    "id": {"type": "string", "minLength": 1},
                    "feature": {"enum": list(FEATURES)},
                    "source": {"type": "string", "minLength": 1},
                    "scale": {"type": "number"},
                    "default": {"type": "number"},
                    "clip": {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2},
                },
            },
        },
        "actions": {
            "type": "object",
            "propertyNames": {"enum": list(ACTIONS)},
            "additionalProperties": {"type": "object", "required": ["type"]},
        },
        "reward": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"scale": {"type": "number"}},
        },
    },
}


def _json_path(path: Sequence[Any]) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


class BaseSemanticAdapter:
    """Shared rule engine. Subclasses implement ``match`` and ``extract`` for their channel.

    ``WHEN_SCHEMA`` is the template's JSON Schema for one leaf condition; it is checked at load
    so that a typo in a rule fails with the JSON path of the rule instead of never matching.
    """

    template: ClassVar[str] = ""
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {"type": "object"}

    def __init__(self, mapping: Mapping[str, Any], source: str = "<mapping>") -> None:
        self.source = source
        self.mapping = validate_mapping(mapping, source, expected_template=self.template or None)
        for i, rule in enumerate(self.mapping["token_rules"]):
            self._check_when(rule["when"], ["token_rules", i, "when"])
        self.token_rules: list[dict[str, Any]] = list(self.mapping["token_rules"])
        self.feature_rules: list[dict[str, Any]] = list(self.mapping.get("feature_rules", []))
        self.native_actions: dict[int, dict[str, Any]] = {
            int(SemanticAction[name]): dict(native) for name, native in self.mapping["actions"].items()
        }
        self.reward_scale = float(self.mapping.get("reward", {}).get("scale", 1.0))

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

    # ------------------------------------------------------------------ shared engine
    def _check_when(self, when: Mapping[str, Any], path: list[Any]) -> None:
        for combinator in ("all", "any"):
            if combinator in when:
                if set(when) != {combinator} or not isinstance(when[combinator], list):
                    raise MappingError(self.source, _json_path(path), f"'{combinator}' must be the only key and hold a list")
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

    def adapt_observation(self, raw: Any, context: Mapping[str, float] | None = None) -> SemanticObs:
        """Map raw channel output to tokens + features.

        ``context`` supplies features the wrapper knows and the channel does not (``step_fraction``).
        """
        debug = logger.isEnabledFor(logging.DEBUG)
        tokens: set[str] = set()
        for rule in self.token_rules:
            if self.holds(rule["when"], raw):
                tokens.update(rule["emit"])
                if debug:
                    logger.debug("family=%s rule=%s when=%s -> %s raw=%.300r", self.mapping["family"], rule["id"],
                                 rule["when"], rule["emit"], raw)
        features: dict[str, float] = dict(context or {})
        for rule in self.feature_rules:
            value = self.extract(rule["source"], raw)
            value = float(rule.get("default", 0.0)) if value is None else float(value) * float(rule.get("scale", 1.0))
            lo, hi = rule.get("clip", (0.0, 1.0))
            features[rule["feature"]] = min(max(value, lo), hi) if math.isfinite(value) else value
            if debug:
                logger.debug("family=%s feature_rule=%s source=%s -> %s=%s", self.mapping["family"], rule["id"],
                             rule["source"], rule["feature"], features[rule["feature"]])
        return SemanticObs(frozenset(tokens), features)

    def adapt_action(self, action: int) -> dict[str, Any]:
        """Translate a semantic action into the channel-native action of the mapping file."""
        native = self.native_actions.get(int(action))
        if native is None:
            return {"type": "noop", "semantic": ACTIONS[int(action)]}
        return dict(native)

    def adapt_reward(self, raw_reward: float, obs: SemanticObs, info: Mapping[str, Any]) -> float:
        """Scalar reward in the shared scale. Token-table and model rewards live in ``rl.reward``."""
        return float(raw_reward) * self.reward_scale

    def action_mask(self, raw: Any) -> np.ndarray:
        """Boolean mask over the shared action set: mapped and available in this raw state."""
        mask = np.zeros(N_ACTIONS, dtype=bool)
        for action, native in self.native_actions.items():
            mask[action] = self.available(native, raw)
        if not mask.any():  # never leave the policy without a legal move
            mask[int(SemanticAction.ESCALATE)] = True
        return mask

    def producible_tokens(self) -> set[str]:
        """Tokens at least one rule can emit (the audit compares this to the vocabulary)."""
        return {t for r in self.token_rules for t in r["emit"]}


def validate_mapping(mapping: Any, source: str, expected_template: str | None = None) -> dict[str, Any]:
    """Validate a mapping document against :data:`MAPPING_SCHEMA`; errors carry the JSON path."""
    errors = sorted(jsonschema.Draft202012Validator(MAPPING_SCHEMA).iter_errors(mapping), key=lambda e: list(e.path))
    if errors:
        err = errors[0]
        raise MappingError(source, _json_path(list(err.path)), err.message)
    if expected_template and mapping["template"] != expected_template:
        raise MappingError(source, "$.template", f"got {mapping['template']!r}, expected {expected_template!r}")
    ids = [r["id"] for r in mapping["token_rules"]] + [r["id"] for r in mapping.get("feature_rules", [])]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise MappingError(source, "$.token_rules", f"duplicate rule id(s) {dupes}")
    return dict(mapping)
