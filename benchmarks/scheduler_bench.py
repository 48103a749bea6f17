"""Scheduler benchmark: coverage and learning speed of each strategy on a synthetic learner.

The learner is seeded and has no policy network: variant ``i`` succeeds with probability
``p_i = 1 - exp(-visits_i / k_i)``, where ``k_i`` is a per-variant difficulty drawn log-uniformly
from ``difficulty``. Each round draws ``draws_per_round`` variants (one pool autoreset round),
plays one episode on each, and reports it to the scheduler. Every strategy sees the same learner
(same difficulties, same per-episode random numbers per round), so differences are the schedule's.

Metrics (all four strategies measured identically, from outside the scheduler):

- ``cold_share``: fraction of draws that land on a variant whose heat is below ``cold_threshold``
  at draw time. Heat is tracked by the benchmark with the docs/design.md §2.1 rule (``h <- decay*h + 1``
  per round drawn, ``decay*h`` otherwise; heat before the round's update), whatever the strategy.
- ``max_visit_gap_over_n``: the longest stretch of draws between two consecutive visits of any one
  variant -- counting the stretch before its first visit and after its last -- divided by the
  catalogue size. Round-robin scores 1; a starved variant scores ``draws / n``.
- ``draws_to_90pct``: draws until 90% of variants have true success probability ``p_i`` at or
  above ``success_threshold`` (measured at the end of each round); ``None`` if never reached.
- ``*_vs_round_robin``: the strategy's value divided by round-robin's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from agentflow_core.config import PoolConfig
from agentflow_core.pool.scheduler import EpisodeStats, HeatTracker
from agentflow_core.pool.strategies import STRATEGIES, make_scheduler

N_SIGNATURE_TOKENS = 24
TARGETS = {"cold_share_vs_round_robin": 3.0, "max_visit_gap_over_n": 5.0, "draws_to_90pct_vs_round_robin": 1.0}


def _learner(n_variants: int, difficulty: tuple[float, float], seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-variant difficulty ``k_i`` and a long-tail "signature" token reached on success."""
    rng = np.random.default_rng(seed)
    k = np.exp(rng.uniform(np.log(difficulty[0]), np.log(difficulty[1]), n_variants))
    zipf = 1.0 / np.arange(1, N_SIGNATURE_TOKENS + 1)
    signature = rng.choice(N_SIGNATURE_TOKENS, size=n_variants, p=zipf / zipf.sum())
    return k, signature


def run_strategy(
    strategy: str,
    *,
    n_variants: int,
    draws: int,
    draws_per_round: int,
    seed: int,
    cfg: PoolConfig,
    difficulty: tuple[float, float],
    success_threshold: float,
) -> dict[str, Any]:
    """Play ``draws`` synthetic episodes under one strategy; returns its raw metrics."""
    k, signature = _learner(n_variants, difficulty, seed)
    quota = k * np.log(1.0 / (1.0 - success_threshold))  # visits needed for p_i >= threshold
    scheduler = make_scheduler(strategy, n_variants, np.random.default_rng(seed + 1), cfg)
    outcome_rng = np.random.default_rng(seed + 2)
    tracker = HeatTracker(n_variants, cfg.heat_decay, cfg.cold_threshold)
    visits = np.zeros(n_variants, dtype=np.int64)
    last_visit = np.zeros(n_variants, dtype=np.int64)
    max_gap, cold_draws, done, draws_to_90 = 0, 0, 0, None
    started = time.perf_counter()
    while done < draws:
        n = min(draws_per_round, draws - done)
        idx = scheduler.sample(n)
        cold_draws += int((tracker.values()[idx] < cfg.cold_threshold).sum())
        tracker.advance(idx)
        position = done + 1 + np.arange(n)
        for j, i in enumerate(idx):  # repeats within a round are rare; keep gaps exact
            max_gap = max(max_gap, int(position[j] - last_visit[i]))
            last_visit[i] = position[j]
        p = 1.0 - np.exp(-visits[idx] / k[idx])
        success = outcome_rng.random(n) < p
        np.add.at(visits, idx, 1)
        for i, ok in zip(idx.tolist(), success.tolist(), strict=True):
            tokens = frozenset({"PAYMENT_SUCCESS", f"SIG_{signature[i]}"}) if ok else frozenset({"PAYMENT_FAILED"})
            scheduler.update(
                i,
                EpisodeStats(
                    return_=10.0 if ok else -1.0,
                    success=ok,
                    length=10,
                    failure_reason=None if ok else "max_steps",
                    tokens=tokens,
                ),
            )
        done += n
        if draws_to_90 is None and np.mean(visits >= quota) >= 0.9:
            draws_to_90 = done
    max_gap = max(max_gap, int((draws + 1 - last_visit).max()))
    return {
        "cold_share": cold_draws / draws,
        "max_visit_gap_over_n": max_gap / n_variants,
        "draws_to_90pct": draws_to_90,
        "solved_fraction": float(np.mean(visits >= quota)),
        "variants_never_visited": int((visits == 0).sum()),
        "seconds": time.perf_counter() - started,
    }


