"""Mapping audit: does a mapping file give every raw state of its channel the meaning intended?

The family module lists ``RAW_STATES`` -- one raw sample per state the channel can produce, with
the token that state should carry. Running the adapter over them finds, before any training:

* ``unmapped_raw_state``  -- a raw state no rule fires on (the policy would see only features);
* ``wrong_token``         -- the intended token is not produced;
* ``collapsed_meaning``   -- two states that mean different things read the same to the policy
  (e.g. ORDER_CANCELLED and ORDER_EXPIRED mapped to one token), or one reading asserts two
  meanings that exclude each other (the process's ``exclusive_tokens`` groups,
  :attr:`~agentflow_core.semantics.Vocabulary.exclusive`), naming the rules responsible;
* ``unproducible_token``  -- a vocabulary token no rule can emit (severity ``info``: a channel
  need not have every state);
* ``feature_disagrees``   -- a process feature no rule reads and the mapping does not declare
  unobservable, or a rule that clips a feature to other bounds than the process's range;
* ``mask_disagrees``      -- an action whose channel condition (``requires``) says otherwise than the
  process's legal actions on a raw state (the policy's mask is the process's; a channel that cannot
  carry a legal action out reports a failure, and one that would allow more is ignored).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agentflow_core.adapters.base import BaseSemanticAdapter
from agentflow_core.contracts import RegisteredEnv
from agentflow_core.errors import RegistryError
from agentflow_core.state_contract import CONTEXT_FEATURES

FindingKind = Literal[
    "unmapped_raw_state",
    "unproducible_token",
    "collapsed_meaning",
    "wrong_token",
    "feature_disagrees",
    "mask_disagrees",
]
Severity = Literal["error", "info"]
NO_RULE = "-"


def exclusive(a: str, b: str, groups: Iterable[frozenset[str]]) -> bool:
    """True when tokens ``a`` and ``b`` can never both describe one state (they share one of ``groups``)."""
    return a != b and any(a in group and b in group for group in groups)


@dataclass(frozen=True)
class AuditFinding:
    """One problem of one mapping file; ``rule`` holds the responsible rule id(s), comma-separated."""

    kind: FindingKind
    file: str
    rule: str
    detail: str
    severity: Severity = "error"

    @property
    def rule_ids(self) -> tuple[str, ...]:
        """The responsible rule ids one by one (empty when no rule is to blame)."""
        return () if self.rule == NO_RULE else tuple(self.rule.split(", "))

    def __str__(self) -> str:
        return f"{self.severity}: {self.kind}: {self.file}: rule(s) {self.rule}: {self.detail}"


@dataclass(frozen=True)
class _Reading:
    index: int
    raw: Any
    intended: str
    fired: tuple[tuple[str, tuple[str, ...]], ...]

    @property
    def tokens(self) -> frozenset[str]:
        return frozenset(t for _, emitted in self.fired for t in emitted)

    def rules_emitting(self, token: str) -> list[str]:
        return [rule_id for rule_id, emitted in self.fired if token in emitted]


def _short(raw: Any, limit: int = 160) -> str:
    text = repr(raw)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _same_raw(a: Any, b: Any) -> bool:
    """Equality that tolerates raw samples holding arrays (whose ``==`` is elementwise)."""
    try:
        return bool(a == b)
    except (TypeError, ValueError):
        return repr(a) == repr(b)


def _join(rule_ids: Iterable[str]) -> str:
    ids = list(dict.fromkeys(rule_ids))
    return ", ".join(ids) if ids else NO_RULE


def audit_mapping(adapter: BaseSemanticAdapter, raw_states: Sequence[tuple[Any, str]], file: str) -> list[AuditFinding]:
    """Audit one adapter (its loaded mapping) against labelled raw samples of its channel."""
    readings = [_Reading(i, raw, intended, tuple(adapter.explain(raw))) for i, (raw, intended) in enumerate(raw_states)]
    findings: list[AuditFinding] = []
    for r in readings:
        if not r.fired:
            findings.append(
                AuditFinding(
                    "unmapped_raw_state",
                    file,
                    NO_RULE,
                    f"RAW_STATES[{r.index}] (intended {r.intended}) matches no rule: {_short(r.raw)}",
                )
            )
        elif r.intended not in r.tokens:
            findings.append(
                AuditFinding(
                    "wrong_token",
                    file,
                    _join(rule for rule, _ in r.fired),
                    f"RAW_STATES[{r.index}] should carry {r.intended}, got {sorted(r.tokens)}: {_short(r.raw)}",
                )
            )
    findings.extend(_collapses(readings, file, adapter.vocabulary.exclusive))
    findings.extend(_feature_findings(adapter, file))
    findings.extend(_mask_findings(adapter, [raw for raw, _ in raw_states], file))
    findings.extend(
        AuditFinding("unproducible_token", file, NO_RULE, f"no rule emits {token}", severity="info")
        for token in adapter.vocabulary.tokens
        if token not in adapter.producible_tokens()
    )
    return findings


def _collapses(readings: list[_Reading], file: str, groups: Sequence[frozenset[str]]) -> list[AuditFinding]:
    """States whose distinct meanings the policy cannot tell apart, once per pair of meanings."""
    found: dict[frozenset[str], AuditFinding] = {}
    mapped = [r for r in readings if r.fired]
    for r in mapped:
        # one reading asserting two meanings that exclude each other: the rules emitting them clash
        for t1, t2 in sorted((t1, t2) for t1 in r.tokens for t2 in r.tokens if t1 < t2 and exclusive(t1, t2, groups)):
            if frozenset((t1, t2)) not in found:
                found[frozenset((t1, t2))] = AuditFinding(
                    "collapsed_meaning",
                    file,
                    _join(r.rules_emitting(t1) + r.rules_emitting(t2)),
                    f"RAW_STATES[{r.index}] ({r.intended}) reads as both {t1} and {t2}: {sorted(r.tokens)}",
                )
    for a in mapped:
        for b in mapped:
            pair = frozenset((a.intended, b.intended))
            if a.index >= b.index or len(pair) < 2 or pair in found:
                continue
            both_shown = (
                a.intended in a.tokens and b.intended in a.tokens and not exclusive(a.intended, b.intended, groups)
            )
            if a.tokens == b.tokens and not both_shown and not _same_raw(a.raw, b.raw):
                # Identical readings of different raw states: every rule firing on either is to blame.
                found[pair] = AuditFinding(
                    "collapsed_meaning",
                    file,
                    _join([rule for rule, _ in a.fired] + [rule for rule, _ in b.fired]),
                    f"RAW_STATES[{a.index}] ({a.intended}) and RAW_STATES[{b.index}] ({b.intended}) both read as {sorted(a.tokens)}",
                )
                continue
            for x, y in ((a, b), (b, a)):
                # x lost its own meaning and shows y's instead: the rules emitting y's token collapse them.
                if x.intended not in x.tokens and y.intended in x.tokens and y.intended in y.tokens:
                    found[pair] = AuditFinding(
                        "collapsed_meaning",
                        file,
                        _join(x.rules_emitting(y.intended) + y.rules_emitting(y.intended)),
                        f"RAW_STATES[{x.index}] ({x.intended}) and RAW_STATES[{y.index}] ({y.intended}) both map to {y.intended}",
                    )
                    break
    return list(found.values())


def _feature_findings(adapter: BaseSemanticAdapter, file: str) -> list[AuditFinding]:
    """Process features the mapping neither reads nor declares unobservable; clip bounds off the process's range."""
    findings = []
    read = {r["feature"] for r in adapter.feature_rules} | set(adapter.unobservable) | CONTEXT_FEATURES
    for spec in adapter.contract.features:
        if spec.name not in read:
            detail = f"feature {spec.name}: no rule reads it and the mapping does not declare it unobservable"
            findings.append(AuditFinding("feature_disagrees", file, NO_RULE, detail))
    for rule in adapter.feature_rules:
        spec = adapter.contract.feature(rule["feature"])
        low, high = rule.get("clip", (0.0, 1.0))
        if (low, high) != (spec.low, spec.high):
            detail = (
                f"feature {spec.name}: clipped to [{low}, {high}], the process's range is [{spec.low}, {spec.high}]"
            )
            findings.append(AuditFinding("feature_disagrees", file, rule["id"], detail))
    return findings


