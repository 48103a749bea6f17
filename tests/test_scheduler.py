"""Variant schedulers: probabilities, heat arithmetic, PLR terms, quarantine, checkpoints, benchmark."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentflow_core.config import PoolConfig
from agentflow_core.errors import AgentFlowError
from agentflow_core.pool.scheduler import EpisodeStats, HeatTracker, Scheduler, gumbel_top_k
from agentflow_core.pool.strategies import STRATEGIES, PLRCoverageScheduler, make_scheduler
from benchmarks.scheduler_bench import run_scheduler_bench

WIN = EpisodeStats(return_=10.0, success=True, length=5, tokens=frozenset({"PAYMENT_SUCCESS"}))
LOSS = EpisodeStats(
    return_=-1.0, success=False, length=50, failure_reason="max_steps", tokens=frozenset({"PAYMENT_FAILED"})
)


def make(strategy: str, n: int = 20, seed: int = 0, **pool: object) -> Scheduler:
    return make_scheduler(strategy, n, np.random.default_rng(seed), PoolConfig(**pool))


def play(scheduler: Scheduler, rounds: int, batch: int, seed: int = 1) -> None:
    """Sample rounds and report synthetic episodes (variant i succeeds with probability i/n)."""
    rng = np.random.default_rng(seed)
    for _ in range(rounds):
        for i in scheduler.sample(batch).tolist():
            ok = rng.random() < i / scheduler.n_variants
            tokens = frozenset({"PAYMENT_SUCCESS", f"RARE_{i % 3}"}) if ok else frozenset({"PAYMENT_FAILED"})
            scheduler.update(
                i,
                EpisodeStats(
                    10.0 if ok else -1.0,
                    ok,
                    5,
                    None if ok else "max_steps",
                    tokens,
                    value_loss=float(rng.random()) if i % 4 == 0 else None,
                ),
            )


@settings(max_examples=40, deadline=None)
@given(
    strategy=st.sampled_from(STRATEGIES),
    n=st.integers(1, 40),
    seed=st.integers(0, 2**16),
    rounds=st.integers(0, 12),
    batch=st.integers(0, 9),
    quarantine=st.sets(st.integers(0, 39), max_size=10),
)
def test_probabilities_sum_to_one_and_never_starve(
    strategy: str, n: int, seed: int, rounds: int, batch: int, quarantine: set[int]
) -> None:
    scheduler = make(strategy, n, seed)
    dropped = {q for q in quarantine if q < n}
    if len(dropped) == n:
        dropped.pop()
    for q in sorted(dropped):
        scheduler.quarantine(q, "env_crash")
    play(scheduler, rounds, batch, seed)
    p = scheduler.probabilities()
    assert p.shape == (n,)
    assert abs(p.sum() - 1.0) < 1e-9
    active = np.ones(n, dtype=bool)
    active[list(dropped)] = False
    assert (p[active] > 0).all()
    assert (p[~active] == 0).all()
    drawn = scheduler.sample(batch)
    assert len(drawn) == batch and not set(drawn.tolist()) & dropped


def test_heat_arithmetic_by_hand() -> None:
    heat = HeatTracker(3, decay=0.95, threshold=0.3)
    heat.advance(np.array([0]))  # round 1: h0 = 0.95*0 + 1
    assert heat.values().tolist() == pytest.approx([1.0, 0.0, 0.0])
    heat.advance(np.array([1]))  # round 2: h0 decays, h1 = 1
    assert heat.values().tolist() == pytest.approx([0.95, 1.0, 0.0])
    heat.advance(np.array([0, 2, 2]))  # round 3: h0 = 0.95^2 + 1, h2 drawn twice
    assert heat.values().tolist() == pytest.approx([1.9025, 0.95, 2.0])
    for _ in range(22):
        heat.advance(np.array([], dtype=np.int64))
    assert heat.values()[1] == pytest.approx(0.95**23) and not heat.cold()[1]  # 0.307
    heat.advance(np.array([], dtype=np.int64))
    assert heat.values()[1] == pytest.approx(0.95**24) and heat.cold()[1]  # 0.292 < 0.3


def test_lazy_heat_equals_eager_update() -> None:
    rng = np.random.default_rng(3)
    lazy, eager = HeatTracker(50), np.zeros(50)
    for _ in range(300):
        drawn = rng.integers(0, 50, size=rng.integers(0, 8))
        lazy.advance(drawn)
        eager *= 0.95
        np.add.at(eager, drawn, 1.0)
    np.testing.assert_allclose(lazy.values(), eager, rtol=1e-12)


def test_scheduler_heat_and_stats_table_track_draws() -> None:
    scheduler = make("round_robin", 4)
    assert scheduler.sample(3).tolist() == [0, 1, 2]
    assert scheduler.sample(3).tolist() == [3, 0, 1]
    scheduler.update(0, WIN)
    scheduler.update(0, LOSS)
    scheduler.update(0, EpisodeStats(0.0, False, 0, "env_crash"))
    rows = scheduler.stats_table()
    assert rows[0]["episodes"] == 3 and rows[0]["successes"] == 1
    assert rows[0]["failures"] == {"env_crash": 1, "max_steps": 1}
    assert rows[0]["heat"] == pytest.approx(0.95 + 1) and rows[3]["heat"] == pytest.approx(1.0)
    assert rows[2]["heat"] == pytest.approx(0.95) and rows[2]["last_sampled"] == 1 and rows[0]["last_sampled"] == 2


def test_heat_prefers_cold_variants() -> None:
    scheduler = make("heat", 10)
    hot = scheduler.sample(5)
    p = scheduler.probabilities()
    cold = np.setdiff1d(np.arange(10), hot)
    assert p[cold].min() == pytest.approx(20 * p[hot].max())
    assert p[cold].sum() == pytest.approx(100 / 105)  # 5 cold × weight 20 against 5 warm × weight 1


def test_plr_rank_staleness_and_token_terms_by_hand() -> None:
    plr = PLRCoverageScheduler(4, np.random.default_rng(0), temperature=1.0)
    for i in plr.sample(4).tolist():
        plr.update(i, EpisodeStats(0.0, False, 1, value_loss=[0.9, 0.5, 0.1, 0.5][i]))
    ranks = np.array([1, 2, 4, 2])  # ties share the better rank
    np.testing.assert_allclose(plr.score_probabilities(), (1 / ranks) / (1 / ranks).sum())
    plr.sample(1)
    last = plr.last_draw.copy()
    stale = plr.draws - last
    np.testing.assert_allclose(plr.staleness_probabilities(), stale / stale.sum())
    plr.update(0, EpisodeStats(1.0, True, 3, tokens=frozenset({"COMMON"})))
    plr.update(1, EpisodeStats(1.0, True, 3, tokens=frozenset({"COMMON"})))
    plr.update(2, EpisodeStats(1.0, True, 3, tokens=frozenset({"COMMON", "RARE"})))
    bonus = np.array([1 / 3, 1 / 3, 1.0, 0.0])
    np.testing.assert_allclose(plr.token_probabilities(), bonus / bonus.sum())


def test_plr_cold_term_gives_its_share_to_cold_variants_by_hand() -> None:
    plr = PLRCoverageScheduler(10, np.random.default_rng(0), cold_coef=0.3, floor=0.05)
    assert plr.cold_probabilities().sum() == pytest.approx(1.0)  # nothing drawn yet: every variant is cold
    plr.sample(10)
    assert not plr.cold_probabilities().any()  # all warm: the PLR mix takes the whole share
    without = PLRCoverageScheduler(10, np.random.default_rng(0), cold_coef=0.0, floor=0.05)
    without.sample(10)
    np.testing.assert_allclose(plr.probabilities(), without.probabilities())
    for scheduler in (plr, without):  # 0.95**24 < 0.3: nine cool down while only variant 0 is drawn each round
        for _ in range(24):
            scheduler.heat.advance(np.array([0]))
    cold = plr.heat.cold()
    assert cold.tolist() == [False] + [True] * 9
    mix = (without.probabilities() - 0.05 / 10) / 0.95  # the PLR mix alone (same draws, same scores)
    expected = 0.95 * (0.7 * mix + 0.3 * cold / 9) + 0.05 / 10
    np.testing.assert_allclose(plr.probabilities(), expected)


def test_cold_draws_are_counted_at_draw_time_and_survive_a_resume() -> None:
    from agentflow_core.pool.scheduler import cold_share

    scheduler = make("uniform", 4)
    scheduler.sample(4)  # all four cold when drawn
    scheduler.sample(2)  # heat 0.95 now: warm
    assert (scheduler.cold_draws, scheduler.draws) == (4, 6)
    state = scheduler.state_dict()
    assert cold_share(state) == pytest.approx(4 / 6)
    assert cold_share({"slices": [state, {**state, "draws": 4, "cold_draws": 0}]}) == pytest.approx(4 / 10)
    assert cold_share({"draws": 0}) is None
    again = make("uniform", 4)
    again.load_state_dict(state)
    assert again.cold_draws == 4


def test_plr_unplayed_variants_rank_first() -> None:
    plr = PLRCoverageScheduler(6, np.random.default_rng(0))
    plr.update(0, WIN)
    plr.update(1, LOSS)
    p_s = plr.score_probabilities()
    assert p_s[2:].min() > p_s[1] > p_s[0]


def test_plr_overdue_variants_are_drawn_first() -> None:
    plr = PLRCoverageScheduler(10, np.random.default_rng(0), max_staleness=1.0)
    plr.sample(10)
    plr.draws += 10  # ten more draws happened elsewhere: every variant is now one sweep stale
    plr.last_draw[:] = np.arange(1, 11)
    plr.last_draw[7] = 0
    assert plr.sample(1).tolist() == [7]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_quarantined_variants_are_never_sampled(strategy: str) -> None:
    scheduler = make(strategy, 12)
    scheduler.quarantine(3, "env_crash")
    scheduler.quarantine(5, "env_invalid")
    for _ in range(50):
        assert not {3, 5} & set(scheduler.sample(7).tolist())
    assert scheduler.quarantined == {3: "env_crash", 5: "env_invalid"}
    assert scheduler.stats_table()[5]["quarantined"] == "env_invalid"
    for i in range(12):
        scheduler.quarantine(i, "env_crash")
    with pytest.raises(AgentFlowError, match="quarantined"):
        scheduler.sample(1)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_state_dict_round_trip_resumes_identically(strategy: str) -> None:
    original = make(strategy, 30, seed=5)
    original.quarantine(4, "env_timeout")
    play(original, 20, 6)
    state = json.loads(json.dumps(original.state_dict()))
    restored = make(strategy, 30, seed=999)
    restored.load_state_dict(state)
    np.testing.assert_allclose(restored.probabilities(), original.probabilities())
    assert restored.stats_table() == original.stats_table()
    play(original, 5, 6, seed=2)
    play(restored, 5, 6, seed=2)
    assert restored.sample(6).tolist() == original.sample(6).tolist()
    with pytest.raises(AgentFlowError):
        make("uniform" if strategy != "uniform" else "heat", 30).load_state_dict(state)


def test_gumbel_top_k_draws_distinct_indices_within_support() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.0, 0.25, 0.25])
    for _ in range(20):
        drawn = gumbel_top_k(rng, p, 3)
        assert sorted(drawn.tolist()) == [0, 2, 3]
    assert len(gumbel_top_k(rng, p, 5)) == 5
    firsts = [gumbel_top_k(rng, p, 1)[0] for _ in range(4000)]
    assert np.mean(np.array(firsts) == 0) == pytest.approx(0.5, abs=0.03)


def test_unknown_strategy_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown scheduler strategy"):
        make_scheduler("lottery", 3, np.random.default_rng(0))


def test_benchmark_targets_met_at_reduced_scale() -> None:
    result = run_scheduler_bench(n_variants=200, draws=20_000, draws_per_round=13, seed=0)
    s = result["strategies"]
    assert s["round_robin"]["max_visit_gap_over_n"] == pytest.approx(1.0, abs=0.01)
    assert s["uniform"]["max_visit_gap_over_n"] > 5.0  # the gap metric does discriminate
    for name in ("heat", "plr_coverage"):
        assert s[name]["cold_share_vs_round_robin"] >= 3.0, name
        assert s[name]["max_visit_gap_over_n"] <= 5.0, name
    assert s["plr_coverage"]["draws_to_90pct_vs_round_robin"] < 1.0
    assert all(result["targets_met"]["plr_coverage"].values())
    assert (
        result["targets_met"]["heat"]["cold_share_vs_round_robin"]
        and result["targets_met"]["heat"]["max_visit_gap_over_n"]
    )
