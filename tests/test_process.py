"""A business process as data: configs/processes/checkout.yaml is exactly the vocabulary the code carried.

The golden replay (tests/test_env_golden.py) drives every family with the expert built from this file
and must reproduce the recorded trajectories step for step; here the file's every part is compared to
the module constants it replaced, the cycle's phases are shown to read it, and malformed documents fail
with one line naming the file and the key.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from agentflow_core import semantics
from agentflow_core.envs.experts import DEFAULT_RULES, expert_for
from agentflow_core.errors import ConfigError, MappingError
from agentflow_core.evaluation.consistency import CANONICAL_STATES
from agentflow_core.process import ProcessSpec
from tasks.config_io import load_config, parse_config
from tasks.process_io import check_channels, check_config, load_process, process_path
from tasks.yaml_io import load_yaml_file

REPO = Path(__file__).resolve().parents[1]
CHECKOUT = REPO / "configs" / "processes" / "checkout.yaml"


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return load_yaml_file(CHECKOUT)


def test_checkout_file_is_the_code_vocabulary() -> None:
    process = load_process(name="checkout")
    vocab = process.vocabulary
    assert vocab == semantics.CHECKOUT
    assert vocab.tokens == semantics.TOKENS and vocab.actions == semantics.ACTIONS
    assert vocab.features == semantics.FEATURES and vocab.goal == semantics.GOAL_TOKEN
    assert vocab.action_risk[semantics.SemanticAction.CANCEL_ORDER] == 0.5
    assert vocab.action_risk[semantics.SemanticAction.SUBMIT_PAYMENT] == 0.1
    assert sum(vocab.action_risk) == pytest.approx(0.6)
    assert dict(vocab.handled_outcomes) == dict(semantics.HANDLED_OUTCOMES)
    assert process.expert_rules == tuple((t, int(a)) for t, a in DEFAULT_RULES)
    assert process.expert() == expert_for("any")
    assert process.probes == CANONICAL_STATES
    assert process.base_envs == ("web_checkout_v2", "order_db_v1", "payment_api_v1")
    assert vocab.obs_dim == semantics.OBS_DIM and vocab.n_actions == semantics.N_ACTIONS


def test_vocabulary_methods_agree_with_the_module_functions() -> None:
    rng = np.random.default_rng(0)
    vocab = semantics.CHECKOUT
    for _ in range(50):
        tokens = {t for t in semantics.TOKENS if rng.random() < 0.3}
        features = {f: float(rng.random()) for f in semantics.FEATURES}
        vec = vocab.encode(tokens, features)
        np.testing.assert_array_equal(vec, semantics.encode(tokens, features))
        assert vocab.decode_tokens(vec) == semantics.decode_tokens(vec) == frozenset(tokens)
        params = {"user_tier": str(rng.choice(["standard", "vip", "blocked"]))}
        assert vocab.process_success(params, tokens, True) == semantics.process_success(params, tokens, True)
    assert vocab.accepted_outcomes({"user_tier": "blocked"}) == {"PAYMENT_SUCCESS", "ESCALATED"}


def test_process_expert_acts_like_the_coded_one_on_random_states() -> None:
    rng = np.random.default_rng(1)
    coded, data = expert_for("order_db"), load_process(name="checkout").expert("order_db")
    obs = (rng.random((500, semantics.OBS_DIM)) < 0.25).astype(np.float32)
    masks = rng.random((500, semantics.N_ACTIONS)) < 0.7
    np.testing.assert_array_equal(coded.act_batch(obs, masks), data.act_batch(obs, masks))
    np.testing.assert_array_equal(coded.act_batch(obs), data.act_batch(obs))


def test_params_select_the_process_and_refuse_a_path(tmp_path: Path) -> None:
    assert load_config(REPO / "params.yaml").process == "checkout_v2"
    assert load_config(REPO / "params-checkout.yaml").process == "checkout"
    with pytest.raises(ConfigError, match=r"<params>: process: got '../etc'"):
        parse_config({"process": "../etc"})
    cfg = parse_config({"process": "nosuch"})
    with pytest.raises(ConfigError, match=r"nosuch\.yaml: <file>"):
        load_process(cfg)
    assert process_path("checkout").resolve() == CHECKOUT


def _fails(doc: dict[str, Any], key: str) -> str:
    with pytest.raises(ConfigError) as info:
        ProcessSpec.from_document(doc, "proc.yaml")
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"proc.yaml: {key}: "), message
    return message


def test_malformed_documents_name_the_file_and_key(document: dict[str, Any]) -> None:
    def changed(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        doc = copy.deepcopy(document)
        target = doc
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        return doc

    assert "no such key" in _fails({**document, "tokenz": []}, "tokenz")
    _fails({k: v for k, v in document.items() if k != "goal"}, "goal")
    _fails(changed(("goal",), "PAID"), "goal")
    _fails(changed(("tokens",), [*document["tokens"], "LOGGED_IN"]), "tokens")
    _fails(changed(("actions", 10, "risk"), 2.5), "actions.10.risk")
    _fails(changed(("actions", 10, "risk"), float("nan")), "actions.10.risk")
    _fails(changed(("expert", "rules", 3, "when"), "NOT_A_TOKEN"), "expert.rules.3.when")
    _fails(changed(("expert", "rules", 3, "act"), "DANCE"), "expert.rules.3.act")
    _fails(changed(("expert", "fallback"), "DANCE"), "expert.fallback")
    _fails(changed(("probes", 2, "tokens"), ["CART_FULL"]), "probes.2.tokens.0")
    _fails(changed(("probes", 2, "cart_items"), -1), "probes.2.cart_items")
    _fails(changed(("handled_outcomes", 0, "tokens"), ["SUPPORT"]), "handled_outcomes.0.tokens.0")
    _fails(changed(("channels", "order_db", "mapping"), "../../etc/passwd"), "channels.order_db.mapping")
    _fails(changed(("features", 0), "user logged in"), "features.0")
    _fails(changed(("legal_actions", "LOGIN", "any"), ["SIGNED_OUT"]), "legal_actions.LOGIN.any.0")
    _fails(changed(("features", 3, "observed_with"), ["NOT_A_TOKEN"]), "features.3.observed_with.0")
    _fails(changed(("supersedes", "ESCALATED"), ["NOPE"]), "supersedes.ESCALATED.0")


def test_the_checkout_yaml_declares_the_core_s_contract(document: dict[str, Any]) -> None:
    contract = ProcessSpec.from_document(document, "checkout.yaml").vocabulary.state_contract
    assert contract == semantics.CHECKOUT.state_contract
    assert contract.legal_actions({"LOGGED_OUT"}) == ("LOGIN", "ESCALATE")
    assert contract.feature("balance_ratio").observed_with == {"LOGGED_IN"}
    assert contract.canonical(frozenset({"ESCALATED", "USER_BLOCKED"})) == {"ESCALATED"}


def test_a_channel_mapping_outside_the_vocabulary_is_refused(document: dict[str, Any], tmp_path: Path) -> None:
    doc = copy.deepcopy(document)
    doc["tokens"] = [t for t in doc["tokens"] if t != "FUNDS_TOPPED_UP"]
    doc["expert"]["rules"] = [r for r in doc["expert"]["rules"] if r["when"] != "FUNDS_TOPPED_UP"]
    for rule in doc["legal_actions"].values():
        for kind in list(rule):
            rule[kind] = [t for t in rule[kind] if t != "FUNDS_TOPPED_UP"]
    process = ProcessSpec.from_document(doc, "short.yaml")
    with pytest.raises(MappingError, match=r"web_checkout_v2\.json: at \$\.token_rules: 'FUNDS_TOPPED_UP' is not in"):
        check_channels(process, REPO / "configs" / "envs")


def test_checkout_declares_the_fields_of_its_scenario_type() -> None:
    import dataclasses

    from agentflow_core.envs.base import Scenario

    declared = load_process(name="checkout").vocabulary.scenario
    assert declared.names == tuple(f.name for f in dataclasses.fields(Scenario))
    assert declared.defaults() == Scenario().to_dict()
    assert declared.with_role("dimension") == ("network", "user_tier", "start_stage")
    built = declared.build({"user_tier": "vip", "price_factor": 1})
    assert built["price_factor"] == 1.0 and isinstance(built["price_factor"], float)
    assert Scenario.from_dict(built) == Scenario(user_tier="vip")
    with pytest.raises(ValueError, match=r"scenario.user_tier: got 'gold', expected one of"):
        declared.build({"user_tier": "gold"})
    with pytest.raises(ValueError, match="unknown key"):
        declared.build({"plan": "annual"})


def test_scenario_declarations_are_checked(document: dict[str, Any]) -> None:
    def changed(field: str, **entry: Any) -> dict[str, Any]:
        doc = copy.deepcopy(document)
        doc["scenario"][field] = {**doc["scenario"].get(field, {}), **entry}
        return doc

    _fails(changed("user_tier", default="gold"), "scenario.user_tier.default")
    _fails(changed("price_factor", range=[2, 1]), "scenario.price_factor.range")
    _fails(changed("plan", type="date", default="x"), "scenario.plan.type")
    _fails(changed("plan", type="str", default="a", role="axis"), "scenario.plan.role")
    doc = copy.deepcopy(document)
    del doc["scenario"]["max_episode_steps"]
    _fails(doc, "scenario.max_episode_steps")
    doc = copy.deepcopy(document)
    doc["handled_outcomes"][0]["dimension"] = "plan"
    _fails(doc, "handled_outcomes.0.dimension")


def test_commands_check_the_config_against_the_selected_process(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from flows.cli.app import app

    params = tmp_path / "params.yaml"
    accepted = CliRunner().invoke(app, ["validate", "--params", str(REPO / "params-refund.yaml")])
    assert accepted.exit_code == 0, accepted.output
    # checkout's reward names are not refund's: refused at load, naming the key and the process's tokens
    text = (REPO / "params-checkout.yaml").read_text().replace("process: checkout", "process: refund", 1)
    text = text.replace("env_config_dir: configs/envs", "env_config_dir: configs/refund/envs", 1)
    params.write_text(text)
    refused = CliRunner().invoke(app, ["validate", "--params", str(params)], env={"COLUMNS": "300"})
    assert refused.exit_code == 2
    assert f"{params}: train.reward.token_rewards: got {{'PAYMENT_SUCCESS': 10.0}}" in " ".join(refused.output.split())
    assert "REFUND_ISSUED" in refused.output
    params.write_text((REPO / "params-checkout.yaml").read_text().replace("process: checkout", "process: nosuch", 1))
    missing = CliRunner().invoke(app, ["validate", "--params", str(params)], env={"COLUMNS": "300"})
    assert missing.exit_code == 2 and "nosuch.yaml: <file>" in missing.output


def test_validate_refuses_what_later_phases_would(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from flows.cli.app import app

    def validate(params: dict[str, Any]) -> str:
        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump(params))
        result = CliRunner().invoke(app, ["validate", "--params", str(path)], env={"COLUMNS": "300"})
        assert result.exit_code == 2, result.output
        return " ".join(result.output.split())

    base = yaml.safe_load((REPO / "params-refund.yaml").read_text())
    base["base"]["env_config_dir"] = str(REPO / "configs" / "refund" / "envs")
    # a dimension the process does not declare (checkout's, or none at all)
    plan = copy.deepcopy(base)
    plan["variants"]["dimensions"] = {"plan": ["monthly", "annual"]}
    assert "variants.dimensions.plan: got 'plan', expected a scenario field of the process" in validate(plan)
    tier = copy.deepcopy(base)
    tier["variants"]["dimensions"]["user_tier"] = ["standard", "blocked"]
    assert "variants.dimensions.user_tier" in validate(tier)
    # a declared field in the wrong role, and a value outside the declared ones
    steps = copy.deepcopy(base)
    steps["variants"]["dimensions"]["max_episode_steps"] = [10, 20]
    assert "a field the process declares as a dimension" in validate(steps)
    value = copy.deepcopy(base)
    value["variants"]["dimensions"]["account"] = ["ok", "vip"]
    assert "variants.dimensions.account: got 'vip', expected one of ['ok', 'flagged']" in validate(value)
    # sim-to-real on a family without a real channel; a coverage group that is no dimension
    real = copy.deepcopy(base)
    real["stress"]["sim_to_real"] = {"enabled": True, "families": ["web_checkout"]}  # checkout's, not refund's
    assert "stress.sim_to_real.families.0: got 'web_checkout'" in validate(real)
    real["stress"]["sim_to_real"]["families"] = ["refund_db"]  # refund's file names its real channels
    check_config(parse_config(real))
    group = copy.deepcopy(base)
    group["stress"]["coverage_group"] = "user_tier"
    assert "stress.coverage_group: got 'user_tier'" in validate(group)
    # an env config that names no process is an error, not silently checkout
    envs = tmp_path / "envs"
    shutil.copytree(REPO / "configs" / "refund" / "envs", envs)
    text = (envs / "refund_db_v1.yaml").read_text().replace("process: refund\n", "")
    (envs / "refund_db_v1.yaml").write_text(text)
    orphan = copy.deepcopy(base)
    orphan["base"]["env_config_dir"] = str(envs)
    assert "refund_db_v1.yaml: process: missing" in validate(orphan)


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"nosuch_db": {"kwargs": {"url": "pgserver"}}}, "real_channels"),
        ({"refund_db": {"kwargs": {"url": ["x"]}}}, "real_channels.refund_db.kwargs.url"),
        ({"refund_db": {"python": "import os"}}, "real_channels.refund_db.python"),
        ({"refund_api": {"service": "os:system"}}, "real_channels.refund_api.service"),
    ],
)
def test_a_process_names_its_real_channels_as_data(patch: dict[str, Any], key: str) -> None:
    document = load_yaml_file(REPO / "configs/processes/refund.yaml")
    real = ProcessSpec.from_document(document).real_channels
    assert [(r.family, r.kwargs, r.service) for r in real] == [
        ("refund_db", (("url", "pgserver"),), None),
        ("refund_api", (), "refund"),
    ]
    with pytest.raises(ConfigError) as info:
        ProcessSpec.from_document({**document, "real_channels": patch})
    assert info.value.key == key
