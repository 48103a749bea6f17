"""One stress analysis from the rollout records, and the phase's exit metric ``robustness_score``.

``robustness_score = success_rate × consistency × (1 − crash_rate)``

* ``success_rate`` -- share of episodes with the business outcome (the process's goal token, or a
  handled ending it declares, such as checkout's escalation of a blocked user);
* ``consistency`` -- mean off-diagonal agreement of greedy actions on the canonical probes of K
  variants, every feature and dimension varied (:mod:`agentflow_core.evaluation.consistency`);
  ``consistency_random`` is a uniformly random policy's score on the same probe states, its floor;
* ``crash_rate`` -- share of episodes closed by env_crash / env_timeout / env_invalid / worker_lost.

Each factor is in [0, 1], so the score is too, and any one of them at zero zeroes it: a policy
that succeeds but behaves differently per variant, or an env set that crashes, cannot score high.
The phase passes when ``robustness_score >= min_robustness``, ``consistency >= consistency_target``
and ``crash_rate <= max_crash_rate`` (``agentflow_core.gates.stress_checks``, all three).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from agentflow_core.config import StressConfig
from agentflow_core.evaluation.consistency import (
    CANONICAL_STATES,
    DEFAULT_CART_SCALE,
    CanonicalState,
    ConsistencyResult,
    MatchedConsistency,
    canonical_consistency,
    covering_variants,
    matched_state_consistency,
    per_variant_rows,
    random_policy,
)
from agentflow_core.evaluation.hacking import HackingReport, reward_hacking
from agentflow_core.evaluation.records import EpisodeRecord, PolicyFn
from agentflow_core.evaluation.risk import RiskReport, risk_report
from agentflow_core.evaluation.root_causes import RECOMMENDATIONS, RootCause, root_causes
from agentflow_core.evaluation.stress import StressRollout
from agentflow_core.evaluation.token_frequency import CoverageTable, coverage_table
from agentflow_core.gates import stress_checks
from agentflow_core.semantics import Vocabulary


def robustness_score(success_rate: float, consistency: float, crash_rate: float) -> float:
    """``success_rate × consistency × (1 − crash_rate)`` (see the module docstring)."""
    return float(success_rate * consistency * (1.0 - crash_rate))


@dataclass(frozen=True)
class StressAnalysis:
    """Every measure of one stress run; :meth:`to_dict` is the JSON the report is built from."""

    metrics: dict[str, Any]
    by_family: dict[str, dict[str, float]]
    coverage: CoverageTable
    consistency: ConsistencyResult
    matched: MatchedConsistency
    per_variant: list[dict[str, Any]]
    causes: list[RootCause]
    failures: int
    hacking: HackingReport
    risk: RiskReport
    recommendations: list[str]
    passed: bool
    target: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON document the stress summary and the report are built from."""
        return {
            "metrics": self.metrics,
            "passed": self.passed,
            "by_family": self.by_family,
            "coverage": self.coverage.to_dict(),
            "consistency": {
                "target": self.target,
                "canonical": self.consistency.to_dict(),
                "random_policy_score": self.metrics["consistency_random"],
                "matched_states": self.matched.to_dict(),
                "per_variant": self.per_variant,
            },
            "root_causes": {"failures": self.failures, "top": [c.to_dict() for c in self.causes]},
            "reward_hacking": self.hacking.to_dict(),
            "risk": self.risk.to_dict(),
            "recommendations": self.recommendations,
        }


def consistency_variants(
    rollout: StressRollout, sample_order: Sequence[str], k: int, dimensions: Sequence[str] = ()
) -> tuple[list[str], list[dict[str, float]], list[str]]:
    """``k`` played variants covering every family and dimension value: ids, first-observation features, families."""
    first: dict[str, EpisodeRecord] = {}
    for episode in rollout.episodes:
        first.setdefault(episode.env_id, episode)
    ids = covering_variants(rollout.episodes, sample_order, dimensions, k)
    return ids, [first[i].initial_features for i in ids], [first[i].family for i in ids]


def _by_family(episodes: Sequence[EpisodeRecord]) -> dict[str, dict[str, float]]:
    groups: dict[str, list[EpisodeRecord]] = {}
    for e in episodes:
        groups.setdefault(e.family, []).append(e)
    return {
        fam: {
            "episodes": len(eps),
            "success_rate": fmean(e.success for e in eps),
            "mean_evaluated_return": fmean(e.evaluated_return for e in eps),
            "crash_episodes": sum(e.crashed for e in eps),
        }
        for fam, eps in sorted(groups.items())
    }


