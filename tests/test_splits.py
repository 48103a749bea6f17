"""Train / validation / test splits, stratified evaluation, process success and Wilson intervals."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from agentflow_core.config import AgentFlowConfig
from agentflow_core.contracts import EnvPool
from agentflow_core.errors import DataFileError
from agentflow_core.evaluation.policy_eval import evaluate_policy, stratified_eval_variants
from agentflow_core.evaluation.proportions import SuccessBreakdown, wilson_interval
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import (
    CHECKOUT,
    GOAL_TOKEN,
    SemanticAction,
    accepted_outcomes,
    decode_tokens,
    process_success,
)
from agentflow_core.splits import SPLIT_FILE, SPLITS, assign_splits, read_splits, write_split_catalogue
from agentflow_core.variants import BaseEnvInfo, VariantSpec, content_hash, generate_variants
from tasks.context import PhaseContext
from tests.pool_fixtures import TinyFactory

DIMENSIONS = AgentFlowConfig().variants.dimensions
BASES = [BaseEnvInfo("web_checkout_v2", "web_checkout", 2), BaseEnvInfo("order_db_v1", "order_db", 1)]
BASES.append(BaseEnvInfo("payment_api_v1", "payment_api", 1))


def catalogue(samples: int = 3, seed: int = 0) -> list[VariantSpec]:
    return generate_variants(
        BASES, DIMENSIONS, AgentFlowConfig().variants.perturbations, samples, seed, scenario=CHECKOUT.scenario
    )


def strata(variants: Sequence[VariantSpec]) -> set[tuple[str, str, str]]:
    return {(v.family, d, str(v.params[d])) for v in variants for d in DIMENSIONS}


def test_splits_are_disjoint_complete_deterministic_and_stratified() -> None:
    variants = catalogue()
    splits = assign_splits(variants, 0.1, 0.1, sorted(DIMENSIONS), seed=0)
    hashes = [set(splits[name]) for name in SPLITS]
    assert sum(map(len, hashes)) == len(variants) == len(set().union(*hashes))
    assert all(a.isdisjoint(b) for i, a in enumerate(hashes) for b in hashes[i + 1 :])
    shuffled = assign_splits(list(reversed(variants)), 0.1, 0.1, sorted(DIMENSIONS), seed=0)
    assert all(set(shuffled[name]) == set(splits[name]) for name in SPLITS)  # membership ignores catalogue order
    assert splits != assign_splits(variants, 0.1, 0.1, sorted(DIMENSIONS), seed=1)
    by_hash = {v.content_hash: v for v in variants}
    every = strata(variants)
    for name in SPLITS:  # every family x dimension value in every split (the counts allow it: 9 per stratum)
        assert strata([by_hash[h] for h in splits[name]]) == every, name
    assert 0.08 * len(variants) <= len(splits["test"]) <= 0.16 * len(variants)
    assert 0.08 * len(variants) <= len(splits["validation"]) <= 0.16 * len(variants)


def test_split_catalogue_round_trips_and_a_damaged_split_file_is_one_clear_error(tmp_path: Path) -> None:
    variants = catalogue(samples=1)
    write_split_catalogue(
        variants, tmp_path / "v", {"seed": 0}, validation=0.2, test=0.2, seed=0, dimensions=sorted(DIMENSIONS)
    )
    read = read_splits(tmp_path / "v")
    assert sorted(v.content_hash for name in SPLITS for v in read[name]) == sorted(v.content_hash for v in variants)
    card = json.loads((tmp_path / "v" / "_meta.json").read_text())
    assert card["split"]["counts"]["test"]["total"] == len(read["test"])
    file = tmp_path / "v" / SPLIT_FILE
    data = json.loads(file.read_text())
    data["splits"]["test"].append(data["splits"]["train"][0])  # one variant in two splits
    file.write_text(json.dumps(data))
    with pytest.raises(DataFileError, match="disjoint cover"):
        read_splits(tmp_path / "v")
    file.write_text("[" * 100_000)
    with pytest.raises(DataFileError, match=SPLIT_FILE):
        read_splits(tmp_path / "v")


def test_split_fractions_are_validated() -> None:
    with pytest.raises(ValueError, match="must leave a train share"):
        AgentFlowConfig.model_validate({"variants": {"split": {"validation": 0.5, "test": 0.5}}})
    with pytest.raises(ValueError):
        AgentFlowConfig.model_validate({"variants": {"split": {"validation": 0.0}}})


def test_process_success_accepts_escalation_for_a_blocked_user_only() -> None:
    blocked, standard = {"user_tier": "blocked"}, {"user_tier": "standard"}
    assert accepted_outcomes(blocked) == {GOAL_TOKEN, "ESCALATED"} and accepted_outcomes(standard) == {GOAL_TOKEN}
    assert process_success(blocked, {"USER_BLOCKED", "ESCALATED"}, terminated=True)
    assert not process_success(standard, {"LOGGED_IN", "ESCALATED"}, terminated=True)  # a wrong escalation
    assert process_success(standard, {GOAL_TOKEN}, terminated=True)
    assert not process_success(blocked, {"ESCALATED"}, terminated=False)  # truncated, not ended


def test_wilson_interval_on_hand_computed_values() -> None:
    # 8 of 10, z = 1.96: centre (0.8 + 1.96²/20) / (1 + 1.96²/10) = 0.7167, half-width 0.2265
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)  # z² / (n + z²)
    assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    b = SuccessBreakdown.of([True, False, True], ["a", "a", "b"], [{"k": 1}, {"k": 2}, {"k": 1}], ["k"])
    assert b.by_family["a"].rate == 0.5 and b.by_dimension["k"]["1"].n == 2
    assert b.metrics("s")["s/k/1"] == 1.0 and b.metrics("s")["s/a/ci95_high"] == pytest.approx(wilson_interval(1, 2)[1])


def test_stratified_evaluation_gives_every_family_the_same_episodes() -> None:
    variants = stratified_eval_variants(catalogue(samples=1), 18, sorted(DIMENSIONS), seed=0)
    families = [v.family for v in variants]
    assert {f: families.count(f) for f in set(families)} == {"web_checkout": 6, "order_db": 6, "payment_api": 6}
    assert families[:3] == sorted(set(families))  # interleaved: a round-robin pool starts every family at once
    assert {str(v.params["start_stage"]) for v in variants} == set(DIMENSIONS["start_stage"])

    tiny = []
    for family in ("fam_a", "fam_b", "fam_c"):
        for i in range(2):
            params = {"max_episode_steps": 50, "inventory": i, "user_tier": "blocked" if i else "standard"}
            tiny.append(VariantSpec(f"{family}_{i}", "tiny_shop_v1", family, params, content_hash(family, params)))
    pool = InProcessPool(tiny, TinyFactory(), 4, AgentFlowConfig().pool.model_copy(update={"scheduler": "round_robin"}))

    def pay(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        login, submit = int(SemanticAction.LOGIN), int(SemanticAction.SUBMIT_PAYMENT)
        return np.array([login if "LOGGED_OUT" in decode_tokens(o) else submit for o in obs])

    result = evaluate_policy(pool, pay, 12, seed=0, dimensions=["user_tier"])
    pool.close()
    assert {f: p.n for f, p in result.process.by_family.items()} == {"fam_a": 4, "fam_b": 4, "fam_c": 4}
    assert result.process.by_dimension["user_tier"]["blocked"].n == 6
    assert result.metrics()["eval/process_success/fam_a"] == result.process.by_family["fam_a"].rate


class RecordingFactory:
    """Builds the real pools and remembers which variants each one was built over, in order."""

    def __init__(self) -> None:
        self.pools: list[list[str]] = []

    def __call__(self, ctx: PhaseContext, variants: Sequence[VariantSpec], num_envs: int, **kw: Any) -> EnvPool:
        from tasks.compose import build_pool

        self.pools.append([v.content_hash for v in variants])
        return build_pool(ctx, variants, num_envs, **kw)


class RecordingRollouts(RecordingFactory):
    """Training's worker-side rollout source, recording the variants it is built over and each evaluation's."""

    def __init__(self) -> None:
        super().__init__()
        self.evaluations: list[tuple[str, list[str]]] = []  # (actor kind, variants played)

    def __call__(self, ctx: PhaseContext, variants: Sequence[VariantSpec], num_envs: int, **kw: Any) -> Any:
        from tasks.compose import build_rollouts

        self.pools.append([v.content_hash for v in variants])
        rollouts = build_rollouts(ctx, variants, num_envs, **kw)
        evaluate = rollouts.evaluate

        def recorded(eval_variants: Sequence[VariantSpec], actor: Any, *args: Any) -> Any:
            self.evaluations.append((actor.kind, [v.content_hash for v in eval_variants]))
            return evaluate(eval_variants, actor, *args)

        rollouts.evaluate = recorded  # type: ignore[method-assign]
        return rollouts


@pytest.mark.slow
def test_no_phase_before_the_final_evaluation_touches_validation_or_test(tmp_path: Path, tiny_config: Any) -> None:
    from agentflow_core.rl.trajectories import read_steps
    from tasks.steps.explore import run_explore
    from tasks.steps.train import run_train
    from tasks.steps.variants import run_variants

    torch.set_num_threads(1)  # BC and PPO on a shared 2-core machine: one thread avoids oversubscription
    cfg = tiny_config(train={"total_steps": 512})
    run_variants(PhaseContext.of(cfg), tmp_path / "variants")
    splits = {name: {v.content_hash for v in vs} for name, vs in read_splits(tmp_path / "variants").items()}
    explore_pools, rollouts = RecordingFactory(), RecordingRollouts()
    run_explore(PhaseContext.of(cfg), tmp_path / "variants", tmp_path / "traj", pool_factory=explore_pools)
    metrics = tmp_path / "train.json"
    summary = run_train(
        PhaseContext.of(cfg),
        tmp_path / "variants",
        tmp_path / "traj",
        tmp_path / "out",
        False,
        metrics_path=metrics,
        rollout_factory=rollouts,
    )
    rows = set(read_steps(tmp_path / "traj", vocabulary=CHECKOUT).column("variant_hash").to_pylist())
    assert explore_pools.pools and all(set(p) <= splits["train"] for p in explore_pools.pools)
    assert rows and rows <= splits["train"]  # so BC, which reads these rows, sees train variants only
    (training,) = rollouts.pools
    assert set(training) == splits["train"]
    # validation episodes during training, then the test split only after training ended (3 actors)
    # validation episodes during training, then the test split only after training ended: the trained policy, the
    # exploration actor and the rules, then the BC (and offline) actors on the same test episodes
    evaluations = rollouts.evaluations
    first_test = next(i for i, (_, v) in enumerate(evaluations) if set(v) <= splits["test"])
    validation, final = evaluations[:first_test], evaluations[first_test:]
    assert validation and all(kind == "greedy" and set(v) <= splits["validation"] for kind, v in validation)
    assert [kind for kind, _ in final[:3]] == ["greedy", "epsilon_greedy", "expert"]
    assert all(set(v) <= splits["test"] for _, v in final)
    assert summary["bc"]["used"] and summary["bc"]["samples"] > 0
    families = {"web_checkout", "order_db", "payment_api"}
    assert set(summary["test_process_success_by_family"]) == families
    assert set(summary["test"]["process_success"]["by_dimension"]["user_tier"]) == {"standard", "vip"}
    written = json.loads(metrics.read_text())
    for key in ("test_process_success", "test_goal_success", "test/process_success/order_db/ci95_low"):
        assert key in written, key
    assert written["test/process_success/network/packet_loss_5%"] == pytest.approx(
        summary["test"]["process_success"]["by_dimension"]["network"]["packet_loss_5%"]["rate"]
    )
