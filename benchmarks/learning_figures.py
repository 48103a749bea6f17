"""The figures of ``agentflow bench learning``: per learner, the headline ratios against the peers, the targets.

Each learner reports its best validation checkpoint, ranked as ``agentflow train`` ranks them
(validation business value where the process prices episodes, else process success). Along its
curve, the first checkpoint at a level gives the time and env steps to it:

- ``rules``: test process success at least the rules' (every process);
- ``rules_value``: test business value at least the rules' (regret closed >= 0, priced processes);
- ``70pct_regret``: 70% of the rules-to-oracle regret closed on the test split (priced processes).

A learner that never reaches a level has no time to it; a ratio against a peer that never did divides
by the peer's whole budget and is an upper bound.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from agentflow_core.evaluation.policy_eval import EvalResult
from agentflow_core.evaluation.value import value_metrics
from benchmarks.learning_eval import Checkpoint, Evaluator, LearnerRun

# (bound, higher is better) where the process prices episodes (docs/learning.md "Side by side").
# ``test_regret_closed_over_<peer>`` is AgentFlow's regret closed minus the peer's.
TARGETS: dict[str, tuple[float, bool]] = {
    "test_regret_closed": (0.7, True),
    "test_regret_closed_over_maskableppo": (0.0, True),
    "test_regret_closed_over_maskableppo_bc": (0.0, True),
    "time_to_70pct_regret_vs_better_peer": (0.5, False),
    "min_family_process_success_vs_rules": (1.0, True),
}
# Where nothing is priced: the process-success yardsticks.
SUCCESS_TARGETS: dict[str, tuple[float, bool]] = {
    "test_process_success": (0.98, True),
    "min_family_process_success_vs_rules": (1.0, True),
    "time_to_rules_vs_better_peer": (0.5, False),
}
PEERS = ("maskableppo", "maskableppo_bc")
REGRET_LEVEL = 0.7
# AgentFlow's figures under their own names; every other figure is prefixed by its learner.
HEADLINE = (
    "test_process_success",
    "test_goal_success",
    "test_process_success_vs_rules",
    "test_success_by_family",
    "min_family_process_success_vs_rules",
    "test_business_value",
    "test_regret_closed",
)
NESTED = ("setup_s", "stages", "test", "curve")


def levels(priced: bool) -> dict[str, Callable[[Checkpoint, Evaluator], bool]]:
    """The levels a learner's time and steps are measured to, by name."""
    out: dict[str, Callable[[Checkpoint, Evaluator], bool]] = {
        "rules": lambda c, e: c.test_process_success >= e.rules.process_success_rate,
    }
    if priced:
        out["rules_value"] = lambda c, e: c.test_regret_closed is not None and c.test_regret_closed >= 0.0
        out["70pct_regret"] = lambda c, e: c.test_regret_closed is not None and c.test_regret_closed >= REGRET_LEVEL
    return out


def selected(run: LearnerRun) -> int:
    """The best validation checkpoint (the earliest on ties), as ``agentflow train`` ships it."""
    scores = [c.selection for c in run.checkpoints]
    return scores.index(max(scores))


def _value_figures(test: EvalResult, rules: EvalResult, oracle: EvalResult | None) -> dict[str, Any]:
    """The learner's business value and regret closed on the test split, where the process prices episodes."""
    values = {"trained": test.value, "rules": rules.value, "oracle": None if oracle is None else oracle.value}
    figures = value_metrics(values, test.mean_length)
    return {k: v for k, v in figures.items() if "/" not in k and not k.endswith(("_rules", "_oracle"))}


def learner_figures(run: LearnerRun, evaluator: Evaluator) -> dict[str, Any]:
    """One learner's figures: its reported checkpoint on the test split, and its time and steps to each level."""
    best = selected(run)
    test, rules = run.test_results[best], evaluator.rules
    by_family, rules_by_family = test.process_success_by_family, rules.process_success_by_family
    out: dict[str, Any] = {
        "test_process_success": test.process_success_rate,
        "test_goal_success": test.success_rate,
        "test_process_success_vs_rules": _ratio(test.process_success_rate, rules.process_success_rate),
        "test_success_by_family": by_family,
        "min_family_process_success_vs_rules": min(_ratio(by_family[f], rules_by_family[f]) for f in rules_by_family),
        "selected_checkpoint_env_steps": run.checkpoints[best].env_steps,
        "final_test_process_success": run.checkpoints[-1].test_process_success,
        "final_test_regret_closed": run.checkpoints[-1].test_regret_closed,
        "train_s": run.train_s,
        "env_steps": run.env_steps,
        "explore_steps": run.explore_steps,
        "setup_s": run.setup_s,
        "stages": run.stages,
        "test": test.to_dict(),
        "curve": [asdict(c) for c in run.checkpoints],
        **_value_figures(test, rules, evaluator.oracle),
    }
    for level, reached_it in levels(evaluator.priced).items():
        reached = next((c for c in run.checkpoints if reached_it(c, evaluator)), None)
        out[f"reached_{level}"] = reached is not None
        out[f"time_to_{level}_s"] = None if reached is None else reached.train_s
        out[f"steps_to_{level}"] = None if reached is None else reached.env_steps
    return out


