"""Stress validation rollouts (docs/design.md §2.2, Phase 3): E greedy episodes on a stratified catalogue sample.

The sample is *stratified*: every env family and every value of every variant dimension is in
it (a greedy set cover first), and the rest is filled round-robin over the catalogue's cells
(family × dimension combination), so the long tail of the catalogue is not left to chance.
Episodes run through an env pool (in-process or Ray, same :class:`PoolBatch` contract); with a
``round_robin`` scheduler every sampled variant gets an equal share of the episodes.

Crashes are data, not exceptions: an episode the pool closes with ``env_crash``, ``env_timeout``,
``env_invalid`` or ``worker_lost`` is recorded like any other and counted (the phase's exit
condition is zero of them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from agentflow_core.contracts import EnvPool, PolicyFn, PoolBatch
from agentflow_core.evaluation.records import EpisodeRecord, StepRecord
from agentflow_core.semantics import Vocabulary


class VariantRow(Protocol):
    """What the evaluation needs of a catalogue variant (``VariantSpec`` satisfies it)."""

    @property
    def env_id(self) -> str:
        """Unique id of the variant in the catalogue."""

    @property
    def family(self) -> str:
        """Base env family the variant perturbs; results are stratified by it."""

    @property
    def params(self) -> Mapping[str, Any]:
        """Dimension values the variant was built from; results are stratified by these too."""


V = TypeVar("V", bound=VariantRow)


class RewardFn(Protocol):
    """Shaped training reward over a pool (``agentflow_core.rl.reward.RewardFunction``)."""

    def reset(self, obs: np.ndarray) -> None:
        """Start of a new episode in every slot, from the first observations."""

    def step(self, batch: PoolBatch) -> Any:
        """Reward parts for one pool step (``.total`` is the training reward)."""


@dataclass(frozen=True)
class RiskRule:
    """docs/design-003.md §2.2: a step whose risk exceeds ``threshold`` costs ``penalty`` in the evaluated return."""

    threshold: float = 0.3
    penalty: float = 1.0


@dataclass
class StressRollout:
    """Everything the stress phase measured: step and episode records plus pool counters."""

    steps: list[StepRecord]
    episodes: list[EpisodeRecord]
    pool_steps: int
    variants: list[str] = field(default_factory=list)

    @property
    def crash_episodes(self) -> int:
        """Episodes ended by an env crash rather than by the process."""
        return sum(e.crashed for e in self.episodes)


def _strata(variant: VariantRow, dimensions: Sequence[str]) -> set[tuple[str, str]]:
    return {("family", variant.family)} | {(d, str(variant.params.get(d))) for d in dimensions}


def stratified_sample(variants: Sequence[V], n: int, dimensions: Sequence[str], rng: np.random.Generator) -> list[V]:
    """``n`` variants covering every family and every dimension value, then balanced over cells.

    A greedy set cover over the strata ``(dimension, value)`` comes first (at most a handful of
    variants), then round-robin over the cells (family × dimension combination) in a random
    order, drawing each cell's variants in a random order. ``n >= len(variants)`` returns all.
    """
    if n >= len(variants):
        return list(variants)
    order = [variants[i] for i in rng.permutation(len(variants))]
    strata = [_strata(v, dimensions) for v in order]
    uncovered = set().union(*strata)
    chosen: list[int] = []
    while uncovered and len(chosen) < n:
        best = max(range(len(order)), key=lambda i: len(strata[i] & uncovered))
        chosen.append(best)
        uncovered -= strata[best]
    taken = set(chosen)
    cells: dict[tuple[Any, ...], list[int]] = {}
    for i, v in enumerate(order):
        if i not in taken:
            cells.setdefault((v.family, *(str(v.params.get(d)) for d in dimensions)), []).append(i)
    queues = list(cells.values())
    while len(chosen) < n and queues:
        for queue in queues:
            if len(chosen) >= n:
                break
            chosen.append(queue.pop())
        queues = [q for q in queues if q]
    return [order[i] for i in chosen]


@dataclass
class _Slot:
    """The episode a pool slot is playing."""

    episode_id: str
    variant: VariantRow
    initial_features: dict[str, float]
    steps: list[StepRecord] = field(default_factory=list)


def _variant_of(
    info: Mapping[str, Any], key: str, variants: Sequence[VariantRow], by_id: Mapping[str, VariantRow], id_key: str
) -> VariantRow:
    index = info.get(key)
    if index is not None and 0 <= int(index) < len(variants) and variants[int(index)].env_id == info.get(id_key):
        return variants[int(index)]
    return by_id[str(info[id_key])]


def run_stress_episodes(
    pool: EnvPool,
    policy_fn: PolicyFn,
    variants: Sequence[VariantRow],
    episodes: int,
    *,
    seed: int = 0,
    reward_fn: RewardFn | None = None,
    risk: RiskRule = RiskRule(),
    on_progress: Callable[[int, int], None] | None = None,
) -> StressRollout:
    """Run ``policy_fn`` until ``episodes`` episodes have finished; record every step of them.

    ``variants`` is the list the pool was built from (``info["variant_index"]`` indexes it).
    Episodes still running when the count is reached are dropped (their steps too), so each
    record is a complete episode. ``reward_fn`` (optional) supplies the shaped reward per step.
    """
    by_id = {v.env_id: v for v in variants}
    vocabulary = pool.vocabulary
    decode_features, decode_tokens = vocabulary.decode_features, vocabulary.decode_tokens
    batch = pool.reset(seed)
    if reward_fn is not None:
        reward_fn.reset(batch.obs)
    counters = [0] * pool.num_envs
    slots = [
        _Slot(
            f"{seed}-{i}-0",
            _variant_of(info, "variant_index", variants, by_id, "env_id"),
            decode_features(batch.obs[i]),
        )
        for i, info in enumerate(batch.infos)
    ]
    finished: list[EpisodeRecord] = []
    steps: list[StepRecord] = []
    pool_steps = 0
    while len(finished) < episodes:
        obs, mask = batch.obs, batch.action_mask
        actions = np.asarray(policy_fn(obs, mask), dtype=np.int64).reshape(pool.num_envs)
        batch = pool.step(actions)
        pool_steps += 1
        shaped = reward_fn.step(batch).total if reward_fn is not None else batch.reward
        done = np.asarray(batch.terminated, bool) | np.asarray(batch.truncated, bool)
        for i, info in enumerate(batch.infos):
            if batch.pending is not None and batch.pending[i]:  # no step happened in this slot
                continue
            slot = slots[i]
            slot.steps.append(
                StepRecord(
                    slot.episode_id,
                    slot.variant.env_id,
                    slot.variant.family,
                    slot.variant.params,
                    int(info.get("step_id", len(slot.steps) + 1)),
                    decode_tokens(obs[i]),
                    int(info.get("action", actions[i])),  # a step that was pending: its own action
                    frozenset(info.get("tokens", ())),
                    float(batch.reward[i]),
                    float(shaped[i]),
                    float(info.get("risk", 0.0)),
                    bool(batch.terminated[i]),
                    bool(batch.truncated[i]),
                    info.get("failure_reason"),
                )
            )
            if not done[i]:
                continue
            if len(finished) < episodes:
                finished.append(_close(slot, info, risk, vocabulary))
                steps.extend(slot.steps)
            counters[i] += 1
            slots[i] = _Slot(
                f"{seed}-{i}-{counters[i]}",
                _variant_of(info, "next_variant_index", variants, by_id, "next_env_id")
                if "next_env_id" in info
                else slot.variant,
                decode_features(batch.obs[i]),
            )
        if on_progress is not None:
            on_progress(len(finished), episodes)
    return StressRollout(steps, finished, pool_steps, sorted({e.env_id for e in finished}))


def _close(slot: _Slot, info: Mapping[str, Any], risk: RiskRule, vocabulary: Vocabulary) -> EpisodeRecord:
    records = slot.steps
    env_return = float(info.get("episode_return", sum(s.reward for s in records)))
    risky = sum(s.risk > risk.threshold for s in records)
    reason = info.get("failure_reason")
    path = [s.tokens for s in records]
    reached = any(vocabulary.goal in t for t in path)
    paid = bool(info.get("success", reached and records[-1].terminated))
    success = paid or vocabulary.process_success(slot.variant.params, path[-1] if path else (), records[-1].terminated)
    return EpisodeRecord(
        episode_id=slot.episode_id,
        env_id=slot.variant.env_id,
        family=slot.variant.family,
        params=slot.variant.params,
        length=int(info.get("episode_length", len(records))),
        env_return=env_return,
        shaped_return=float(sum(s.shaped_reward for s in records)),
        evaluated_return=env_return - risk.penalty * risky,
        reached_goal=reached,
        success=success,
        failure_reason=reason,
        risky_steps=risky,
        token_path=path,
        initial_features=slot.initial_features,
        business_value=info.get("business_value"),
    )
