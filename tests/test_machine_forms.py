"""One machine, three raw forms: a web form, SQL rows and an HTTP service run the simulator's business logic.

For the same seed and the same actions, each form must give the simulator's rewards, terminations and
step information (costs, business value, outcome) and, through its own mapping, the same tokens,
features and legal actions -- with faults on, since a seed fixes the machine's draws on every form.
The raw data must look like the form's own (a page, rows, an HTTP exchange with its status codes).
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

from agentflow_core.adapters.api import APISchemaAdapter
from agentflow_core.adapters.audit import audit_entry, errors_only
from agentflow_core.envs.machine_http import MachineHttpEnv
from agentflow_core.envs.machine_service import MachineService, machine_id, openapi_document, shared_service
from agentflow_core.envs.machine_sql import SELECT_ALL, MachineSQLEnv
from agentflow_core.envs.machine_web import MachineWebEnv
from agentflow_core.envs.state_machine import StateMachineEnv
from agentflow_core.process import ProcessSpec
from agentflow_core.registry import EnvRegistry
from flows.cli.app import app
from tasks.config_io import parse_config
from tasks.machine_forms import FormsError, translate_condition
from tasks.process_io import load_process
from tasks.process_scaffold import write_scaffold
from tasks.registry_io import load_registry
from tests.test_channel_equivalence import scaffold_env_dir

FORMS = ("web", "rows", "http")
SEEDS = (0, 1, 2)
# a small machine with a hidden variable and a certain fault under a scenario flag
TOY: dict[str, Any] = {
    "variables": {
        "stage": {"init": "0"},
        "outage": {"init": {"uniform_int": ["0", "2"]}, "hidden": True},
        "failures": {"init": "0"},
    },
    "faults": [{"p": "drop", "reason": "dropped"}],
    "actions": {
        "ADVANCE": {
            "when": "stage < 2",
            "reason": "finished",
            "cost": "1",
            "outcomes": [
                {"when": "outage > 0", "set": {"failures": "failures + 1", "outage": "outage - 1"}, "reason": "down"},
                {"set": {"stage": "stage + 1"}},
            ],
        },
        "QUIT": {"faults": False, "cost": "3", "set": {"stage": "9"}},
    },
    "terminals": [
        {"when": "stage == 2", "outcome": "goal", "value": "10"},
        {"when": "stage == 9", "outcome": "failed", "value": "0"},
    ],
    "reward": {"scale": 0.1},
}
SCENARIO = {"drop": 0.0, "max_episode_steps": 10}


class Fields:
    """Scenario values as the envs read them."""

    def __init__(self, **values: Any) -> None:
        self.values = values

    @property
    def max_episode_steps(self) -> int:
        return int(self.values["max_episode_steps"])

    def to_dict(self) -> dict[str, Any]:
        return dict(self.values)


@pytest.fixture(scope="module")
def scaffold(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProcessSpec, EnvRegistry]:
    env_dir = scaffold_env_dir(tmp_path_factory.mktemp("forms"))
    cfg = parse_config({"process": "scaffold", "base": {"env_config_dir": str(env_dir)}})
    return load_process(cfg), load_registry(cfg)


def _run(registry: EnvRegistry, env: str, names: list[str], actions: list[str], seed: int) -> list[tuple[Any, ...]]:
    """Each step of a fixed action sequence: tokens, features, mask, reward, ends and the machine's info."""
    entry = registry.get(env)
    sem = entry.make({"network": "packet_loss_5%", "plan": "annual"})
    try:
        _, info = sem.reset(seed=seed)
        out: list[tuple[Any, ...]] = [(sorted(info["tokens"]), tuple(info["action_mask"]))]
        for name in actions:
            _, reward, terminated, truncated, info = sem.step(names.index(name))
            last = sem.last_obs
            assert last is not None
            features = {k: round(v, 6) for k, v in last.features.items()}
            machine = (info.get("cost"), info.get("business_value"), info.get("outcome"), info.get("failure_reason"))
            out.append((sorted(info["tokens"]), features, tuple(info["action_mask"]), round(reward, 6), machine))
            if terminated or truncated:
                out.append(("end", terminated, truncated))
                break
        return out
    finally:
        sem.close()


