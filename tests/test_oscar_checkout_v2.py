"""checkout_v2 on the django-oscar store: the machine's oracle played on the simulator's web family and,
action for action with the same seed, on Oscar (agentflow_oscar.checkout_v2) through the site channel.

The store's outside world draws the episode's hidden causes from the machine's ``init`` with the seed the
channel posts, so the same seed gives the same customer on both sides: the token sets must agree at every
step, and a confirmed order must be in Oscar's tables, paid, confirmed and consistent.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentflow_core.registry import EnvEntry
from tasks.oscar_site import live_site, site_entry_of, site_pairing
from tasks.registry_io import load_registry

pytestmark = pytest.mark.slow
CONFIG_DIR = Path("configs/checkout_v2/oscar")
SIM_DIR = Path("configs/checkout_v2/envs")
BASE = {"card": "debit", "gateway": "stable", "customer": "returning", "account": "ok", "order_value": 120.0}


@pytest.fixture(scope="module")
def oscar() -> Iterator[EnvEntry]:
    with live_site(site_entry_of(CONFIG_DIR), CONFIG_DIR) as entry:
        yield entry


@pytest.fixture(scope="module")
def web() -> EnvEntry:
    return load_registry(config_dir=SIM_DIR).get("checkout_v2_web_v1")


def _names(entry: EnvEntry) -> list[str]:
    return [a if isinstance(a, str) else a.name for a in entry.vocabulary.actions]


def _seed_where(web: EnvEntry, params: dict[str, Any], hidden: Callable[[dict[str, Any]], bool]) -> int:
    """The first seed whose episode draws the hidden causes ``hidden`` asks for."""
    env = web.make(params, "checkout_v2_web_v1_probe")
    try:
        for seed in range(500):
            env.reset(seed=seed)
            if hidden(env.physical.sim.values):
                return seed
    finally:
        env.close()
    raise AssertionError("no seed under 500 draws these hidden causes")


def _oracle_on_both(web: EnvEntry, oscar: EnvEntry, params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The oracle's episode on the simulator's web form, replayed on Oscar; both sides' steps."""
    names = _names(web)
    sim = web.make(params, "checkout_v2_web_v1_golden")
    sim.reset(seed=seed)
    actions, sim_tokens, done, info = [], [], False, {}
    while not done:
        action = names.index(sim.physical.oracle_action())
        _, _, terminated, truncated, info = sim.step(action)
        actions.append(names[action])
        sim_tokens.append(sorted(info["tokens"]))
        done = terminated or truncated
    sim.close()
    real = oscar.make(params, "web_site_v1_oscar_checkout_v2_golden")
    real_tokens: list[list[str]] = []
    try:
        real.reset(seed=seed)
        for name in actions:
            _, _, terminated, truncated, real_info = real.step(names.index(name))
            real_tokens.append(sorted(real_info["tokens"]))
            if terminated or truncated:
                break
        outcome = real.physical.outcome
    finally:
        real.close()
    return {"actions": actions, "sim": sim_tokens, "real": real_tokens, "outcome": outcome, "sim_info": info}


def _assert_same(run: dict[str, Any]) -> None:
    for step, (name, sim, real) in enumerate(zip(run["actions"], run["sim"], run["real"], strict=False)):
        assert sim == real, f"step {step + 1} {name}: simulator {sim} vs Oscar {real}"
    assert len(run["real"]) == len(run["sim"])


def test_golden_order_is_in_oscars_database(web: EnvEntry, oscar: EnvEntry) -> None:
    seed = _seed_where(web, BASE, lambda v: not (v["addr_bad"] or v["partial"] or v["outage"] or v["card_bad"]))
    run = _oracle_on_both(web, oscar, BASE, seed)
    _assert_same(run)
    assert "ORDER_CONFIRMED" in run["real"][-1]
    order = run["outcome"]
    assert order["verified"] == 1 and order["status"] == "Confirmed" and order["orders"] == 1
    assert order["lines"] == [{"upc": "AF-001", "quantity": 5}] and order["sources"] == ["Sandbox card"]
    assert order["outcome"] == "goal"
    assert order["business_value"] == pytest.approx(run["sim_info"]["business_value"])


def test_bad_address_and_partial_stock_for_a_guest(web: EnvEntry, oscar: EnvEntry) -> None:
    params = {**BASE, "customer": "new", "order_value": 200.0}
    seed = _seed_where(web, params, lambda v: v["addr_bad"] and v["partial"] and not (v["outage"] or v["card_bad"]))
    run = _oracle_on_both(web, oscar, params, seed)
    _assert_same(run)
    seen = [t for tokens in run["real"] for t in tokens]
    assert {"NEW_CUSTOMER", "ADDRESS_INVALID", "PARTIAL_STOCK"} <= set(seen)
    assert "GUEST_CHECKOUT" in run["actions"] and "FIX_ADDRESS" in run["actions"]
    assert run["outcome"]["verified"] == 1


def test_gateway_outage_switches_route(web: EnvEntry, oscar: EnvEntry) -> None:
    params = {**BASE, "gateway": "flaky"}
    seed = _seed_where(web, params, lambda v: v["outage"] > 1 and not (v["card_bad"] or v["addr_bad"]))
    run = _oracle_on_both(web, oscar, params, seed)
    _assert_same(run)
    assert "SWITCH_ROUTE" in run["actions"] and "BACKUP_ROUTE" in run["real"][-1]


