"""Roll a policy out on a pool of evaluation variants: goal and process success, returns.

Evaluations are stratified: :func:`stratified_eval_variants` draws an equal number of variants
per family, spread over every dimension value, and :func:`evaluate_policy` counts the first
``ceil(n_episodes / len(variants))`` finished episodes *of every variant* (a round-robin pool
hands variants out in order), so each family gets the same number of episodes and short
episodes (often the successful ones) are not over-represented. Two outcomes are measured per
episode: goal success (the process's goal token reached; metric keys ``goal_success``) and process
success (the goal or a handled outcome the process accepts for the variant), each overall,
per family and per dimension value with Wilson intervals. The reference policies the trained one
is judged against live here too: the exploration policy (epsilon-greedy around the untrained
policy) and the scripted experts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from agentflow_core.contracts import EnvPool, OraclePool, PolicyFn
from agentflow_core.envs.experts import ScriptedExpert, expert_for
from agentflow_core.evaluation.paired import EpisodeOutcome
from agentflow_core.evaluation.proportions import SuccessBreakdown
from agentflow_core.evaluation.stress import VariantRow, stratified_sample
from agentflow_core.evaluation.value import ValueBreakdown
from agentflow_core.pool.episodes import EpisodeRecord
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.semantics import Vocabulary

V = TypeVar("V", bound=VariantRow)


@dataclass(frozen=True)
class EvalResult:
    """Outcome of an evaluation: ``success_rate`` is goal success, ``process_success_rate`` process success."""

    episodes: int
    success_rate: float
    process_success_rate: float
    mean_return: float
    std_return: float
    mean_length: float
    goal: SuccessBreakdown
    process: SuccessBreakdown
    value: ValueBreakdown | None = None  # mean business value, when the channel prices every episode
    # per episode, keyed "<variant env_id>:<k>" (its k-th episode here): what a paired comparison pairs on
    outcomes: tuple[EpisodeOutcome, ...] = ()

    @property
    def success_by_family(self) -> dict[str, float]:
        """Goal success rate per family."""
        return {family: p.rate for family, p in self.goal.by_family.items()}

    @property
    def process_success_by_family(self) -> dict[str, float]:
        """Process success rate per family."""
        return {family: p.rate for family, p in self.process.by_family.items()}

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat numbers for a metrics sink, with per-family and per-dimension-value rates and intervals."""
        out = {
            f"{prefix}{name}": float(getattr(self, name))
            for name in ("episodes", "success_rate", "process_success_rate", "mean_return", "std_return", "mean_length")
        }
        out.update(self.goal.metrics(f"{prefix}goal_success"))
        out.update(self.process.metrics(f"{prefix}process_success"))
        if self.value is not None:
            out.update(self.value.metrics(f"{prefix}business_value"))
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON form: rates, returns and both breakdowns with their intervals."""
        return {
            "episodes": self.episodes,
            "mean_return": self.mean_return,
            "goal_success": self.goal.to_dict(),
            "process_success": self.process.to_dict(),
            "mean_length": self.mean_length,
            **({} if self.value is None else {"business_value": self.value.to_dict()}),
        }


def stratified_eval_variants(variants: Sequence[V], n: int, dimensions: Sequence[str], seed: int) -> list[V]:
    """About ``n`` variants, the same number per family, each family's share covering every dimension value.

    Families are interleaved, so a round-robin pool starts every family at once. A family with
    fewer variants than its share gives all it has.
    """
    rng = np.random.default_rng(seed)
    families = sorted({v.family for v in variants})
    per_family = -(-n // max(len(families), 1))
    shares = [
        stratified_sample([v for v in variants if v.family == family], per_family, dimensions, rng)
        for family in families
    ]
    longest = max((len(share) for share in shares), default=0)
    return [share[i] for i in range(longest) for share in shares if i < len(share)]


def evaluate_policy(
    pool: EnvPool,
    act: PolicyFn,
    n_episodes: int,
    seed: int,
    dimensions: Sequence[str] = (),
    max_pool_steps: int = 100_000,
) -> EvalResult:
    """Run ``act(obs, mask) -> actions`` until every variant finished its share of ``n_episodes``.

    The pool's scheduler state is restored afterwards, so every evaluation on a pool sees the same
    variant sequence: evaluations of different checkpoints are comparable (and a resumed run
    evaluates exactly as an uninterrupted one).
    """
    snapshot = pool.scheduler.state_dict()
    try:
        return _evaluate(pool, act, n_episodes, seed, dimensions, max_pool_steps)
    finally:
        pool.scheduler.load_state_dict(snapshot)


def _evaluate(
    pool: EnvPool, act: PolicyFn, n_episodes: int, seed: int, dimensions: Sequence[str], max_pool_steps: int
) -> EvalResult:
    variants = pool.variants
    # A variant the pool quarantines is not played again: with one episode per variant (the
    # training evaluations) its failed episode is already counted; ``max_pool_steps`` bounds the rest.
    per_variant = -(-n_episodes // max(len(variants), 1))
    counts = np.zeros(len(variants), dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    paid: list[bool] = []
    processed: list[bool] = []
    values: list[float | None] = []
    keys: list[str] = []
    played: list[VariantRow] = []
    vocabulary = pool.vocabulary
    batch = pool.reset(seed=seed)
    for _ in range(max_pool_steps):
        if (counts >= per_variant).all():
            break
        # A slot playing a variant that has its episodes pauses: its steps would be thrown away.
        active = counts[pool.slot_variants()] < per_variant
        if not active.any():  # what is left is quarantined or on no slot: nothing more can count
            break
        batch = pool.step(np.asarray(act(batch.obs, batch.action_mask), dtype=np.int64), active=active)
        for i in np.flatnonzero(batch.terminated | batch.truncated):
            info = batch.infos[i]
            v = int(info["variant_index"])
            if counts[v] >= per_variant:
                continue
            counts[v] += 1
            variant = variants[v]
            returns.append(float(info["episode_return"]))
            lengths.append(int(info["episode_length"]))
            paid.append(bool(info["success"]))
            processed.append(
                paid[-1]
                or vocabulary.process_success(
                    variant.params, vocabulary.decode_tokens(batch.final_obs[i]), bool(batch.terminated[i])
                )
            )
            values.append(info.get("business_value"))
            keys.append(f"{variant.env_id}:{counts[v] - 1}")
            played.append(variant)
    return _summary(returns, lengths, paid, processed, played, dimensions, values, keys)


def summarise_episodes(
    records: Sequence[EpisodeRecord],
    variants: Sequence[VariantRow],
    dimensions: Sequence[str] = (),
    *,
    vocabulary: Vocabulary,
) -> EvalResult:
    """The :class:`EvalResult` of evaluation episodes played worker-side (``record.variant`` indexes ``variants``).

    Process success is judged here, from each episode's final observation in ``vocabulary`` (the
    process the envs speak), as :func:`evaluate_policy` does.
    """
    played = [variants[r.variant] for r in records]
    paid = [r.paid for r in records]
    processed = [
        r.paid or vocabulary.process_success(v.params, vocabulary.decode_tokens(r.final_obs), r.terminated)
        for r, v in zip(records, played, strict=True)
    ]
    returns = [r.episode_return for r in records]
    lengths = [r.length for r in records]
    keys = [f"{v.env_id}:{r.episode}" for r, v in zip(records, played, strict=True)]
    values = [r.business_value for r in records]
    return _summary(returns, lengths, paid, processed, played, dimensions, values, keys)


def _summary(
    returns: Sequence[float],
    lengths: Sequence[int],
    paid: Sequence[bool],
    processed: Sequence[bool],
    played: Sequence[VariantRow],
    dimensions: Sequence[str],
    values: Sequence[float | None] = (),
    keys: Sequence[str] = (),
) -> EvalResult:
    families = [v.family for v in played]
    params = [v.params for v in played]
    n = len(returns)
    goal = SuccessBreakdown.of(list(paid), families, params, dimensions)
    process = SuccessBreakdown.of(list(processed), families, params, dimensions)
    return EvalResult(
        episodes=n,
        success_rate=goal.overall.rate,
        process_success_rate=process.overall.rate,
        mean_return=float(np.mean(returns)) if n else 0.0,
        std_return=float(np.std(returns)) if n else 0.0,
        mean_length=float(np.mean(lengths)) if n else 0.0,
        goal=goal,
        process=process,
        value=ValueBreakdown.of(values, families, params, dimensions) if len(values) == n else None,
        outcomes=tuple(EpisodeOutcome(k, ok, r) for k, ok, r in zip(keys, processed, returns, strict=False)),
    )


def greedy_policy(policy: ActorCritic) -> PolicyFn:
    """The trained policy's argmax legal action."""
    return lambda obs, mask: policy.act(obs, mask)


def expert_policy(pool: EnvPool, experts: Callable[[str], ScriptedExpert] = expert_for) -> PolicyFn:
    """Each slot's family's scripted expert (the pool says which variant a slot is playing).

    ``experts`` maps a family to its expert: checkout's by default, ``ProcessSpec.expert`` for a process from data.
    """
    variants = pool.variants

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        slots = pool.slot_variants()
        return np.array(
            [experts(variants[v].family).act(o, m) for v, o, m in zip(slots.tolist(), obs, mask, strict=True)],
            dtype=np.int64,
        )

    return act


def oracle_policy(pool: OraclePool) -> PolicyFn:
    """Each slot's env's own oracle action (``oracle_action()``, reading the hidden state): evaluation only."""
    return lambda obs, mask: pool.oracle_actions()
