"""One business state, one observation: legal actions and feature presentation as functions of the tokens.

A process declares, with its vocabulary, which semantic actions are legal in which business state
and what each numeric feature means. Every channel's adapter computes its tokens and raw feature
values from its own raw output; what the policy then sees is decided here, once, from those tokens,
so the same business state gives the same mask and the same features on every channel:

* **legal actions**: per action, the tokens that make it legal (``any`` of them present, ``all``
  of them present, ``none`` of them present; an empty rule means always legal). The escape action
  is legal whenever nothing else is. A channel never widens this set; when it cannot carry out a
  legal action it reports the failure in its next observation.
* **superseded tokens**: a token that, once present, replaces others (support taking a blocked
  user's case over: ``ESCALATED`` supersedes ``USER_BLOCKED``), so a channel that still shows the
  old condition and one that shows only the new reads the same state;
* **features**: name, meaning and scale (documentation the audit and the docs quote), the value
  presented when the feature is not known (``unknown``), and ``observed_with``: tokens at least one
  of which must be present for the feature to be presented at all (e.g. a wallet balance only inside
  a live session). A mapping that declares a feature unobservable on its channel gets ``unknown``
  there at every step.

The contract is plain frozen data (tuples), so it travels to workers with the vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

# Features the env wrapper fills from the episode itself, on every channel (no mapping reads them).
CONTEXT_FEATURES = frozenset({"step_fraction"})


@dataclass(frozen=True)
class LegalRule:
    """When one action is legal: all of ``all_of``, at least one of ``any_of`` (if given), none of ``none_of``."""

    any_of: frozenset[str] = frozenset()
    all_of: frozenset[str] = frozenset()
    none_of: frozenset[str] = frozenset()

    def holds(self, tokens: frozenset[str]) -> bool:
        """Is the action legal in the business state ``tokens``?"""
        if self.any_of and self.any_of.isdisjoint(tokens):
            return False
        return self.all_of <= tokens and self.none_of.isdisjoint(tokens)

    @property
    def tokens(self) -> frozenset[str]:
        """Every token the rule names."""
        return self.any_of | self.all_of | self.none_of


@dataclass(frozen=True)
class FeatureSpec:
    """One numeric feature as the process defines it (the same meaning and scale on every channel)."""

    name: str
    meaning: str = ""
    scale: str = ""
    unknown: float = 0.0
    observed_with: frozenset[str] = frozenset()
    low: float = 0.0
    high: float = 1.0


@dataclass(frozen=True)
class StateContract:
    """Legal actions and feature presentation of one process, computed from the business-state tokens."""

    actions: tuple[str, ...]
    legal: tuple[LegalRule, ...]
    escape: int
    features: tuple[FeatureSpec, ...]
    supersedes: tuple[tuple[str, frozenset[str]], ...] = ()
    _masks: dict[frozenset[str], np.ndarray] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def legal_mask(self, tokens: frozenset[str]) -> np.ndarray:
        """The read-only mask of legal actions in the business state ``tokens`` (cached per token set)."""
        mask = self._masks.get(tokens)
        if mask is None:
            mask = np.array([rule.holds(tokens) for rule in self.legal], dtype=bool)
            if not mask.any():  # never leave the policy without a legal move
                mask[self.escape] = True
            mask.flags.writeable = False
            if len(self._masks) >= 4096:
                self._masks.clear()
            self._masks[tokens] = mask
        return mask

    def canonical(self, tokens: frozenset[str]) -> frozenset[str]:
        """``tokens`` without those a present token supersedes (the business state every channel reports)."""
        for token, superseded in self.supersedes:
            if token in tokens:
                tokens = tokens - superseded
        return tokens

    def legal_actions(self, tokens: Iterable[str]) -> tuple[str, ...]:
        """Names of the legal actions in the business state ``tokens``."""
        mask = self.legal_mask(frozenset(tokens))
        return tuple(a for a, ok in zip(self.actions, mask, strict=True) if ok)

    def feature(self, name: str) -> FeatureSpec:
        """The declaration of feature ``name`` (a KeyError names an undeclared one)."""
        for spec in self.features:
            if spec.name == name:
                return spec
        raise KeyError(f"undeclared feature {name!r}")

    def gated(self) -> tuple[FeatureSpec, ...]:
        """Features presented only in some business states (their ``observed_with`` is not empty)."""
        return tuple(s for s in self.features if s.observed_with)


def permissive(actions: tuple[str, ...], escape: int, features: tuple[str, ...]) -> StateContract:
    """The contract of a process that declares nothing: every action legal, every feature as the channel reads it."""
    return StateContract(actions, tuple(LegalRule() for _ in actions), escape, tuple(FeatureSpec(f) for f in features))


def contract_from_data(
    actions: tuple[str, ...],
    escape: str,
    legal: Mapping[str, Mapping[str, Iterable[str]]],
    features: Iterable[FeatureSpec],
    supersedes: Mapping[str, Iterable[str]] | None = None,
) -> StateContract:
    """Build a contract from plain data (``legal``: action -> {any, all, none}; unlisted actions: always legal;
    ``supersedes``: token -> the tokens it replaces)."""
    rules = []
    for action in actions:
        rule = legal.get(action, {})
        rules.append(
            LegalRule(
                frozenset(rule.get("any", ())),
                frozenset(rule.get("all", ())),
                frozenset(rule.get("none", ())),
            )
        )
    replaced = tuple((token, frozenset(old)) for token, old in (supersedes or {}).items())
    return StateContract(actions, tuple(rules), actions.index(escape), tuple(features), replaced)