def _mask_findings(adapter: BaseSemanticAdapter, raws: Sequence[Any], file: str) -> list[AuditFinding]:
    """Actions whose channel condition (``requires``) disagrees with the process's legal actions, once per action."""
    if not adapter.process_masks:  # the process declares no legal actions: nothing to disagree with
        return []
    conditioned = {a for a, native in adapter.native_actions.items() if "requires" in native}
    found: dict[int, AuditFinding] = {}
    for index, raw in enumerate(raws):
        tokens = adapter.reference_observation(raw).tokens
        legal, channel = adapter.contract.legal_mask(tokens), adapter.reference_channel_mask(raw)
        for action in sorted(conditioned - set(found)):
            if legal[action] != channel[action]:
                name = adapter.vocabulary.actions[action]
                says = "legal" if legal[action] else "not legal"
                detail = f"action {name}: the process says {says} in {sorted(tokens)}, the channel says otherwise"
                found[action] = AuditFinding(
                    "mask_disagrees", file, f"actions.{name}", f"RAW_STATES[{index}]: {detail}"
                )
    return list(found.values())


def raw_states_of(entry: RegisteredEnv) -> list[tuple[Any, str]]:
    """The labelled raw samples of an entry's family module (``RAW_STATES``), or of its channel document's ``audit``."""
    module_name = entry.class_path.partition(":")[0]
    module = importlib.import_module(module_name)
    states = getattr(module, "RAW_STATES", None)
    spec = entry.kwargs.get("spec")
    if states is None and spec is not None:  # a channel written as data labels its samples in its document
        states = getattr(module, entry.class_path.partition(":")[2]).raw_states(spec)
    if not states:
        raise RegistryError(entry.source_file, f"family module {module_name!r} defines no RAW_STATES to audit against")
    return list(states)


def audit_entry(entry: RegisteredEnv) -> list[AuditFinding]:
    """Audit a registered env's mapping against its family's raw states."""
    adapter = entry.build_adapter()
    return audit_mapping(adapter, raw_states_of(entry), entry.mapping_path)


def errors_only(findings: Iterable[AuditFinding]) -> list[AuditFinding]:
    """The findings that should fail a check (everything but ``info``)."""
    return [f for f in findings if f.severity == "error"]
