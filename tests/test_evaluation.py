"""Evaluation measures on synthetic trajectories with hand-computed answers, and the report files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentflow_core.evaluation.consistency import (
    CANONICAL_STATES,
    DEFAULT_DRAWS,
    agreement_matrix,
    canonical_consistency,
    matched_state_consistency,
    mean_off_diagonal,
    policy_agreement,
)
from agentflow_core.evaluation.hacking import is_hacking, reward_hacking
from agentflow_core.evaluation.records import EpisodeRecord, StepRecord
from agentflow_core.evaluation.report import (
    REPORT_KEYS,
    build_report,
    report_tree,
    tree_text,
)
from agentflow_core.evaluation.report_render import render_html, render_markdown
from agentflow_core.evaluation.risk import risk_report
from agentflow_core.evaluation.robustness import robustness_score
from agentflow_core.evaluation.root_causes import cause_of, root_causes
from agentflow_core.evaluation.token_frequency import coverage_table
from agentflow_core.semantics import ACTIONS, CHECKOUT, FEATURE_INDEX, N_TOKENS, TOKENS, SemanticAction, decode_tokens

A = SemanticAction


def episode(
    i: int,
    *,
    network: str = "normal",
    tier: str = "standard",
    success: bool = False,
    ret: float = 0.0,
    shaped: float | None = None,
    reason: str | None = "max_steps",
    path: list[set[str]] | None = None,
    family: str = "web_checkout",
) -> EpisodeRecord:
    tokens = [frozenset(t) for t in (path or [{"LOGGED_IN"}])]
    reached = any("PAYMENT_SUCCESS" in t for t in tokens)
    return EpisodeRecord(
        f"ep{i}",
        f"{family}_{network}_{tier}_{i}",
        family,
        {"network": network, "user_tier": tier},
        len(tokens),
        ret,
        ret if shaped is None else shaped,
        ret,
        reached,
        success,
        reason,
        0,
        tokens,
    )


def step(
    env_id: str,
    state: set[str],
    action: int,
    *,
    family: str = "web_checkout",
    risk: float = 0.0,
    done: bool = False,
    network: str = "normal",
) -> StepRecord:
    return StepRecord(
        "e",
        env_id,
        family,
        {"network": network},
        1,
        frozenset(state),
        action,
        frozenset(state),
        -0.01,
        -0.01,
        risk,
        done,
        False,
        None,
    )


def feature_blind(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """A policy that depends only on tokens: the same choice in every variant."""
    return np.array([int(A.SUBMIT_PAYMENT) if "PAYMENT_PAGE" in decode_tokens(o) else int(A.LOGIN) for o in obs])


def vip_differs_on_declined_card(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Same as ``feature_blind`` except VIP variants pick ESCALATE on the declined-card state (1 of 8 states)."""
    base = feature_blind(obs, mask)
    vip = obs[:, N_TOKENS + FEATURE_INDEX["is_vip"]] > 0.5
    declined = np.array(["INVALID_CARD" in decode_tokens(o) for o in obs])
    return np.where(vip & declined, int(A.ESCALATE), base)


VARIANT_FEATURES = [
    {"is_vip": 1.0, "price_factor": 0.5},
    {"is_vip": 1.0, "price_factor": 0.45},
    {"is_vip": 0.0, "price_factor": 0.55},
    {"is_vip": 0.0, "price_factor": 0.5},
]


def test_identical_choices_give_consistency_one() -> None:
    result = canonical_consistency(feature_blind, ["a", "b", "c", "d"], VARIANT_FEATURES, vocabulary=CHECKOUT)
    assert result.actions.shape == (4, len(CANONICAL_STATES) * DEFAULT_DRAWS)
    assert result.score == 1.0
    assert np.array_equal(result.matrix, np.ones((4, 4)))
    assert policy_agreement(result.actions, result.actions) == 1.0


def test_partial_disagreement_matches_the_hand_computed_value() -> None:
    result = canonical_consistency(
        vip_differs_on_declined_card, ["v1", "v2", "s1", "s2"], VARIANT_FEATURES, draws=1, vocabulary=CHECKOUT
    )
    # vip-vip and standard-standard pairs agree on 8/8 states, the 4 cross pairs on 7/8.
    assert result.matrix[0, 2] == pytest.approx(7 / 8)
    assert result.matrix[0, 1] == 1.0
    assert result.score == pytest.approx((2 * 1.0 + 4 * 7 / 8) / 6)
    assert mean_off_diagonal(agreement_matrix(np.array([[0, 1], [0, 2], [1, 2]]))) == pytest.approx((0.5 + 0 + 0.5) / 3)