def test_every_form_gives_the_simulator_s_episode_for_a_seed_with_faults_on(
    scaffold: tuple[ProcessSpec, EnvRegistry],
) -> None:
    process, registry = scaffold
    rng = np.random.default_rng(0)
    names = list(process.vocabulary.actions)
    for seed in SEEDS:
        actions = [str(a) for a in rng.choice(names[:4], size=12)] + ["CANCEL", "ESCALATE"]
        reference = _run(registry, "scaffold_sim_v1", names, actions, seed)
        for form in FORMS:
            assert _run(registry, f"scaffold_{form}_v1", names, actions, seed) == reference, (form, seed)


def test_the_forms_pass_the_mapping_audit_and_gymnasium_s_checks(scaffold: tuple[ProcessSpec, EnvRegistry]) -> None:
    _, registry = scaffold
    for form in FORMS:
        entry = registry.get(f"scaffold_{form}_v1")
        env = entry.make({"network": "packet_loss_5%", "plan": "annual"})
        check_env(env, skip_render_check=True)  # spaces, and reset/step deterministic for a seed
        env.close()
        findings = audit_entry(entry)
        assert errors_only(findings) == [], (form, findings)
        assert not [f for f in findings if f.kind == "unproducible_token"], form


def test_each_form_s_compiled_mapping_is_its_reference_on_random_steps(
    scaffold: tuple[ProcessSpec, EnvRegistry],
) -> None:
    _, registry = scaffold
    rng = np.random.default_rng(1)
    for form in FORMS:
        sem = registry.get(f"scaffold_{form}_v1").make({"network": "packet_loss_5%", "plan": "annual"})
        try:
            for seed in range(4):
                sem.reset(seed=seed)
                for _ in range(10):
                    _, _, terminated, truncated, _ = sem.step(int(rng.integers(sem.vocabulary.n_actions)))
                    raw, adapter = sem._raw, sem.adapter
                    reference, fast = adapter.reference_observation(raw, {}), adapter.adapt_observation(raw, {})
                    assert fast.tokens == reference.tokens and fast.features == reference.features, (form, raw)
                    assert np.array_equal(adapter.action_mask(raw), adapter.reference_action_mask(raw)), (form, raw)
                    if terminated or truncated:
                        break
        finally:
            sem.close()


def _toy(form: str, drop: float = 0.0) -> Any:
    scenario = Fields(drop=drop, max_episode_steps=10)
    if form == "web":
        return MachineWebEnv(scenario, "toy_web_v1", TOY)
    if form == "rows":
        return MachineSQLEnv(scenario, "toy_rows_v1", TOY)
    return MachineHttpEnv(scenario, "toy_http_v1", TOY)


def test_the_raw_forms_look_nothing_alike_and_hide_hidden_variables() -> None:
    web, rows, http = _toy("web"), _toy("rows"), _toy("http")
    try:
        page, _ = web.reset(seed=4)
        assert page["fields"] == {"stage": "0", "failures": "0"} and page["banner"] is None
        assert page["buttons"] == ["#advance", "#quit"] and page["page"] == "form"
        table, _ = rows.reset(seed=4)
        assert table == {
            "machine_variable": {"failures": {"value": 0.0}, "stage": {"value": 0.0}},
            "machine_event": {"action": None, "reason": None, "applied": 1},
        }
        stored = dict(rows.db.rows(SELECT_ALL, {}))
        assert set(stored) == {"stage", "outage", "failures"}  # the hidden variable is a row, never observed
        exchange, _ = http.reset(seed=4)
        assert exchange["status_code"] == 201 and exchange["json"]["record"] == {"stage": 0.0, "failures": 0.0}
        page = web.step({"type": "click", "target": "#nowhere"}).obs
        assert page["banner"] == {"kind": "error", "text": "Unknown action."}
        for _ in range(5):  # the hidden outage (0 to 2 steps) first, then two stages
            page = web.step({"type": "click", "target": "#advance"}).obs
            rows.step({"type": "transaction", "action": "ADVANCE"})
            reply = http.step({"type": "http", "method": "POST", "path": "/sessions/{session}/actions/ADVANCE"})
            if page["page"] != "form":
                break
        assert page["page"] == "goal" and rows.sim.values["stage"] == 2.0
        assert reply.terminated and reply.obs["json"]["result"]["outcome"] == "goal"
        service = shared_service().state
        live = len(service)
        http.reset(seed=5)  # the last session is ended, the new one opened
        assert len(service) == live
    finally:
        web.close(), rows.close(), http.close()


