"""The checkout on a django-oscar store through Chromium: golden episodes, faults, the order in Oscar's DB.

The store runs in its own process (tasks.oscar_site.oscar_store); every episode restores its database.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.registry import EnvEntry
from agentflow_core.semantics import SemanticAction
from tasks.oscar_site import oscar_entry, oscar_store
from tasks.registry_io import load_registry

pytestmark = pytest.mark.slow
OSCAR_ENVS = Path("configs/oscar")
EXPERT = [
    ("NETWORK_TIMEOUT", "RETRY"),
    ("SERVER_ERROR", "RETRY"),
    ("LOGGED_OUT", "LOGIN"),
    ("PAYMENT_PAGE", "SUBMIT_PAYMENT"),
    ("ORDER_PENDING", "ENTER_PAYMENT"),
    ("CART_FILLED", "CHECKOUT"),
    ("OUT_OF_STOCK", "VIEW_PRODUCT"),
    ("PRODUCT_VIEWED", "ADD_TO_CART"),
]


@pytest.fixture(scope="module")
def store_url() -> Iterator[str]:
    # never skipped: make install / .ci/run install Chromium (bin/ensure-system-deps), or say why they cannot
    assert Path("/usr/bin/chromium").exists(), "Chromium is not installed (apt-get install -y chromium)"
    with oscar_store() as url:
        yield url


@pytest.fixture(scope="module")
def entry(store_url: str) -> EnvEntry:
    return oscar_entry(OSCAR_ENVS, store_url)


def _with_faults(entry: EnvEntry, faults: dict[str, Any]) -> EnvEntry:
    return dataclasses.replace(entry, kwargs={**entry.kwargs, "faults": faults})


def _expert_action(info: dict[str, Any]) -> int:
    tokens, mask = set(info["tokens"]), info["action_mask"]
    for token, name in EXPERT:
        if token in tokens and mask[SemanticAction[name]]:
            return int(SemanticAction[name])
    return int(SemanticAction.VIEW_PRODUCT)


def _play(env: SemanticEnv, seed: int, max_steps: int = 15) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    _, info = env.reset(seed=seed)
    actions, tokens = [], [list(info["tokens"])]
    done = False
    while not done and len(actions) < max_steps:
        action = _expert_action(info)
        _, _, terminated, truncated, info = env.step(action)
        actions.append(SemanticAction(action).name)
        tokens.append(list(info["tokens"]))
        done = terminated or truncated
    return actions, tokens, info


def _order(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/__agentflow__/order/") as response:  # noqa: S310 - loopback test store
        return dict(json.loads(response.read()))


def test_golden_episode_gives_the_simulators_tokens_and_an_order_in_oscars_db(entry: EnvEntry, store_url: str) -> None:
    sim = load_registry().get("web_checkout_v2").make({"card_decline_rate": 0.0})
    real = entry.make({})
    try:
        sim_run, real_run = _play(sim, seed=7), _play(real, seed=7)
    finally:
        sim.close()
        real.close()
    assert real_run[0] == ["LOGIN", "VIEW_PRODUCT", "ADD_TO_CART", "CHECKOUT", "ENTER_PAYMENT", "SUBMIT_PAYMENT"]
    assert real_run[:2] == sim_run[:2]  # the same semantic actions give the same tokens
    assert real_run[2]["outcome"]["verified"] == 1
    order = _order(store_url)
    assert order["orders"] == 1 and order["lines"] == [{"upc": "AF-001", "quantity": 1, "line_price_incl_tax": "25.00"}]
    assert order["total_incl_tax"] == "25.00"


def test_out_of_stock_then_another_product_and_price_factor_in_the_order(entry: EnvEntry, store_url: str) -> None:
    env = entry.make({"inventory": 0, "price_factor": 2.0})
    try:
        actions, tokens, info = _play(env, seed=1)
    finally:
        env.close()
    assert "OUT_OF_STOCK" in tokens[2] and "PAYMENT_SUCCESS" in tokens[-1]
    assert actions[:3] == ["LOGIN", "VIEW_PRODUCT", "VIEW_PRODUCT"]
    order = _order(store_url)
    assert order["lines"] == [{"upc": "AF-002", "quantity": 1, "line_price_incl_tax": "37.00"}]
    assert order["verified"] == 1


def test_reset_restores_the_database_and_is_fast(entry: EnvEntry, store_url: str) -> None:
    env = entry.make({})
    try:
        _play(env, seed=2)
        assert _order(store_url)["orders"] == 1
        started = time.perf_counter()
        _, info = env.reset(seed=3)
        elapsed = time.perf_counter() - started
    finally:
        env.close()
    assert _order(store_url)["orders"] == 0
    assert info["tokens"] == ["LOGGED_OUT"]
    assert elapsed < 5.0  # the target is 1 s on a quiet machine; this only catches a reset that rebuilds


@pytest.mark.parametrize(
    ("faults", "token"),
    [
        ({"drop_rate": 1.0}, "NETWORK_TIMEOUT"),
        ({"latency_s": 1.5}, "NETWORK_TIMEOUT"),
        ({"server_error_rate": 1.0}, "SERVER_ERROR"),
    ],
)
def test_network_faults_show_their_token_and_send_nothing(entry: EnvEntry, faults: dict[str, Any], token: str) -> None:
    env = _with_faults(entry, faults).make({})
    try:
        _, info = env.reset(seed=0)
        _, _, terminated, _, info = env.step(int(SemanticAction.LOGIN))
    finally:
        env.close()
    assert token in info["tokens"] and "LOGGED_OUT" in info["tokens"]
    assert info["action_mask"][SemanticAction.RETRY] and not terminated


def test_slow_payment_step_times_out_then_retry_places_one_order(entry: EnvEntry, store_url: str) -> None:
    env = _with_faults(entry, {"slow_paths": {"^/checkout/preview/$": 0.4}, "latency_s": 0.0}).make(
        {"network": "normal"}
    )
    try:
        started = time.perf_counter()
        actions, tokens, info = _play(env, seed=4)
        elapsed = time.perf_counter() - started
    finally:
        env.close()
    assert "PAYMENT_SUCCESS" in tokens[-1]
    assert elapsed > 0.8  # the preview page is requested twice (GET, then the POST that places the order)
    assert _order(store_url)["orders"] == 1


def test_timed_out_step_is_retried_from_where_it_stopped(entry: EnvEntry, store_url: str) -> None:
    env = _with_faults(entry, {"slow_paths": {"^/checkout/preview/$": 1.5}}).make({})
    try:
        actions, tokens, info = _play(env, seed=5, max_steps=8)
    finally:
        env.close()
    assert actions[:5] == ["LOGIN", "VIEW_PRODUCT", "ADD_TO_CART", "CHECKOUT", "ENTER_PAYMENT"]
    assert "NETWORK_TIMEOUT" in tokens[5] and actions[5] == "RETRY"
    assert _order(store_url)["orders"] == 0  # a timed-out request never reached the store


def test_a_503_on_placing_the_order_then_retry_places_exactly_one_verified_order(
    entry: EnvEntry, store_url: str
) -> None:
    env = _with_faults(entry, {"server_error_rate": 1.0}).make({"start_stage": "payment"})
    try:
        _, info = env.reset(seed=6)  # the start stage is reached on a clean network
        assert "PAYMENT_PAGE" in info["tokens"]
        _, _, terminated, _, info = env.step(int(SemanticAction.SUBMIT_PAYMENT))
        assert "SERVER_ERROR" in info["tokens"] and not terminated
        assert _order(store_url)["orders"] == 0  # the 503 came from the network layer: Oscar saw nothing
        env.physical.extra_faults = {}  # type: ignore[attr-defined]  # the server is back
        _, reward, terminated, _, info = env.step(int(SemanticAction.RETRY))
    finally:
        env.close()
    assert terminated and "PAYMENT_SUCCESS" in info["tokens"] and reward > 0
    order = _order(store_url)
    assert order["orders"] == 1 and order["verified"] == 1


def test_envs_check_starts_the_store_and_audits_the_mapping_against_oscars_recorded_pages() -> None:
    from agentflow_core.errors import RequirementError
    from flows.cli.envs import check_config_dir, check_site_entry

    (result,) = check_config_dir(OSCAR_ENVS)
    assert result.ok, (result.errors, result.findings)
    missing = dataclasses.replace(
        load_registry(config_dir=OSCAR_ENVS).get("web_site_v1_oscar"),
        kwargs={"chromium_path": "/nonexistent/chromium", "site_spec": "site/site.json"},
    )
    with pytest.raises(RequirementError, match="needs Chromium at /nonexistent/chromium"):
        check_site_entry(missing, OSCAR_ENVS)


def test_train_on_oscar_continues_a_policy_and_measures_the_gap_before_and_after(
    tmp_path: Path, local_config: Any
) -> None:
    from agentflow_core.rl.checkpoint import save_checkpoint
    from agentflow_core.rl.policy import ActorCritic
    from agentflow_core.semantics import CHECKOUT, VOCAB_VERSION
    from tasks.context import PhaseContext
    from tasks.oscar_finetune import finetune_on_oscar
    from tasks.rollout import load_policy

    short = tmp_path / "oscar"  # the Oscar registry with short episodes: an untrained policy wanders
    shutil.copytree(OSCAR_ENVS, short)
    config = short / "web_site_v1_oscar.yaml"
    config.write_text(config.read_text().replace("max_episode_steps: 50", "max_episode_steps: 8"))
    oscar = {"enabled": True, "oscar_episodes": 2, "oscar_env_config_dir": str(short)}
    cfg = local_config(stress={"variants": 40, "sim_to_real": oscar}, variants={"samples_per_combination": 1})
    start = save_checkpoint(
        tmp_path / "start",
        "update_00000000",
        ActorCritic(CHECKOUT.obs_dim, CHECKOUT.n_actions).state_dict(),
        {},
        {"vocab_version": VOCAB_VERSION, "hidden_sizes": [64, 64]},
    )
    ctx = PhaseContext.of(cfg)
    summary = finetune_on_oscar(ctx, str(start), tmp_path / "out", total_steps=16)
    assert summary["total_steps"] == 16 and len(summary["curve"]) == 1
    assert summary["before"]["episodes"] == summary["after"]["episodes"] == 2
    for side in ("before", "after"):
        run = summary[side]
        assert run["gap"] == pytest.approx(run["sim_process_success"] - run["real_process_success"])
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["metrics"] == summary["metrics"]
    assert load_policy(summary["finetuned"]["checkpoint"], ctx.process).checkpoint == summary["finetuned"]["checkpoint"]