def test_matched_state_consistency_pools_variant_pairs() -> None:
    a, b, c = {"PAYMENT_PAGE"}, {"LOGGED_OUT"}, {"CART_FILLED"}
    steps = [
        step("v1", a, 6),
        step("v1", a, 6),
        step("v1", a, 9),
        step("v2", a, 6),
        step("v3", a, 8),
        step("v1", b, 0),
        step("v2", b, 0),
        step("v3", c, 4),
    ]
    result = matched_state_consistency(steps)
    # set a: modal actions 6, 6, 8 -> 1 agreeing pair of 3; set b: 0, 0 -> 1 of 1; set c: one variant, ignored.
    assert (result.agreeing_pairs, result.pairs, result.token_sets) == (2, 4, 2)
    assert result.score == pytest.approx(0.5)
    assert result.worst[0]["tokens"] == ["PAYMENT_PAGE"]


def planted_failures() -> list[EpisodeRecord]:
    eps, i = [], 0
    for n, network in ((40, "packet_loss_5%"), (10, "normal")):
        for _ in range(n):
            eps.append(episode(i, network=network, path=[{"LOGGED_IN"}, {"NETWORK_TIMEOUT"}, {"NETWORK_TIMEOUT"}]))
            i += 1
    for _ in range(30):
        eps.append(
            episode(
                i, network="latency_500ms", path=[{"PAYMENT_PAGE"}, {"PAYMENT_PAGE", "INVALID_CARD"}, {"PAYMENT_PAGE"}]
            )
        )
        i += 1
    for _ in range(20):
        eps.append(episode(i, tier="vip", reason="escalated", path=[{"PAGE_NOT_FOUND"}, {"ESCALATED"}]))
        i += 1
    for k in range(150):  # successes spread evenly over the networks
        eps.append(
            episode(
                i,
                network=("normal", "latency_500ms", "packet_loss_5%")[k % 3],
                success=True,
                ret=9.9,
                reason=None,
                path=[{"PAYMENT_SUCCESS"}],
            )
        )
        i += 1
    return eps


def test_planted_failure_mix_is_recovered_with_shares_and_concentration() -> None:
    eps = planted_failures()
    causes, failed = root_causes(eps, ["network", "user_tier"], threshold=5.0)
    assert failed == 100
    assert [(c.cause, c.count, c.share) for c in causes] == [
        ("network_timeout", 50, 0.5),
        ("invalid_card", 30, 0.3),
        ("page_not_found", 20, 0.2),
    ]
    head = causes[0].headline
    assert head is not None
    assert (head.dimension, head.value) == ("network", "packet_loss_5%")
    assert head.share_in_cause == pytest.approx(0.8)
    assert head.share_overall == pytest.approx((40 + 50) / 250)
    assert causes[2].headline is not None and causes[2].headline.value == "vip"
    assert causes[1].endings == {"max_steps": 30} and causes[2].endings == {"escalated": 20}
    assert "network_timeout: 50% (mostly network=packet_loss_5%: 80%" in causes[0].summary()
    assert "retry" in causes[0].recommendation.lower() and "packet_loss_5%" in causes[0].recommendation


def test_pool_failures_take_precedence_and_handled_endings_are_not_failures() -> None:
    crash = episode(1, reason="env_crash", path=[{"NETWORK_TIMEOUT"}])
    assert cause_of(crash) == "env_crash" and crash.crashed
    handled = episode(2, success=True, ret=0.98, reason="user_blocked", path=[{"USER_BLOCKED"}, {"ESCALATED"}])
    _, failed = root_causes([handled], ["network"])
    assert failed == 0


def test_reward_hacking_flags_shaped_reward_without_an_accepted_outcome_only() -> None:
    hack = episode(1, ret=-0.5, shaped=6.0, path=[{"CART_FILLED"}, {"PAYMENT_PAGE"}, {"CART_FILLED"}, {"PAYMENT_PAGE"}])
    genuine = episode(2, ret=9.9, shaped=10.8, success=True, reason=None, path=[{"PAYMENT_PAGE"}, {"PAYMENT_SUCCESS"}])
    low = episode(3, ret=-0.5, shaped=0.8)
    # a handled ending the process accepts (a blocked user escalated): paid for, so not hacking, goal or not
    handled = episode(4, ret=6.0, shaped=6.0, success=True, reason=None, path=[{"USER_BLOCKED"}, {"ESCALATED"}])
    assert not handled.reached_goal
    assert is_hacking(hack, 5.0) and not is_hacking(genuine, 5.0) and not is_hacking(low, 5.0)
    assert not is_hacking(handled, 5.0)
    report = reward_hacking([hack, genuine, low, handled], 5.0)
    assert report.flagged == 1 and report.rate == pytest.approx(1 / 4)
    assert report.examples[0]["episode_id"] == "ep1"
    assert report.examples[0]["path"] == ["CART_FILLED", "PAYMENT_PAGE", "CART_FILLED", "PAYMENT_PAGE"]


