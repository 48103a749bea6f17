"""checkout_v2: the checkout world with costs, patience and hidden causes (configs/processes/checkout_v2.yaml).

A golden trajectory per reference policy on a variant whose hidden state is pinned, the oracle's
choices where the hidden state differs from what the operator sees, the oracle as an upper bound of
the rules on the same episodes, and the oracle kept out of training: exploration and the BC data
never ask an env for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from agentflow_core.envs.state_machine import StateMachineEnv
from agentflow_core.pool.batch import oracle_action
from agentflow_core.pool.episodes import EXPERT, ORACLE, ActorSpec, EpisodePlayer, EvalRequest, episode_seed
from agentflow_core.pool.worker import EnvWorker
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.steps.train_references import oracle_available

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "params.yaml"
ENV = "checkout_v2_sim_v1"
FAMILY = "checkout_v2_sim"
# the hidden causes switched off: no bad address, full stock, no outage, cards that pay, a patient customer
CALM = {"addr_bad": 0.0, "partial": 0.0, "outage": 0.0, "card_bad": 0.0, "backup_bad": 0.0, "has_voucher": 0.0}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory: pytest.TempPathFactory) -> PhaseContext:
    params = yaml.safe_load(PARAMS.read_text())
    root = tmp_path_factory.mktemp("checkout_v2")
    params["base"].update(state_dir=str(root / ".agentflow"), data_dir=str(root / "data"))
    params["base"]["env_config_dir"] = str(REPO / "configs" / "checkout_v2" / "envs")
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return PhaseContext.of(load_config(path))


def _env(ctx: PhaseContext, **params: Any) -> Any:
    variant = {"card": "debit", "gateway": "stable", "customer": "returning", "account": "ok", "order_value": 80.0}
    return ctx.registry.get(ENV).make({**variant, **params})


def _play(ctx: PhaseContext, env: Any, policy: str, hidden: dict[str, float]) -> tuple[list[str], dict[str, Any]]:
    obs, _ = env.reset(seed=0)
    env.physical.values.update(hidden)
    obs = env.physical._observation(None, True)
    obs = env._observe(obs).vec
    expert = ctx.process.expert(FAMILY)
    names, info, done = [], {}, False
    while not done:
        action = expert.act(obs, env.action_masks()) if policy == "rules" else oracle_action(env)
        names.append(ctx.vocabulary.actions[action])
        obs, _, terminated, truncated, info = env.step(action)
        done = terminated or truncated
    return names, info


def test_golden_trajectories_of_the_rules_and_the_oracle(ctx: PhaseContext) -> None:
    funnel = ["ENTER_ADDRESS", "CHECK_ADDRESS", "CHECK_STOCK", "CHOOSE_STANDARD", "SKIP_VOUCHER", "REVIEW_ORDER"]
    rules, info = _play(ctx, _env(ctx), "rules", {**CALM, "patience": 30.0})
    # a returning customer: the rules sign in (0.5); costs 0.2 + 0.2 + 0.5 + 0.5 + 1 + 0.5 + 0.2 + 1 = 4.1
    assert rules == ["ADD_TO_CART", "CHECKOUT", "SIGN_IN", *funnel, "ENTER_PAYMENT", "SUBMIT_PAYMENT", "CONFIRM_ORDER"]
    assert info["outcome"] == "goal" and info["business_value"] == pytest.approx(80.0 - 4.1)
    oracle, info = _play(ctx, _env(ctx), "oracle", {**CALM, "patience": 30.0})
    # the oracle knows the address is good: a guest checkout saves the sign-in
    assert oracle == ["ADD_TO_CART", "CHECKOUT", "GUEST_CHECKOUT", *funnel, "ENTER_PAYMENT", "SUBMIT_PAYMENT"] + [
        "CONFIRM_ORDER"
    ]
    assert info["business_value"] == pytest.approx(80.0 - 3.6)


def test_partial_stock_outage_and_declines_cost_the_rules(ctx: PhaseContext) -> None:
    # partial stock: the rules drop the item (value x 0.6), the oracle splits the shipment (cost 4)
    rules, info = _play(ctx, _env(ctx), "rules", {**CALM, "partial": 1.0, "patience": 30.0})
    assert "DROP_ITEM" in rules and info["business_value"] == pytest.approx(80.0 * 0.6 - 4.1)
    oracle, info = _play(ctx, _env(ctx), "oracle", {**CALM, "partial": 1.0, "patience": 30.0})
    assert "SPLIT_SHIPMENT" in oracle and info["business_value"] == pytest.approx(80.0 - 3.6 - 4.0)
    # a long outage: the rules retry three times before switching route, the oracle switches at once
    rules, _ = _play(ctx, _env(ctx), "rules", {**CALM, "outage": 8.0, "patience": 40.0})
    assert rules[rules.index("ENTER_PAYMENT") + 1 :][:4] == ["SUBMIT_PAYMENT"] * 3 + ["SWITCH_ROUTE"]
    oracle, _ = _play(ctx, _env(ctx), "oracle", {**CALM, "outage": 8.0, "patience": 40.0})
    assert oracle[oracle.index("ENTER_PAYMENT") + 1] == "SWITCH_ROUTE"
    # card and backup card both declined: the rules hand over to support (0.4 x value), the oracle goes to transfer
    _, info = _play(ctx, _env(ctx), "rules", {**CALM, "card_bad": 1.0, "backup_bad": 1.0, "patience": 40.0})
    assert info["outcome"] == "handled"
    oracle, _ = _play(ctx, _env(ctx), "oracle", {**CALM, "card_bad": 1.0, "backup_bad": 1.0, "patience": 40.0})
    assert "BANK_TRANSFER" in oracle and "USE_BACKUP_CARD" not in oracle


def test_patience_runs_out(ctx: PhaseContext) -> None:
    names, info = _play(ctx, _env(ctx), "rules", {**CALM, "patience": 5.0})
    assert len(names) == 5 and info["outcome"] == "abandoned"
    assert info["business_value"] == pytest.approx(-(0.2 + 0.2 + 0.5 + 0.5 + 1.0))


def _evaluate(ctx: PhaseContext, spec: ActorSpec, n: int) -> list[Any]:
    from tasks.compose import env_factory

    variants = _variants()
    worker = EnvWorker(env_factory(ctx, variants), {}, 64, 5.0)
    keys = {1000 + i: v for i, v in enumerate(variants)}
    episodes = [(i, j, 1000 + i, episode_seed(3, i, j)) for i in range(len(variants)) for j in range(n)]
    request = EvalRequest(keys, episodes, spec, num_slots=8, seed=3)
    try:
        return EpisodePlayer(worker).play(request, None)
    finally:
        worker.close()


def _variants() -> list[Any]:
    from agentflow_core.variants import VariantSpec, content_hash

    out = []
    for card in ("debit", "prepaid"):
        for gateway in ("stable", "flaky"):
            for customer in ("returning", "new"):
                params = {"card": card, "gateway": gateway, "customer": customer, "account": "ok", "order_value": 150.0}
                env_id = f"{ENV}_{card}_{gateway}_{customer}"
                out.append(VariantSpec(env_id, ENV, FAMILY, params, content_hash(ENV, params)))
    return out


def test_the_oracle_bounds_the_rules_on_the_same_episodes(ctx: PhaseContext) -> None:
    experts = ((FAMILY, ctx.process.expert(FAMILY)),)
    rules = _evaluate(ctx, ActorSpec(EXPERT, experts=experts), 6)
    oracle = _evaluate(ctx, ActorSpec(ORACLE), 6)
    assert len(rules) == len(oracle) == 48
    assert all(r.business_value is not None for r in rules + oracle)
    v_rules = np.mean([r.business_value for r in rules])
    v_oracle = np.mean([r.business_value for r in oracle])
    assert v_oracle > v_rules
    assert np.mean([r.length for r in rules]) >= 12


def test_exploration_and_the_bc_data_never_ask_for_the_oracle(
    ctx: PhaseContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agentflow_core.rl.trajectories import behaviour_cloning_arrays
    from agentflow_core.splits import read_splits
    from tasks.steps.explore import run_explore
    from tasks.steps.variants import run_variants

    calls = []
    real = StateMachineEnv.oracle_action

    def counted(self: StateMachineEnv) -> str:
        calls.append(1)
        return real(self)

    monkeypatch.setattr(StateMachineEnv, "oracle_action", counted)
    cfg = ctx.cfg.model_copy(
        update={"explore": ctx.cfg.explore.model_copy(update={"total_steps": 600, "min_state_coverage": 0.0})}
    )
    run_ctx = PhaseContext.of(cfg)
    catalogue, trajectories = tmp_path / "variants", tmp_path / "trajectories"
    run_variants(run_ctx, catalogue)
    run_explore(run_ctx, catalogue, trajectories)
    accepted = {v.content_hash: ctx.vocabulary.accepted_outcomes(v.params) for v in read_splits(catalogue)["train"]}
    obs, actions, _ = behaviour_cloning_arrays(trajectories, accepted, ctx.vocabulary)
    assert len(actions) > 0 and not calls  # exploration (around the rules) and BC's data: no oracle call
    env = _env(ctx)
    env.reset(seed=0)
    oracle_action(env)
    assert calls == [1]  # the count sees a call where one is made


@pytest.mark.parametrize("channel", ["checkout_v2_web_v1", "checkout_v2_rows_v1", "checkout_v2_http_v1"])
def test_the_oracle_plays_the_simulator_s_episode_on_every_channel(ctx: PhaseContext, channel: str) -> None:
    variant = {"card": "prepaid", "gateway": "flaky", "customer": "new", "account": "ok", "order_value": 150.0}

    def oracle_episode(env_id: str, seed: int) -> tuple[list[int], float]:
        env = ctx.registry.get(env_id).make(variant)
        try:
            env.reset(seed=seed)
            actions, info, done = [], {}, False
            while not done:
                actions.append(oracle_action(env))
                _, _, terminated, truncated, info = env.step(actions[-1])
                done = terminated or truncated
            return actions, float(info["business_value"])
        finally:
            env.close()

    for seed in (0, 1, 2):
        assert oracle_episode(channel, seed) == oracle_episode(ENV, seed)
    assert oracle_available(ctx)
