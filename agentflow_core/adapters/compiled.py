"""The compiled adapter engine's step record and its small hot-path helpers (see ``adapters/base.py``).

:class:`AdaptedStep` is what one raw observation becomes after the compiled rules; the helpers OR
precomputed rule bits (:func:`rule_bits`) and unroll small ``all``/``any`` combinators.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from agentflow_core.semantics import SemanticObs

Predicate = Callable[[list[Any]], Any]  # over one step's reader values (see BaseSemanticAdapter.reader)
Reader = Callable[[Any], Any]  # raw observation -> one value

Table = tuple[int, dict[Any, int], tuple[tuple[Predicate, int], ...]]  # (reader index, key -> bits, members)


def identity(raw: Any) -> Any:
    """The reader of ``values[0]``: the raw observation itself."""
    return raw


def dispatchable(key: Any) -> bool:
    """Can a dict lookup stand in for ``value == key``? (hashable, and not NaN, which a dict finds by identity)"""
    try:
        hash(key)
    except TypeError:
        return False
    return not (isinstance(key, float) and key != key)


def fire(members: tuple[tuple[Predicate, int], ...], values: list[Any]) -> int:
    """The OR of the bits of every member whose predicate holds (the unhashable-value path of a table)."""
    bits = 0
    for predicate, member_bits in members:
        if predicate(values):
            bits |= member_bits
    return bits


class AdaptedStep:
    """One raw observation through the compiled rules: what the env hands the policy.

    ``vec`` is a fresh float32 vector; ``mask`` a shared read-only array (copy it to mutate);
    ``tokens``/``ordered`` the active tokens as a frozenset and sorted tuple (both shared);
    ``finite`` whether ``vec`` is all finite. ``obs`` builds the :class:`SemanticObs` on demand, so
    a step that nobody inspects pays for no feature dict.
    """

    __slots__ = ("vec", "mask", "tokens", "ordered", "finite", "_context", "_names", "_values", "_obs")

    def __init__(
        self,
        vec: np.ndarray,
        mask: np.ndarray,
        tokens: frozenset[str],
        ordered: tuple[str, ...],
        finite: bool,
        context: Mapping[str, float] | None,
        names: tuple[str, ...],
        values: Sequence[float],
        obs: SemanticObs | None = None,
    ) -> None:
        self.vec, self.mask, self.tokens, self.ordered, self.finite = vec, mask, tokens, ordered, finite
        self._context, self._names, self._values, self._obs = context, names, values, obs

    @property
    def obs(self) -> SemanticObs:
        """The same SemanticObs ``adapt_observation`` returns (features: context first, then rules)."""
        if self._obs is None:
            features: dict[str, float] = dict(self._context) if self._context else {}
            features.update(zip(self._names, self._values, strict=True))
            self._obs = SemanticObs(self.tokens, features)
        return self._obs


def rule_bits(bits: int, tables: Sequence[Table], plan: Sequence[tuple[Predicate, int]], values: list[Any]) -> int:
    """``bits`` OR the bits of every rule that fires on the step's reader values: keyed rules by one
    table lookup per reader, the rest by their predicates (the compiled plan of :meth:`_plan`)."""
    for index, table, members in tables:
        try:
            bits |= table.get(values[index], 0)
        except TypeError:  # an unhashable value: decide each member on its own
            bits |= fire(members, values)
    for predicate, rule_bits in plan:
        if predicate(values):
            bits |= rule_bits
    return bits


def conjunction(subs: tuple[Predicate, ...]) -> Predicate:
    """``all`` without a generator per call: the common 1-3 term cases unrolled (a step-time hot path)."""
    if len(subs) == 1:
        return subs[0]
    if len(subs) == 2:
        a, b = subs
        return lambda values: a(values) and b(values)
    if len(subs) == 3:
        a, b, c = subs
        return lambda values: a(values) and b(values) and c(values)
    return lambda values: all(p(values) for p in subs)


def disjunction(subs: tuple[Predicate, ...]) -> Predicate:
    """``any``, unrolled like :func:`_conjunction`."""
    if len(subs) == 1:
        return subs[0]
    if len(subs) == 2:
        a, b = subs
        return lambda values: a(values) or b(values)
    return lambda values: any(p(values) for p in subs)
