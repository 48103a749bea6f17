"""One mapping's compiled step, specialised once and shared by every adapter built from that mapping.

:class:`StepPlan` holds what :meth:`BaseSemanticAdapter._compile` made of a mapping's rules (the
per-step readers, the rule bits, the feature plan) and runs the step. A step reads every value the
rules and features need in one call (a template's :meth:`~BaseSemanticAdapter.compile_values`, or
the readers one by one), then looks the whole outcome up by those values: the token set, the sorted
tokens, the mask, the rules' feature values and the vector without its context features are computed
once per distinct key and kept. What is left per step is the read, one dict lookup, one vector copy
and the context features (``step_fraction``).

The key is the values *and their types*: ``1``, ``1.0``, ``True`` and ``np.int64(1)`` are one dict
key, but a numeric rule reads ``np.int64(1)`` as no number and a string comparison reads ``str(1.0)``
as ``"1.0"``, so each type keys its own entry. Only values of plain scalar types (``str``, ``int``,
``float`` but NaN and zero, ``bool``, ``None``, the templates' own absent marker, and tuples and
frozensets of strings: a page's element names) are kept; anything else
(a list, a numpy scalar, a row object) is evaluated afresh on every step, as is every step of a
template whose predicates may read the raw observation itself (``memo`` off).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from agentflow_core.adapters.compiled import AdaptedStep, Predicate, Reader, Table, rule_bits
from agentflow_core.semantics import Vocabulary

FLOAT32_SAFE = 3.0e38  # |x| below this stays finite as float32; beyond it the exact numpy check runs
CACHE_LIMIT = 4096  # distinct token sets / masks / value keys kept per mapping (a few hundred occur in practice)
_KEPT_TYPES = frozenset({str, int, float, bool, type(None), object})  # object: the templates' absent markers

# (block index, reader index, value -> number or None (None: the value as read), scale, default, clip low, high)
FeatureRead = tuple[int, int, Callable[[Any], Any] | None, float, float, Any, Any]
# (tokens, sorted tokens, vector without context features, mask, the rules' feature values, vector finite)
Outcome = tuple[frozenset[str], tuple[str, ...], np.ndarray, np.ndarray, tuple[float, ...], bool]
# (tokens, sorted tokens, multi-hot block, legal mask, features presented as unknown) per token set
TokenEntry = tuple[frozenset[str], tuple[str, ...], np.ndarray, np.ndarray, tuple[tuple[int, int, float], ...]]
Rules = tuple[tuple[Table, ...], tuple[tuple[Predicate, int], ...]]


class StepPlan:
    """A mapping's step: reads, rule bits, features and their outcome cached per distinct read values."""

    def __init__(
        self,
        vocabulary: Vocabulary,
        readers: Sequence[Reader],
        read_all: Callable[[Any], list[Any]] | None,
        tokens: Rules,
        mask: tuple[int, Rules],
        process_masks: bool,
        features: tuple[FeatureRead, ...],
        feature_names: tuple[str, ...],
        unobservable: tuple[str, ...],
        memo: bool,
    ) -> None:
        self.vocabulary, self.contract = vocabulary, vocabulary.state_contract
        self._readers = tuple(readers)
        self.read_all: Callable[[Any], list[Any]] = read_all or self._read_each
        self._token_rules, self._mask_rules, self._features = tokens, mask, features
        self._process_masks = process_masks  # False: the channel's own mask (a vocabulary without a contract)
        self.feature_names, self._unobservable = feature_names, unobservable
        self._n_tokens, self._n_actions = vocabulary.n_tokens, vocabulary.n_actions
        self._escape = vocabulary.action_id(vocabulary.escape_action)
        self._token_index, feature_index = vocabulary.token_index(), vocabulary.feature_index()
        self._feature_index = feature_index
        # Clip bounds a float32 cannot hold leave the finiteness of the vector to the exact numpy check.
        self._wide_clip = not all(-FLOAT32_SAFE <= b <= FLOAT32_SAFE for *_, lo, hi in features for b in (lo, hi))
        written = {feature_index[name] for name in feature_names}  # a rule's or the process's value wins
        self._context_slots = {n: self._n_tokens + i for n, i in feature_index.items() if i not in written}
        self._memo_on = memo
        self._memo: dict[tuple[Any, ...], Outcome] = {}
        self._token_cache: dict[int, TokenEntry] = {}
        self._mask_cache: dict[int, np.ndarray] = {}

    def _read_each(self, raw: Any) -> list[Any]:
        return [read(raw) for read in self._readers]

    def step(self, raw: Any, context: Mapping[str, float] | None) -> AdaptedStep:
        """The adapted step of ``raw`` (what ``BaseSemanticAdapter.adapt_step`` returns with DEBUG off)."""
        values = self.read_all(raw)
        outcome = None
        if self._memo_on:
            read = values[1:]  # values[0] is the raw observation itself
            key: tuple[Any, ...] | None = (*read, *map(type, read))
            try:
                outcome = self._memo.get(key)  # type: ignore[arg-type]
            except TypeError:  # an unhashable value (a list, a row): evaluated afresh
                key = None
            if outcome is None:
                outcome = self._outcome(values, key)
        else:
            outcome = self._outcome(values, None)
        tokens, ordered, base, mask, rule_values, finite = outcome
        vec = base if base.flags.writeable else base.copy()
        if context:
            slots, wide = self._context_slots, False
            for name, value in context.items():
                slot = slots.get(name)
                if slot is None:
                    self._feature_index[name]  # an unknown name is a KeyError, as in encode()
                    continue
                vec[slot] = value
                if not -FLOAT32_SAFE <= value <= FLOAT32_SAFE:
                    wide = True
            if wide and finite:
                finite = bool(np.isfinite(vec).all())
        return AdaptedStep(vec, mask, tokens, ordered, finite, context, self.feature_names, rule_values)

    def _outcome(self, values: list[Any], key: tuple[Any, ...] | None) -> Outcome:
        """Rules and features evaluated on one step's values; kept under ``key`` when every value is a plain scalar."""
        bits = rule_bits(0, *self._token_rules, values)
        tokens, ordered, block, legal, hidden = self._token_cache.get(bits) or self._token_entry(bits)
        features = [0.0] * (len(self._feature_index))
        finite = not self._wide_clip
        rule_values: list[float] = []
        for index, reader, convert, scale, default, lo, hi in self._features:
            found = values[reader] if convert is None else convert(values[reader])
            value = default if found is None else float(found) * scale
            if value - value == 0.0:  # finite (inf - inf and nan - nan are nan); min(max(value, lo), hi):
                if value < lo:
                    value = lo
                if value > hi:
                    value = hi
            else:
                finite = False
            rule_values.append(value)
            features[index] = value
        if hidden:
            rule_values.extend(0.0 for _ in self._unobservable)
            for position, index, unknown in hidden:
                rule_values[position] = features[index] = unknown
        base = block.copy()
        base[self._n_tokens :] = features
        if not finite:
            finite = bool(np.isfinite(base).all())
        mask = legal if self._process_masks else self.channel_mask(values)
        outcome = (tokens, ordered, base, mask, tuple(rule_values), finite)
        if key is not None and _keepable(values):
            base.flags.writeable = False  # kept: every step copies it
            if len(self._memo) >= CACHE_LIMIT:
                self._memo.clear()
            self._memo[key] = outcome
        return outcome

    def _token_entry(self, bits: int) -> TokenEntry:
        tokens = self.contract.canonical(frozenset(t for i, t in enumerate(self.vocabulary.tokens) if bits >> i & 1))
        block = np.zeros(self.vocabulary.obs_dim, dtype=np.float32)
        block[[self._token_index[t] for t in tokens]] = 1.0
        block.flags.writeable = False
        if len(self._token_cache) >= CACHE_LIMIT:
            self._token_cache.clear()
        mask = self.contract.legal_mask(tokens)
        entry = self._token_cache[bits] = (tokens, tuple(sorted(tokens)), block, mask, self._hidden(tokens))
        return entry

    def _hidden(self, tokens: frozenset[str]) -> tuple[tuple[int, int, float], ...]:
        """(position among the step's feature values, block index, presented value) of every feature the
        process presents as unknown in this business state: unobservable on this channel, or gated off."""
        out = []
        for position, name in enumerate(self.feature_names):
            spec = self.contract.feature(name)
            if name in self._unobservable or (spec.observed_with and spec.observed_with.isdisjoint(tokens)):
                out.append((position, self._feature_index[name], spec.unknown))
        return tuple(out)

    def channel_mask(self, values: list[Any]) -> np.ndarray:
        """What the channel could issue on these values (read-only): mapped and available, ESCALATE if nothing is."""
        always, (tables, plan) = self._mask_rules
        bits = rule_bits(always, tables, plan, values)
        mask = self._mask_cache.get(bits)
        if mask is None:
            mask = np.zeros(self._n_actions, dtype=bool)
            mask[[a for a in range(self._n_actions) if bits >> a & 1]] = True
            if not bits:  # never leave the policy without a legal move
                mask[self._escape] = True
            mask.flags.writeable = False
            if len(self._mask_cache) >= CACHE_LIMIT:
                self._mask_cache.clear()
            self._mask_cache[bits] = mask
        return mask


def _keepable(values: list[Any]) -> bool:
    """May an outcome be reused for equal values of the same types? Plain scalars, and no float NaN (never
    equal to itself) or zero (``-0.0 == 0.0``, but the sign reaches the vector and ``str``)."""
    for value in values[1:]:
        kind = value.__class__
        if kind not in _KEPT_TYPES or (kind is float and (value != value or value == 0.0)):
            if (kind is tuple or kind is frozenset) and all(item.__class__ is str for item in value):
                continue  # a page's elements: equal only when every name is equal
            return False
    return True
