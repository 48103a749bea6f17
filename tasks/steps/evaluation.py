"""The held-out evaluations training and the offline stage share: pool size, episode counts, the test summary.

Validation episodes pick the best checkpoint during training; the test split is played once, at the
end, by the best checkpoint and the reference policies (exploration, the process's rules -- the
"expert" of the success keys --, the oracle, the BC and offline actors where they exist): goal and
process success per family and per dimension value, and where the channel prices its episodes the
business value of each and the regret closed (:mod:`agentflow_core.evaluation.value`).
"""

from __future__ import annotations

from typing import Any

from agentflow_core.evaluation.policy_eval import EvalResult
from agentflow_core.evaluation.value import value_metrics

# Slots of an evaluation pool (or of the env workers' evaluation episodes), at most.
EVAL_NUM_ENVS = 16
# The final test evaluation plays at least this many episodes.
FINAL_EVAL_EPISODES = 128
# The exploration baseline: epsilon-greedy around the untrained network.
EXPLORATION_EPSILON = 0.95


def test_summary(final: dict[str, EvalResult]) -> dict[str, Any]:
    """The test split's numbers: trained policy vs exploration and expert, both success measures."""
    trained, exploration, expert = final["trained"], final["exploration"], final["rules"]
    values = value_metrics({name: result.value for name, result in final.items()}, trained.mean_length)
    return {
        "test_process_success": trained.process_success_rate,
        "test_goal_success": trained.success_rate,
        "test_return": trained.mean_return,
        "test_process_success_exploration": exploration.process_success_rate,
        "test_process_success_rules": expert.process_success_rate,
        "test_goal_success_exploration": exploration.success_rate,
        "test_goal_success_rules": expert.success_rate,
        "test_process_success_vs_exploration": _ratio(trained.process_success_rate, exploration.process_success_rate),
        "test_process_success_vs_rules": _ratio(trained.process_success_rate, expert.process_success_rate),
        "test_goal_success_vs_exploration": _ratio(trained.success_rate, exploration.success_rate),
        "test_goal_success_vs_rules": _ratio(trained.success_rate, expert.success_rate),
        "test_process_success_by_family": trained.process_success_by_family,
        "test_goal_success_by_family": trained.success_by_family,
        "test": trained.to_dict(),
        "test_rules": expert.to_dict(),
        **{f"test_{name}": result.to_dict() for name, result in final.items() if name not in ("trained", "rules")},
        **{k: v for k, v in values.items() if "/" not in k},
        "test_metrics": trained.metrics("test/") | values,
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def value_line(summary: dict[str, Any]) -> str | None:
    """One line of business value on the test split (policy vs rules vs oracle, regret closed), if priced."""
    if "test_business_value" not in summary:
        return None
    parts = [f"business value {summary['test_business_value']:.3f}"]
    for name in ("rules", "oracle", "bc", "offline"):
        if f"test_business_value_{name}" in summary:
            parts.append(f"{name} {summary[f'test_business_value_{name}']:.3f}")
    closed = [
        f"{label} {summary[key]:.2f}"
        for label, key in (
            ("policy", "test_regret_closed"),
            ("BC", "test_regret_closed_bc"),
            ("offline", "test_regret_closed_offline"),
        )
        if key in summary
    ]
    line = ", ".join(parts) + (f"; regret closed: {', '.join(closed)}" if closed else "")
    return f"{line}; mean episode {summary['mean_episode_steps']:.1f} steps"