def test_decline_then_backup_card(web: EnvEntry, oscar: EnvEntry) -> None:
    seed = _seed_where(web, BASE, lambda v: v["card_bad"] and not (v["backup_bad"] or v["outage"]))
    names = _names(web)
    real = oscar.make(BASE, "web_site_v1_oscar_checkout_v2_decline")
    plan = ["ADD_TO_CART", "CHECKOUT", "SIGN_IN", "ENTER_ADDRESS", "CHECK_ADDRESS", "CHECK_STOCK"]
    try:
        real.reset(seed=seed)
        tokens = [sorted(real.step(names.index(a))[4]["tokens"]) for a in plan]
        if "PARTIAL_STOCK" in tokens[-1]:
            real.step(names.index("DROP_ITEM"))
        rest = ["CHOOSE_STANDARD", "SKIP_VOUCHER", "REVIEW_ORDER", "ENTER_PAYMENT", "VERIFY_3DS", "SUBMIT_PAYMENT"]
        tokens = [sorted(real.step(names.index(a))[4]["tokens"]) for a in rest]
        assert "CARD_DECLINED" in tokens[-1]
        assert "BACKUP_CARD" in real.step(names.index("USE_BACKUP_CARD"))[4]["tokens"]
        assert "PAID" in real.step(names.index("SUBMIT_PAYMENT"))[4]["tokens"]
        *_, terminated, _, info = real.step(names.index("CONFIRM_ORDER"))
        assert terminated and "ORDER_CONFIRMED" in info["tokens"]
        assert real.physical.outcome["sources"] == ["Sandbox card (backup)"]
    finally:
        real.close()


def test_flagged_account_is_escalated(web: EnvEntry, oscar: EnvEntry) -> None:
    params = {**BASE, "account": "flagged"}
    seed = _seed_where(web, params, lambda v: not v["partial"])
    run = _oracle_on_both(web, oscar, params, seed)
    _assert_same(run)
    assert "ACCOUNT_REVIEW" in [t for tokens in run["real"] for t in tokens]
    assert "ESCALATED" in run["real"][-1] and run["outcome"]["outcome"] == "handled"
    assert run["outcome"]["orders"] == 0


def test_pairing_is_read_from_the_env_config() -> None:
    entry = site_entry_of(CONFIG_DIR)
    assert entry.process == "checkout_v2"
    assert site_pairing(entry, ["card"]) == (
        "checkout_v2_web",
        ["card", "gateway", "customer", "account", "order_value"],
    )
    assert site_pairing(site_entry_of(Path("configs/oscar")), ["network"]) == ("web_checkout", ["network"])


def test_envs_check_audits_the_checkout_v2_mapping_against_the_store() -> None:
    from flows.cli.envs import check_config_dir

    (result,) = check_config_dir(CONFIG_DIR)
    assert result.ok, (result.errors, result.findings)


def test_the_stress_phase_plays_checkout_v2_on_oscar_next_to_its_web_family(tmp_path: Path) -> None:
    import types

    import yaml

    from agentflow_core.variants import VariantSpec
    from tasks.config_io import load_config
    from tasks.context import PhaseContext
    from tasks.real_channels import run_sim_to_real_oscar

    params = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text())
    params["base"].update(state_dir=str(tmp_path / ".agentflow"), data_dir=str(tmp_path / "data"))
    params.setdefault("stress", {})["sim_to_real"] = {
        "enabled": True,
        "oscar_episodes": 3,
        "oscar_env_config_dir": str(CONFIG_DIR),
        "oscar_dimensions": ["card", "account"],
    }
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    ctx = PhaseContext.of(load_config(path))
    rules = ctx.process.expert("checkout_v2_web")
    policy = types.SimpleNamespace(act=rules.act_batch)
    sample = [
        VariantSpec(f"checkout_v2_web_v1_t{i}", "checkout_v2_web_v1", family, {**BASE, **change}, f"h{i}")
        for i, (family, change) in enumerate(
            [
                ("checkout_v2_web", {"card": "credit", "order_value": 60.0}),
                ("checkout_v2_web", {"account": "flagged"}),
                ("checkout_v2_sim", {}),  # another family: never played on Oscar
                ("checkout_v2_web", {"card": "prepaid", "order_value": 40.0}),
            ]
        )
    ]
    report = run_sim_to_real_oscar(ctx, policy, sample)
    assert report["episodes"] == 3
    assert report["gap"] == pytest.approx(report["sim_process_success"] - report["real_process_success"])
    assert {row["dimension"] for row in report["per_dimension"]} == {"card", "account"}
    assert report["metrics"]["real_process_success_oscar"] == report["real_process_success"]
    assert report["paired_family"] == "checkout_v2_web" and 0.0 <= report["identical_fraction"] <= 1.0
    assert report["sim_business_value"] > 0 and report["real_business_value"] > 0  # both sides price the episodes


def test_preflight_refuses_an_oscar_registry_of_another_process(local_config: Any) -> None:
    from tasks.preflight import check_oscar_store, preflight

    oscar = {"enabled": True, "oscar_episodes": 2, "oscar_env_config_dir": str(CONFIG_DIR)}
    cfg = local_config(stress={"sim_to_real": oscar})  # the checkout process
    problem = check_oscar_store(cfg).problem
    assert problem is not None and "serves process 'checkout_v2', the run is 'checkout'" in problem
    assert any("(stress sim-to-real on Oscar)" in c.requirement for c in preflight(cfg))  # its Chromium is checked
    same = local_config(stress={"sim_to_real": {**oscar, "oscar_env_config_dir": "configs/oscar"}})
    assert check_oscar_store(same).ok