def vs(ours: dict[str, Any], peer: dict[str, Any], level: str, unit: str) -> float | None:
    """Our time (``unit="time"``) or env steps (``"steps"``) to ``level`` over the peer's.

    Against the peer's whole budget if it never reached the level (an upper bound); None if we never
    did, or the peer was there at its first checkpoint (nothing to divide by).
    """
    what, budget = (f"time_to_{level}_s", "train_s") if unit == "time" else (f"steps_to_{level}", "env_steps")
    if ours[what] is None:
        return None
    theirs = float(peer[what] if peer[f"reached_{level}"] else peer[budget])
    return float(ours[what]) / theirs if theirs > 0 else None


def vs_better_peer(ratios: Sequence[float | None]) -> float | None:
    """The ratio against the faster peer: the largest of the per-peer ratios, None if any is undefined."""
    return None if not ratios or any(r is None for r in ratios) else max(r for r in ratios if r is not None)


def headline(ours: dict[str, Any], peers: dict[str, dict[str, Any]], priced: bool) -> dict[str, Any]:
    """The ratios against each peer and against the better one, and (priced) the regret-closed margins."""
    out: dict[str, Any] = {}
    for level in levels(priced):
        for unit in ("time", "steps"):
            ratios = [vs(ours, peers[name], level, unit) for name in PEERS]
            out.update({f"{unit}_to_{level}_vs_{name}": r for name, r in zip(PEERS, ratios, strict=True)})
            out[f"{unit}_to_{level}_vs_better_peer"] = vs_better_peer(ratios)
    if priced:
        for name in PEERS:
            theirs = peers[name].get("test_regret_closed")
            mine = ours.get("test_regret_closed")
            out[f"test_regret_closed_over_{name}"] = None if mine is None or theirs is None else mine - theirs
    return out


def targets(result: dict[str, Any], priced: bool) -> tuple[dict[str, float], dict[str, bool]]:
    """The bounds and whether each was met (a missing figure is not met)."""
    chosen = TARGETS if priced else SUCCESS_TARGETS
    return {k: bound for k, (bound, _) in chosen.items()}, {k: _met(result.get(k), *chosen[k]) for k in chosen}


def notes(result: dict[str, Any], priced: bool) -> list[str]:
    """What the figures mean, and which of them are bounds rather than measurements."""
    cfg, machine = result["config"], result["machine"]
    warm = bool(cfg["train"].get("bc_warm_start", True))
    out = [
        f"Three learners: {cfg['train']['total_steps']} PPO env steps each on the train split (same hyper-parameters "
        f"and training reward); greedy evaluations every {cfg['eval_every_updates']} rollouts on the same "
        f"{cfg['validation_episodes']} validation and {cfg['test_episodes_played']} test episodes (stratified over "
        "family and every dimension value); each reports its best validation checkpoint "
        + ("(validation business value)." if priced else "(validation process success)."),
        "agentflow: the product's path "
        + (
            "(exploration around the rules, BC, the offline stage's CQL where offline.enabled, PPO with its KL "
            "term to the offline actor)"
            if warm
            else "with train.bc_warm_start false (PPO from a fresh network on the product's pool and scheduler)"
        )
        + "; maskableppo: sb3-contrib MaskablePPO from scratch; maskableppo_bc: MaskablePPO after BC on the same "
        "rules' logs (AgentFlow's exploration data).",
        "time_to_*: training wall time (evaluations excluded) to the first checkpoint at the level; "
        + ("AgentFlow's and maskableppo_bc's include" if warm else "maskableppo_bc's includes")
        + " the exploration that produced the rules' logs and their BC (and CQL); steps_to_*: env steps to it, "
        "exploration's included.",
        f"Load average (1/5/15 min) before: {_loads(machine['load_avg_before'])}, after: "
        f"{_loads(machine['load_avg_1_5_15'])} on {machine['cpus']} CPUs.",
    ]
    if priced:
        out.insert(
            1,
            f"Value: business value per test episode; regret closed = (learner - rules) / (oracle - rules) with "
            f"rules {result['test_business_value_rules']:.2f} and oracle {result['test_business_value_oracle']:.2f} "
            "on the same episodes; test_regret_closed_over_<peer> = AgentFlow's minus the peer's.",
        )
    for level in levels(priced):
        if not result[f"agentflow_reached_{level}"]:
            out.append(f"AgentFlow never reached {level} within its budget: no *_to_{level}_vs_* figure.")
            continue
        for name in PEERS:
            if not result[f"{name}_reached_{level}"]:
                out.append(
                    f"{name} never reached {level} within its budget: the *_to_{level}_vs_{name} ratios divide by its "
                    "whole training time / steps, so they are upper bounds."
                )
    return out


def _loads(values: Sequence[float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def _met(value: float | None, bound: float, higher: bool) -> bool:
    if value is None:
        return False
    return value >= bound if higher else value <= bound


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")