def test_the_service_answers_refusals_and_faults_with_their_status_codes() -> None:
    inapplicable = _toy("http")
    dropped = _toy("http", drop=1.0)
    try:
        inapplicable.reset(seed=0)
        quit_ = inapplicable.step({"type": "http", "operation": "QUIT"})
        assert quit_.obs["status_code"] == 200 and quit_.terminated and quit_.info["outcome"] == "failed"
        assert quit_.info["business_value"] == -3.0
        dropped.reset(seed=0)
        step = dropped.step({"type": "http", "operation": "ADVANCE"})
        assert step.obs["status_code"] == 503 and step.info["failure_reason"] == "dropped"
        assert step.obs["json"]["error"]["code"] == "dropped" and step.info["cost"] == 1.0
    finally:
        inapplicable.close(), dropped.close()
    service = MachineService().start()
    try:
        service.state.register(machine_id(TOY), TOY)
        status, body = _call(
            service.url, "POST", f"/machines/{machine_id(TOY)}/sessions", {"seed": 0, "scenario": SCENARIO}
        )
        assert status == 201
        session = body["session"]["id"]
        assert _call(service.url, "POST", f"/sessions/{session}/actions/ADVANCE")[0] in (200, 409)
        assert _call(service.url, "POST", f"/sessions/{session}/actions/NOPE")[0] == 404
        assert _call(service.url, "POST", f"/sessions/{session}/actions/QUIT")[0] == 200
        assert _call(service.url, "POST", f"/sessions/{session}/actions/QUIT")[0] == 410  # at a terminal
        assert _call(service.url, "POST", "/sessions/0000/actions/QUIT")[0] == 404
        assert _call(service.url, "PUT", f"/machines/{'0' * 32}", TOY)[0] == 409  # not the document's id
        assert (
            _call(service.url, "POST", f"/machines/{machine_id(TOY)}/sessions", {"seed": -1, "scenario": SCENARIO})[0]
            == 400
        )
        assert _call(service.url, "POST", f"/machines/{machine_id(TOY)}/sessions", {"seed": 0})[0] == 422  # no drop
        status, spec = _call(service.url, "GET", f"/machines/{machine_id(TOY)}/openapi.json")
        assert status == 200 and spec == json.loads(json.dumps(openapi_document(TOY)))
    finally:
        service.stop()


def test_the_openapi_document_has_one_operation_per_machine_action() -> None:
    spec = openapi_document(TOY)
    operations = {op["operationId"] for item in spec["paths"].values() for op in item.values()}
    assert {"ADVANCE", "QUIT", "openSession", "readSession", "closeSession"} == operations
    assert set(spec["components"]["schemas"]["Reply"]["properties"]["record"]["properties"]) == {"stage", "failures"}
    with pytest.raises(ValueError, match="not an operation"):
        MachineHttpEnv.check_native(TOY, {"GO": {"type": "http", "method": "POST", "path": "/sessions/{s}/go"}})
    with pytest.raises(ValueError, match="expected"):
        MachineWebEnv.check_native(TOY, {"GO": {"type": "click", "target": "#go"}})