def _ratio(value: float | None, baseline: float | None) -> float | None:
    if value is None or baseline is None:
        return None
    return float(value / baseline) if baseline else float("inf")


def run_scheduler_bench(
    n_variants: int = 1000,
    draws: int = 100_000,
    draws_per_round: int = 64,
    seed: int = 0,
    strategies: Sequence[str] = STRATEGIES,
    cfg: PoolConfig | None = None,
    difficulty: tuple[float, float] = (1.0, 30.0),
    success_threshold: float = 0.9,
) -> dict[str, Any]:
    """Run every strategy on the same synthetic learner; returns metrics, ratios and target checks.

    ``draws_per_round`` sets the heat clock (one round per ``sample`` call); keep
    ``n_variants / draws_per_round`` near 16 when scaling down so "cold" means the same thing.
    """
    cfg = cfg or PoolConfig()
    names = list(dict.fromkeys(["round_robin", *strategies]))
    results = {
        name: run_strategy(
            name,
            n_variants=n_variants,
            draws=draws,
            draws_per_round=draws_per_round,
            seed=seed,
            cfg=cfg,
            difficulty=difficulty,
            success_threshold=success_threshold,
        )
        for name in names
    }
    baseline = results["round_robin"]
    for metrics in results.values():
        metrics["cold_share_vs_round_robin"] = _ratio(metrics["cold_share"], baseline["cold_share"])
        metrics["draws_to_90pct_vs_round_robin"] = _ratio(metrics["draws_to_90pct"], baseline["draws_to_90pct"])
    return {
        "params": {
            "n_variants": n_variants,
            "draws": draws,
            "draws_per_round": draws_per_round,
            "seed": seed,
            "difficulty": list(difficulty),
            "success_threshold": success_threshold,
            "heat_decay": cfg.heat_decay,
            "cold_threshold": cfg.cold_threshold,
        },
        "targets": dict(TARGETS),
        "strategies": {name: results[name] for name in names if name in strategies},
        "targets_met": {name: _targets_met(results[name]) for name in ("heat", "plr_coverage") if name in strategies},
    }


def _targets_met(metrics: dict[str, Any]) -> dict[str, bool]:
    cold = metrics["cold_share_vs_round_robin"]
    speed = metrics["draws_to_90pct_vs_round_robin"]
    return {
        "cold_share_vs_round_robin": cold is not None and cold >= TARGETS["cold_share_vs_round_robin"],
        "max_visit_gap_over_n": metrics["max_visit_gap_over_n"] <= TARGETS["max_visit_gap_over_n"],
        "draws_to_90pct_vs_round_robin": speed is not None and speed < TARGETS["draws_to_90pct_vs_round_robin"],
    }