def _recommendations(
    metrics: Mapping[str, Any],
    cfg: StressConfig,
    per_variant: Sequence[Mapping[str, Any]],
    causes: Sequence[RootCause],
    hacking: HackingReport,
    coverage: CoverageTable,
) -> list[str]:
    out = []
    if metrics["crash_episodes"]:
        out.append(f"{metrics['crash_episodes']} crash episode(s): {RECOMMENDATIONS['env_crash']}")
    if metrics["consistency"] < cfg.consistency_target:
        out.append(
            f"Policy consistency {metrics['consistency']:.1%} is below the {cfg.consistency_target:.0%} target: "
            "train on more variants per update (uniform/PLR scheduler) and compare the probe actions per family."
        )
    bad = [r["env_id"] for r in per_variant if r["consistent_but_bad"]]
    if bad:
        out.append(f"{len(bad)} variant(s) are consistent but bad (agree with the rest, succeed < 50%), e.g. {bad[0]}.")
    out.extend(c.recommendation for c in causes)
    if hacking.flagged:
        out.append(
            f"{hacking.flagged} episode(s) earn shaped reward >= {hacking.threshold:g} without an outcome the "
            "process accepts: cap or remove the shaping terms they farm."
        )
    if coverage.long_tail or coverage.unseen:
        rare = ", ".join((coverage.long_tail + coverage.unseen)[:4])
        out.append(f"Rare or unseen states ({rare}): oversample the variants that reach them (PLR token bonus).")
    return out or ["No action needed: no crashes, consistency on target, no failure cluster."]


def analyze_stress(
    rollout: StressRollout,
    policy_fn: PolicyFn,
    cfg: StressConfig,
    dimensions: Sequence[str],
    sample_order: Sequence[str],
    reachable: Sequence[str] | None = None,
    cart_scales: Mapping[str, float] | None = None,
    probes: Sequence[CanonicalState] = CANONICAL_STATES,
    *,
    vocabulary: Vocabulary,
) -> StressAnalysis:
    """Compute every stress measure from the rollout records (plus the canonical probes of ``policy_fn``).

    ``probes`` are the process's consistency-probe states (``ProcessSpec.probes``). A process that
    declares none (refund: the probes fix checkout's stage features) is judged on the matched-state
    consistency of the rollout itself -- agreement of the variants' modal actions on the token states
    they share -- and ``consistency_probes`` is 0 in the metrics to say so.
    """
    episodes, steps = rollout.episodes, rollout.steps
    n = max(len(episodes), 1)
    ids, features, families = consistency_variants(rollout, sample_order, cfg.consistency_variants, dimensions)
    scales = [(cart_scales or {}).get(f, DEFAULT_CART_SCALE) for f in families]
    consistency = canonical_consistency(policy_fn, ids, features, scales, probes, vocabulary=vocabulary)
    random_floor = canonical_consistency(random_policy(0), ids, features, scales, probes, vocabulary=vocabulary)
    matched = matched_state_consistency(steps)
    consistency_score = consistency.score if probes else matched.score
    per_variant = per_variant_rows(consistency, episodes, cfg.consistency_target)
    reachable = vocabulary.tokens if reachable is None else reachable
    coverage = coverage_table(steps, cfg.coverage_group, reachable, cfg.long_tail_frequency, vocabulary.tokens)
    causes, failures = root_causes(episodes, dimensions, cfg.failure_reward_threshold)
    hacking = reward_hacking(episodes, cfg.hacking_reward_threshold)
    risk = risk_report(steps, episodes, cfg.risk_threshold, cfg.risk_penalty, vocabulary.actions)
    success_rate = sum(e.success for e in episodes) / n
    crash_episodes = sum(e.crashed for e in episodes)
    metrics: dict[str, Any] = {
        "episodes": len(episodes),
        "steps": len(steps),
        "variants": len(rollout.variants),
        "success_rate": success_rate,
        "goal_success_rate": sum(e.reached_goal for e in episodes) / n,
        "crash_episodes": crash_episodes,
        "crash_rate": crash_episodes / n,
        "consistency": consistency_score,
        "consistency_probes": len(probes),
        "consistency_random": random_floor.score,
        "consistency_variants": len(ids),
        "matched_state_consistency": matched.score,
        "robustness_score": robustness_score(success_rate, consistency_score, crash_episodes / n),
        "mean_env_return": fmean(e.env_return for e in episodes) if episodes else 0.0,
        "mean_evaluated_return": fmean(e.evaluated_return for e in episodes) if episodes else 0.0,
        "mean_shaped_return": fmean(e.shaped_return for e in episodes) if episodes else 0.0,
        "mean_length": fmean(e.length for e in episodes) if episodes else 0.0,
        "failure_episodes": failures,
        "failure_rate": failures / n,
        "state_coverage": coverage.state_coverage,
        "hacking_flagged": hacking.flagged,
        "risky_steps": risk.risky_steps,
        "risk_rate": risk.rate,
    }
    recommendations = _recommendations(metrics, cfg, per_variant, causes, hacking, coverage)
    passed = all(check.holds(float(metrics[check.metric])) for check in stress_checks(cfg))
    return StressAnalysis(
        metrics,
        _by_family(episodes),
        coverage,
        consistency,
        matched,
        per_variant,
        causes,
        failures,
        hacking,
        risk,
        recommendations,
        passed,
        cfg.consistency_target,
    )
