"""The generic SQL channel on SQLite (and on an embedded PostgreSQL): statements, faults, values, safety."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentflow_core.envs.sql_channel import SQLChannelEnv, check_statements, parse_sql_spec
from agentflow_core.errors import ConfigError, RegistryError
from agentflow_core.registry import entry_from_config
from agentflow_core.scenario import ScenarioField, ScenarioSpec

SCENARIO = ScenarioSpec(
    (
        ScenarioField("network", "str", "normal", "dimension", ("normal", "flaky")),
        ScenarioField("customer", "str", "ann"),  # free text: bound, never formatted
        ScenarioField("amount", "float", 50.0, "perturbation", None, 1.0, 1000.0),
        ScenarioField("max_episode_steps", "int", 10),
    )
)
SPEC: dict[str, Any] = {
    "schema": [
        "CREATE TABLE ticket (id INTEGER PRIMARY KEY, customer TEXT NOT NULL, amount REAL NOT NULL,"
        " status TEXT NOT NULL, paid INTEGER NOT NULL CHECK (paid <= 1))",
        "CREATE TABLE audit (what TEXT NOT NULL)",
    ],
    "params": {"big": "amount > 100"},
    "seed": ["INSERT INTO ticket VALUES (1, :customer, :amount, 'open', 0)"],
    "observe": {
        "ticket": "SELECT customer, status, paid, amount FROM ticket WHERE id = 1",
        "audit": "SELECT COUNT(*) AS n FROM audit",
    },
    "faults": [{"p": "network == 'flaky'", "reason": "timeout"}],
    "actions": {
        "PAY": {
            "when": "SELECT 1 FROM ticket WHERE id = 1 AND status = 'open'",
            "reason": "not_open",
            "cost": "1 + big",
            "statements": [
                "INSERT INTO audit (what) VALUES ('pay')",
                "UPDATE ticket SET paid = paid + 1 WHERE id = 1",  # a second PAY breaks the CHECK: refused
            ],
        },
        "CLOSE": {
            "when": "SELECT paid FROM ticket WHERE id = 1",  # holds when the first column is truthy
            "cost": "0.5",
            "statements": ["UPDATE ticket SET status = 'closed' WHERE id = 1"],
        },
        "DROP": {"faults": False, "statements": ["UPDATE ticket SET status = 'dropped' WHERE id = 1"]},
    },
    "terminals": [
        {"when": "SELECT 1 FROM ticket WHERE status = 'closed'", "outcome": "goal", "value": "amount"},
        {"when": "SELECT 1 FROM ticket WHERE status = 'dropped'", "outcome": "failed"},
    ],
    "reward": {"scale": 0.1},
}


def make(spec: dict[str, Any] | None = None, **params: Any) -> SQLChannelEnv:
    return SQLChannelEnv(SCENARIO.build(params), "toy_db_v1", spec or SPEC)


def act(name: str) -> dict[str, str]:
    return {"type": "sql", "action": name}


def test_hand_computed_episode_values_and_observation() -> None:
    env = make(amount=120.0)
    raw, info = env.reset(seed=0)
    assert raw == {
        "ticket": {"customer": "ann", "status": "open", "paid": 0, "amount": 120.0},
        "audit": {"n": 0},
        "last": {"failure_reason": None, "applied": 1},
    }
    assert info["failure_reason"] is None
    r = env.step(act("CLOSE"))  # paid = 0: the applicability query's first column is falsy
    assert (r.info["failure_reason"], r.info["applied"], r.reward) == ("not_applicable", False, -0.05)
    r = env.step(act("PAY"))  # cost 1 + big (amount 120 > 100) = 2
    assert r.obs["ticket"]["paid"] == 1 and r.obs["audit"]["n"] == 1
    assert (r.info["cost"], r.reward) == (2.0, pytest.approx(-0.2 - 0.01))
    r = env.step(act("PAY"))  # the CHECK refuses the update: the audit insert is undone too
    assert (r.info["failure_reason"], r.obs["audit"]["n"], r.obs["ticket"]["paid"]) == ("refused", 1, 1)
    r = env.step(act("CLOSE"))
    assert r.terminated and r.info["outcome"] == "goal"
    assert r.info["business_value"] == pytest.approx(120.0 - 2.0 - 2.0 - 0.5)
    assert r.reward == pytest.approx(0.1 * (120.0 - 0.5) - 0.01)
    env.close()


def test_episodes_roll_back_and_reseed() -> None:
    env = make()
    env.reset(seed=0)
    env.step(act("PAY"))
    raw, _ = env.reset(seed=1)
    assert raw["ticket"]["paid"] == 0 and raw["audit"]["n"] == 0
    env.close()


def test_faults_from_a_string_field_lose_the_action_but_not_its_cost() -> None:
    env = make(network="flaky")
    env.reset(seed=0)
    r = env.step(act("PAY"))
    assert (r.info["failure_reason"], r.obs["ticket"]["paid"], r.info["cost"]) == ("timeout", 0, 1.0)
    r = env.step(act("DROP"))  # faults: false
    assert r.terminated and r.info["outcome"] == "failed" and r.info["business_value"] == -1.0
    env.close()


def test_truncation_and_unknown_actions() -> None:
    env = make(max_episode_steps=2)
    env.reset(seed=0)
    assert env.step(act("FLY")).info["failure_reason"] == "unknown_action"
    r = env.step({"type": "machine", "action": "PAY"})  # another channel's native action
    assert r.truncated and r.info["outcome"] == "truncated" and r.info["failure_reason"] == "unknown_action"
    env.close()


def test_scenario_text_is_bound_never_formatted() -> None:
    hostile = "x'); DROP TABLE ticket; --"
    env = make(customer=hostile)
    raw, _ = env.reset(seed=0)
    assert raw["ticket"]["customer"] == hostile
    assert env.step(act("PAY")).obs["ticket"]["paid"] == 1
    env.close()


def test_reconfigure_equals_fresh_and_seeds_replay() -> None:
    spec = copy.deepcopy(SPEC)
    spec["faults"][0]["p"] = "0.5 * (network == 'flaky')"

    def trajectory(env: SQLChannelEnv, seed: int) -> list[Any]:
        out: list[Any] = [env.reset(seed=seed)]
        for name in ("PAY", "PAY", "CLOSE", "PAY", "CLOSE"):
            r = env.step(act(name))
            out.append((r.obs, r.reward, r.terminated, r.truncated, r.info))
            if r.done:
                break
        return out

    fresh = make(spec, network="flaky", amount=300.0)
    reused = make(spec, network="normal")
    trajectory(reused, 3)
    reused.reconfigure(SCENARIO.build({"network": "flaky", "amount": 300.0}), "toy_db_v1")
    runs = [(trajectory(fresh, s), trajectory(reused, s)) for s in range(8)]
    assert all(a == b for a, b in runs)
    assert len({str(a) for a, _ in runs}) > 1  # the faults did draw
    fresh.close()
    reused.close()


FIELDS = {"network": "normal", "customer": "ann", "amount": 1.0, "max_episode_steps": 1.0}


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"bogus": 1}, "bogus"),
        ({"observe": {"last": "SELECT 1"}}, "observe.last"),
        ({"params": {"amount": "1"}}, "params.amount"),
        ({"faults": [{"p": "network + 1", "reason": "x"}]}, "faults.0.p"),
        ({"faults": [{"p": "1", "set": {"x": "1"}}]}, "faults.0.set"),  # a fault writes with statements
        ({"faults": [{"p": "1", "applied": "no"}]}, "faults.0.applied"),
        (
            {"actions": {"PAY": {"outcomes": [{"applicable": False, "statements": ["SELECT 1"]}]}}},
            "actions.PAY.outcomes.0",
        ),
        ({"actions": {"R": {"retry": True, "when": "SELECT 1"}}}, "actions.R"),
        ({"reward": {"terminal": "0"}}, "reward.terminal"),
        ({"actions": {"PAY": {"statements": "UPDATE ticket SET paid = 1"}}}, "actions.PAY.statements"),
        ({"terminals": [{"when": "SELECT 1", "outcome": "won"}]}, "terminals.0.outcome"),
    ],
)
def test_bad_documents_name_the_key(patch: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_sql_spec({**copy.deepcopy(SPEC), **patch}, FIELDS, "toy.yaml")
    assert info.value.key.startswith(key)


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"observe": {"ticket": "SELECT nope FROM ticket"}}, "observe.ticket"),
        ({"seed": ["INSERT INTO tickets VALUES (1)"]}, "seed.0"),
        ({"actions": {"PAY": {"statements": ["UPDATE ticket SET paid = :unbound"]}}}, "actions.PAY.statements.0"),
        ({"schema": ["CREATE TABLE ("]}, "schema.0"),
    ],
)
def test_statements_are_prepared_at_load(patch: dict[str, Any], key: str) -> None:
    spec = parse_sql_spec({**copy.deepcopy(SPEC), **patch}, FIELDS, "toy.yaml")
    with pytest.raises(ConfigError) as info:
        check_statements(spec, FIELDS, "toy.yaml")
    assert info.value.key == key


def test_the_registry_loads_a_spec_file_beside_the_config(tmp_path: Path) -> None:
    from tasks.process_io import read_process
    from tasks.process_scaffold import write_scaffold

    write_scaffold("toy", tmp_path)
    env_dir = tmp_path / "configs/toy/envs"
    vocabulary = read_process(tmp_path / "configs/processes/toy.yaml").vocabulary
    config = yaml.safe_load((env_dir / "toy_db_v1.yaml").read_text())
    entry = entry_from_config(config, env_dir / "toy_db_v1.yaml", yaml.safe_load, {"toy": vocabulary})
    assert entry.kwargs["spec"]["url"] == "sqlite"
    env = entry.make({"plan": "annual"})
    _, info = env.reset(seed=0)
    assert info["tokens"] == ["UNVERIFIED"]
    env.close()
    inline = {**config, "spec": {**yaml.safe_load((env_dir / "channels/sql.yaml").read_text())}}
    assert entry_from_config(inline, env_dir / "x.yaml", yaml.safe_load, {"toy": vocabulary}).kwargs == entry.kwargs
    typo = tmp_path / "configs/toy/envs/toy_db_v1.json"
    typo.write_text(typo.read_text().replace('"action": "CANCEL"', '"action": "CANCLE"'))
    with pytest.raises(RegistryError, match="actions: CANCEL"):
        entry_from_config(config, env_dir / "toy_db_v1.yaml", yaml.safe_load, {"toy": vocabulary})
    no_spec = {**config, "class_path": "agentflow_core.envs.order_db:OrderDBEnv"}
    with pytest.raises(RegistryError, match="takes no channel document"):
        entry_from_config(no_spec, env_dir / "x.yaml", yaml.safe_load, {"toy": vocabulary})
    for bad, message in (
        ("../../processes/toy.yaml", "not found"),
        ("order_db_v1.json", "not found"),  # a packaged mapping is no channel document
        ("/etc/passwd", "not found"),
        ({**inline["spec"], "observe": {"a": "SELECT nope"}}, "observe.a"),
    ):
        with pytest.raises(RegistryError, match=message):
            entry_from_config({**config, "spec": bad}, env_dir / "x.yaml", yaml.safe_load, {"toy": vocabulary})


# --------------------------------------------------------------------------- PostgreSQL (embedded, pgserver)
def test_the_same_episodes_on_postgresql() -> None:
    """pgserver's PostgreSQL: the same trajectory as SQLite; the env's own schema is dropped at close."""
    from sqlalchemy import create_engine, text

    from agentflow_core.envs.order_db.postgres import acquire_embedded, release_embedded

    url = acquire_embedded()  # held by the test so the server outlives the env
    try:
        spec = {**copy.deepcopy(SPEC), "url": "pgserver"}
        lite, pg = make(), make(spec)
        for env in (lite, pg):
            env.reset(seed=0)
        steps = [(lite.step(act(a)), pg.step(act(a))) for a in ("CLOSE", "PAY", "PAY", "CLOSE")]
        for a, b in steps:
            assert (a.reward, a.terminated, a.info) == (b.reward, b.terminated, b.info)
            assert a.obs == b.obs
        namespace = pg.db.namespace  # type: ignore[union-attr]
        pg.close()
        lite.close()
        with create_engine(url).connect() as conn:
            found = conn.execute(text("SELECT 1 FROM pg_namespace WHERE nspname = :n"), {"n": namespace}).fetchall()
        assert found == []
    finally:
        release_embedded()


OUTCOMES: dict[str, Any] = {
    "schema": ["CREATE TABLE job (id INTEGER PRIMARY KEY, state TEXT NOT NULL, ticks INTEGER NOT NULL, tries INTEGER)"],
    "seed": ["INSERT INTO job VALUES (1, 'queued', 0, 0)"],
    "before": ["UPDATE job SET ticks = ticks + 1 WHERE id = 1"],
    "observe": {"job": "SELECT state, ticks, tries FROM job WHERE id = 1"},
    "faults": [{"p": "network == 'flaky'", "reason": "lost", "applied": False}],
    "actions": {
        "RUN": {
            "faults": False,
            "outcomes": [
                {"when": "SELECT 1 FROM job WHERE state <> 'queued'", "reason": "not_queued", "applicable": False},
                {"p": "0.0", "reason": "busy", "applied": False},  # never fires, but draws
                {"statements": ["UPDATE job SET state = 'done' WHERE id = 1"]},
            ],
        },
        "PING": {"statements": ["UPDATE job SET state = state WHERE id = 1"]},
        "RETRY": {"retry": True, "statements": ["UPDATE job SET tries = tries + 1 WHERE id = 1"]},
    },
    "terminals": [{"when": "SELECT 1 FROM job WHERE state = 'done'", "outcome": "goal", "value": "100"}],
    "reward": {"scale": 0.1, "terminal": 0.0},
}


def test_outcomes_retries_the_clock_and_the_ending_reward() -> None:
    env = make(OUTCOMES, network="flaky")
    env.reset(seed=0)
    lost = env.step(act("PING"))  # the fault loses it: the step reward, but not applied
    assert (lost.info["failure_reason"], lost.info["applied"], lost.reward) == ("lost", False, -0.01)
    again = env.step(act("RETRY"))  # PING again (its clock, its fault), the retry counted first
    assert (again.obs["job"]["tries"], again.obs["job"]["ticks"], again.info["failure_reason"]) == (1, 2, "lost")
    env.reconfigure(SCENARIO.build({}), "toy_db_v1")
    env.reset(seed=0)
    nothing = env.step(act("RETRY"))  # nothing lost: not applicable, no clock
    assert (nothing.info["failure_reason"], nothing.reward, nothing.obs["job"]["ticks"]) == ("not_applicable", -0.05, 0)
    done = env.step(act("RUN"))
    assert done.terminated and done.reward == pytest.approx(10.0) and done.info["business_value"] == 100.0
    env.reset(seed=0)
    env.db.action(["UPDATE job SET state = 'held' WHERE id = 1"], env.values)
    refused = env.step(act("RUN"))  # an inapplicable outcome: no cost, the inapplicable reward, nothing written
    assert (refused.info["failure_reason"], refused.info["applied"], refused.reward) == ("not_queued", False, -0.05)
    env.close()


def test_a_probability_draws_whatever_its_value() -> None:
    env = make(OUTCOMES)
    env.reset(seed=5)
    env.step(act("RUN"))  # the p = 0 outcome drew one number
    after = env.np_random.random()
    env.reset(seed=5)
    env.np_random.random()
    assert env.np_random.random() == after
    env.close()
