"""The held-out evaluations training and the offline stage share: pool size, episode counts, the test summary.

Validation episodes pick the best checkpoint during training; the test split is played once, at the
end, by the best checkpoint, the exploration policy and the scripted expert (payment and process
success, per family and per dimension value).
"""

from __future__ import annotations

from typing import Any

from agentflow_core.evaluation.policy_eval import EvalResult

# Slots of an evaluation pool (or of the env workers' evaluation episodes), at most.
EVAL_NUM_ENVS = 16
# The final test evaluation plays at least this many episodes.
FINAL_EVAL_EPISODES = 128
# The exploration baseline: epsilon-greedy around the untrained network.
EXPLORATION_EPSILON = 0.95


def test_summary(final: dict[str, EvalResult]) -> dict[str, Any]:
    """The test split's numbers: trained policy vs exploration and expert, both success measures."""
    trained, exploration, expert = final["trained"], final["exploration"], final["expert"]
    return {
        "test_process_success": trained.process_success_rate,
        "test_payment_success": trained.success_rate,
        "test_return": trained.mean_return,
        "test_process_success_exploration": exploration.process_success_rate,
        "test_process_success_expert": expert.process_success_rate,
        "test_payment_success_exploration": exploration.success_rate,
        "test_payment_success_expert": expert.success_rate,
        "test_process_success_vs_exploration": _ratio(trained.process_success_rate, exploration.process_success_rate),
        "test_process_success_vs_expert": _ratio(trained.process_success_rate, expert.process_success_rate),
        "test_payment_success_vs_exploration": _ratio(trained.success_rate, exploration.success_rate),
        "test_payment_success_vs_expert": _ratio(trained.success_rate, expert.success_rate),
        "test_process_success_by_family": trained.process_success_by_family,
        "test_payment_success_by_family": trained.success_by_family,
        "test": trained.to_dict(),
        "test_expert": expert.to_dict(),
        "test_metrics": trained.metrics("test/"),
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")