def test_the_sql_form_is_the_machine_s_state_between_steps() -> None:
    """A step reads the state back from the table: a row changed between steps is what the machine sees."""
    env, sim = _toy("rows"), StateMachineEnv(Fields(drop=0.0, max_episode_steps=10), "toy_v1", TOY)
    try:
        env.reset(seed=5)
        sim.reset(seed=5)
        env.db.action(["UPDATE machine_variable SET value = 0 WHERE name = 'outage'"], {})
        sim.values["outage"] = 0.0
        for _ in range(2):
            assert (
                env.step({"type": "transaction", "action": "ADVANCE"}).reward
                == sim.step({"type": "machine", "action": "ADVANCE"}).reward
            )
        assert env.sim.values["stage"] == sim.values["stage"] == 2.0
    finally:
        env.close()


def _call(base: str, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        base + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:  # noqa: S310 - a local test service
            return reply.status, json.loads(reply.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_scaffold_forms_are_written_only_on_request(tmp_path: Path) -> None:
    plain = write_scaffold("plainflow", tmp_path / "a")
    forms = write_scaffold("formflow", tmp_path / "b", forms=True)
    assert len(forms.files) == len(plain.files) + 6
    text = (tmp_path / "b/configs/processes/formflow.yaml").read_text()
    assert all(f"formflow_{form}: {{env: formflow_{form}_v1" in text for form in FORMS)
    assert "formflow_http_v1]" in (tmp_path / "b/params-formflow.yaml").read_text()


def test_the_api_template_compares_numbers_at_a_json_path(scaffold: tuple[ProcessSpec, EnvRegistry]) -> None:
    process, registry = scaffold
    mapping = dict(registry.get("scaffold_http_v1").mapping)
    rule = {"id": "dear", "when": {"json_path": "$.record.price", "op": ">=", "value": 50}, "emit": ["PLAN_FOUND"]}
    adapter = APISchemaAdapter({**mapping, "token_rules": [rule]}, vocabulary=process.vocabulary)
    for price, expected in ((50, True), (49.5, False), (80.0, True), (True, False), ("90", False), (None, False)):
        raw = {"status_code": 200, "json": {"record": {"price": price}}}
        assert adapter.holds(rule["when"], raw) is expected, price
        assert ("PLAN_FOUND" in adapter.adapt_observation(raw, {}).tokens) is expected, price
    assert not adapter.holds(rule["when"], {"status_code": 200, "json": {}})


def test_rules_translate_into_each_form_and_an_untranslatable_one_is_refused() -> None:
    when = {"not": {"column": "state.stage", "in": [1, 2]}}
    assert translate_condition("rows", when) == {
        "not": {
            "any": [
                {"column": "machine_variable.stage.value", "op": "==", "value": 1},
                {"column": "machine_variable.stage.value", "op": "==", "value": 2},
            ]
        }
    }
    failed = {"column": "last.failure_reason", "is_null": False}
    assert translate_condition("web", failed) == {"banner": "error"}
    assert translate_condition("http", failed) == {"json_path": "$.error", "exists": True}
    assert translate_condition("http", {"column": "last.failure_reason", "equals": "down"}) == {
        "json_path": "$.error.code",
        "equals": "down",
    }
    with pytest.raises(FormsError, match="state.NAME and last.failure_reason"):
        translate_condition("web", {"column": "last.applied", "op": "==", "value": 1})
    with pytest.raises(FormsError, match="no counterpart"):
        translate_condition("rows", {"column": "state.stage", "is_null": True})


def test_process_forms_writes_the_three_channels_of_a_machine_process(tmp_path: Path) -> None:
    write_scaffold("formless", tmp_path)
    before = Path.cwd()
    os.chdir(tmp_path)
    try:
        runner = CliRunner()
        result = runner.invoke(app, ["process", "forms", "formless"])
        assert result.exit_code == 0, result.output
        for form in FORMS:
            assert (tmp_path / f"configs/formless/envs/formless_{form}_v1.json").is_file()
            assert f"formless_{form}: {{env: formless_{form}_v1" in result.output
        again = runner.invoke(app, ["process", "forms", "formless"])
        assert again.exit_code == 2 and "exists already" in again.output
        assert runner.invoke(app, ["process", "forms", "nosuch"]).exit_code == 2
    finally:
        os.chdir(before)