def test_risk_report_counts_by_action_and_family() -> None:
    steps = [
        step("w", {"ORDER_PENDING"}, int(A.CANCEL_ORDER), risk=0.5),
        step("w", {"PAYMENT_PAGE"}, int(A.SUBMIT_PAYMENT), risk=0.1),
        step("w", {"PAYMENT_PAGE"}, int(A.SUBMIT_PAYMENT), risk=0.9),
        step("d", {"PAYMENT_PAGE"}, int(A.SUBMIT_PAYMENT), risk=0.1, family="order_db"),
    ]
    report = risk_report(steps, [], threshold=0.3, penalty=1.5, actions=ACTIONS)
    assert report.risky_steps == 2 and report.total_penalty == 3.0
    assert report.by_action == {
        "CANCEL_ORDER": {"risky": 1, "steps": 1, "rate": 1.0},
        "SUBMIT_PAYMENT": {"risky": 1, "steps": 3, "rate": pytest.approx(1 / 3)},
    }
    assert report.by_family == {"web_checkout": {"risky": 2, "steps": 3, "rate": pytest.approx(2 / 3)}}


def test_coverage_table_marks_long_tail_and_unseen_tokens() -> None:
    steps = [step(f"v{i}", {"LOGGED_IN", "CART_FILLED"}, 4, network="normal") for i in range(250)]
    steps.append(step("v0", {"LOGGED_IN", "PAYMENT_FAILED"}, 8, network="packet_loss_5%", done=True))
    reachable = ["LOGGED_IN", "CART_FILLED", "PAYMENT_FAILED", "SERVER_ERROR"]
    table = coverage_table(steps, "network", reachable, long_tail=0.01, tokens=TOKENS)
    assert table.rows == ["web_checkout · normal", "web_checkout · packet_loss_5%"]
    assert table.states.tolist() == [250, 2]  # the terminal step also counts its final state
    assert table.long_tail == ["PAYMENT_FAILED"] and table.unseen == ["SERVER_ERROR"]
    assert table.state_coverage == pytest.approx(3 / 4)
    assert table.frequency[0, table.tokens.index("CART_FILLED")] == 1.0


def test_robustness_score_formula() -> None:
    assert robustness_score(0.9, 0.8, 0.1) == pytest.approx(0.9 * 0.8 * 0.9)
    assert robustness_score(1.0, 1.0, 1.0) == 0.0


def test_report_document_and_renderings(tmp_path: Path) -> None:
    from agentflow_core.config import StressConfig
    from agentflow_core.evaluation.robustness import analyze_stress
    from agentflow_core.evaluation.stress import StressRollout

    eps = planted_failures()
    steps = [step(e.env_id, set(t), 9, network=str(e.params["network"])) for e in eps for t in e.token_path]
    rollout = StressRollout(steps, eps, 0, sorted({e.env_id for e in eps}))
    analysis = analyze_stress(
        rollout, feature_blind, StressConfig(), ["network", "user_tier"], rollout.variants[:5], vocabulary=CHECKOUT
    )
    report = build_report(
        analysis.to_dict(), "policy_x", "ckpt", "2024-01-01T00:00:00+00:00", {"State coverage": "c.png"}
    )
    assert tuple(report) == REPORT_KEYS
    json.dumps(report)  # JSON-able as is
    lines = tree_text(report_tree(report))
    assert lines[0] == "📊 Evaluation Report for policy_x"
    assert any("network_timeout: 50%" in line for line in lines) and lines[-1].startswith("└── Recommendation:")
    assert "![State coverage](c.png)" in render_markdown(report)
    assert report["sim_to_real"] is None and "Sim-to-real" not in render_markdown(report)
    family = {
        "family": "web_checkout",
        "real_channel": "headless Chromium",
        "episodes": 16,
        "sim_process_success": 1.0,
        "real_process_success": 0.9375,
        "gap": 0.0625,
        "identical_fraction": 0.875,
        "real_step_ms_p50": 80.0,
        "real_step_ms_p95": 150.0,
    }
    with_gap = build_report(
        {**analysis.to_dict(), "sim_to_real": {"max_gap": 0.0625, "families": [family]}}, "policy_x", "ckpt", "now"
    )
    assert (
        "| web_checkout | headless Chromium | 16 | 100.0% | 93.8% | +6.2 pts | 87.5% | 80.0 / 150.0 |"
        in render_markdown(with_gap)
    )
    tree = tree_text(report_tree(with_gap))
    assert any("Sim-to-Real: largest gap +6.2 pts" in line for line in tree)
    assert any("web_checkout on headless Chromium: sim 100.0%, real 93.8% over 16" in line for line in tree)
    assert "data:image/png;base64,iVBORw0K" in render_html(report, {"State coverage": b"\x89PNG\r\n\x1a\n"})
