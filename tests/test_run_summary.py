"""``agentflow run``'s closing summary names the policy's test value against the rules and the oracle."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from flows.cli.app import plan_tree, where_to_look
from tests.tiny import tiny_config


def _text(tree: object) -> str:
    console = Console(record=True, width=400)
    console.print(tree)
    return console.export_text()


def _summary(tmp_path: Path, train: dict[str, object]) -> str:
    return _text(where_to_look(tiny_config(tmp_path), {"train": train, "report": {}}))


def test_the_summary_leads_the_policy_against_the_rules_and_the_oracle(tmp_path: Path) -> None:
    train = {
        "stop_reason": "step_budget",
        "global_step": 1024,
        "test_process_success": 0.984,
        "test_process_success_rules": 0.93,
        "test_business_value": 97.0,
        "test_business_value_rules": 76.6,
        "test_business_value_oracle": 102.9,
        "test_regret_closed": 0.78,
        "mean_episode_steps": 13.4,
    }
    text = _summary(tmp_path, train)
    assert "test split: process success 0.984 vs the rules' 0.930; business value 97.000, rules 76.600" in text
    assert "oracle 102.900; regret closed: policy 0.78; mean episode 13.4 steps" in text


def test_an_unpriced_process_gets_process_success_only(tmp_path: Path) -> None:
    train = {
        "stop_reason": "converged",
        "global_step": 2048,
        "test_process_success": 1.0,
        "test_process_success_rules": 1.0,
    }
    text = _summary(tmp_path, train)
    assert "test split: process success 1.000 vs the rules' 1.000\n" in text
    assert "business value" not in text


def test_the_plan_says_where_ppo_starts(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path)
    for warm, start, offline in (
        (False, "from a fresh network", "a reference on the test split"),
        (True, "from the offline actor", "PPO's KL to it"),
    ):
        warm_cfg = cfg.model_copy(
            update={
                "train": cfg.train.model_copy(update={"bc_warm_start": warm}),
                "offline": cfg.offline.model_copy(update={"enabled": True}),
            }
        )
        text = _text(plan_tree(warm_cfg))
        assert f"PPO up to {cfg.train.total_steps} steps {start}" in text and offline in text
