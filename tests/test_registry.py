"""Env registry: loading, run-time refresh, picklable entries, and errors that name the file."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from agentflow_core.adapters.base import BaseSemanticAdapter
from agentflow_core.envs.base import Scenario, StepResult
from agentflow_core.errors import MappingError, RegistryError
from agentflow_core.registry import PACKAGED_MAPPINGS_DIR, EnvEntry, EnvRegistry, load_entry
from agentflow_core.semantics import SemanticAction
from flows.cli.envs import envs_app

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- a tiny family (test fixture)
class ToyEnv:
    """Three-stage checkout: LOGIN, then SUBMIT_PAYMENT pays; everything else is a no-op."""

    family = "toy"
    version = 1

    def __init__(self, scenario: Scenario, env_id: str, greeting: str = "hi") -> None:
        self.scenario, self.env_id, self.greeting = scenario, env_id, greeting
        self.stage, self.t = "login", 0

    def _raw(self) -> dict[str, Any]:
        return {"stage": self.stage, "balance": self.scenario.balance}

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        self.stage, self.t = "login", 0
        return self._raw(), {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        self.t += 1
        kind = native_action["type"]
        if kind == "login" and self.stage == "login":
            self.stage = "shop"
        elif kind == "pay" and self.stage == "shop":
            self.stage = "paid"
        terminated = self.stage == "paid"
        truncated = not terminated and self.t >= self.scenario.max_episode_steps
        info = {"env_id": self.env_id, "step_id": self.t, "failure_reason": "max_steps" if truncated else None}
        return StepResult(self._raw(), 10.0 if terminated else -0.01, terminated, truncated, info)

    def close(self) -> None:
        self.stage = "closed"


class ToyAdapter(BaseSemanticAdapter):
    """Leaf condition ``{"stage": name}``; features read a key of the raw dict."""

    template = "web"
    WHEN_SCHEMA: ClassVar[dict[str, Any]] = {
        "type": "object",
        "required": ["stage"],
        "additionalProperties": False,
        "properties": {"stage": {"type": "string"}},
    }

    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        return bool(raw["stage"] == when["stage"])

    def extract(self, source: str, raw: Any) -> float | None:
        return raw.get(source)


TOY_MAPPING: dict[str, Any] = {
    "family": "toy",
    "template": "web",
    "version": 1,
    "token_rules": [
        {"id": "LOGIN_PAGE", "when": {"stage": "login"}, "emit": ["LOGGED_OUT"]},
        {"id": "SHOP", "when": {"stage": "shop"}, "emit": ["LOGGED_IN", "PAYMENT_PAGE"]},
        {"id": "PAID", "when": {"stage": "paid"}, "emit": ["PAYMENT_SUCCESS"]},
    ],
    "feature_rules": [{"id": "BALANCE", "feature": "balance_ratio", "source": "balance", "scale": 0.001}],
    "unobservable_features": [
        "user_logged_in",
        "cart_items",
        "payment_page_loaded",
        "is_vip",
        "price_factor",
        "retries_used",
    ],
    "actions": {"LOGIN": {"type": "login"}, "SUBMIT_PAYMENT": {"type": "pay"}},
}


def toy_config(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "env_id": "toy_v1",
        "process": "checkout",
        "class_path": f"{__name__}:ToyEnv",
        "adapter": f"{__name__}:ToyAdapter",
        "mapping": "toy_v1.json",
        "params": {"max_episode_steps": 7, "balance": 250.0},
        "kwargs": {"greeting": "hello"},
    }
    config.update(changes)
    return {k: v for k, v in config.items() if v is not None}


RAW_STATES = [
    ({"stage": "login", "balance": 1.0}, "LOGGED_OUT"),
    ({"stage": "shop", "balance": 1.0}, "LOGGED_IN"),
    ({"stage": "paid", "balance": 1.0}, "PAYMENT_SUCCESS"),
]


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    (tmp_path / "toy_v1.json").write_text(json.dumps(TOY_MAPPING))
    (tmp_path / "toy_v1.yaml").write_text(yaml.safe_dump(toy_config()))
    return tmp_path


# ---------------------------------------------------------------- loading and making
def test_load_and_make(config_dir: Path) -> None:
    registry = EnvRegistry(config_dir, yaml.safe_load)
    assert registry.env_ids() == ["toy_v1"]
    entry = registry.get("toy_v1")
    assert (entry.family, entry.version, entry.adapter) == ("toy", 1, f"{__name__}:ToyAdapter")
    assert entry.mapping_path == str((config_dir / "toy_v1.json").resolve())
    assert entry.source_file == str(config_dir / "toy_v1.yaml")
    assert entry.mapping == TOY_MAPPING

    env = entry.make({"balance": 400.0}, suffix="vip")
    assert env.env_id.startswith("toy_v1_") and env.env_id.endswith("_vip")
    assert env.physical.greeting == "hello"
    assert env.physical.scenario.balance == 400.0 and env.max_episode_steps == 7
    obs, info = env.reset(seed=0)
    assert info["tokens"] == ["LOGGED_OUT"] and info["step_id"] == 0
    assert obs[-3] == 0.0  # balance_ratio is presented only in a live session (LOGGED_IN)
    env.step(SemanticAction.LOGIN)
    _, reward, terminated, truncated, info = env.step(SemanticAction.SUBMIT_PAYMENT)
    assert (reward, terminated, truncated) == (10.0, True, False)
    assert info["tokens"] == ["PAYMENT_SUCCESS"] and info["step_id"] == 2
    assert entry.make(env_id="toy_v1_20240101_abc").env_id == "toy_v1_20240101_abc"


def test_entry_is_picklable_and_builds_from_data(config_dir: Path) -> None:
    entry = EnvRegistry(config_dir, yaml.safe_load).get("toy_v1")
    clone: EnvEntry = pickle.loads(pickle.dumps(entry))
    assert clone == entry and hash(clone) == hash(entry)
    (config_dir / "toy_v1.json").unlink()  # the entry carries the mapping; the file is no longer needed
    env = clone.make()
    obs, _ = env.reset(seed=1)
    assert obs.shape == env.observation_space.shape and np.isfinite(obs).all()


def test_json_config_needs_no_yaml_loader(config_dir: Path) -> None:
    (config_dir / "toy_v1.yaml").unlink()
    (config_dir / "toy_v1_cfg.json").write_text(json.dumps(toy_config()))
    assert EnvRegistry(config_dir).env_ids() == ["toy_v1"]


def test_refresh_picks_up_a_config_written_at_run_time(config_dir: Path) -> None:
    registry = EnvRegistry(config_dir, yaml.safe_load)
    assert "toy_v1_fast" not in registry
    (config_dir / "toy_v1_fast.yaml").write_text(
        yaml.safe_dump(toy_config(env_id="toy_v1_fast", params={"max_episode_steps": 2}))
    )
    assert registry.refresh() == ["toy_v1_fast"]
    assert registry.env_ids() == ["toy_v1", "toy_v1_fast"]
    assert registry.get("toy_v1_fast").make().max_episode_steps == 2
    # get() on a miss rescans by itself
    (config_dir / "toy_v1_slow.yaml").write_text(yaml.safe_dump(toy_config(env_id="toy_v1_slow")))
    assert registry.get("toy_v1_slow").env_id == "toy_v1_slow"
    with pytest.raises(RegistryError, match="unknown env_id 'nope'"):
        registry.get("nope")


def test_failed_refresh_keeps_previous_entries(config_dir: Path) -> None:
    registry = EnvRegistry(config_dir, yaml.safe_load)
    (config_dir / "zz_bad.yaml").write_text(yaml.safe_dump(toy_config(env_id="toy_v1_bad", clas_path="x:y")))
    with pytest.raises(RegistryError, match="zz_bad.yaml"):
        registry.refresh()
    assert registry.env_ids() == ["toy_v1"]


def test_mapping_falls_back_to_the_packaged_directory(tmp_path: Path) -> None:
    packaged = sorted(PACKAGED_MAPPINGS_DIR.glob("*.json"))
    assert packaged, "the three family mappings ship in agentflow_core/mappings/"
    shipped = load_entry(next(p for p in sorted((REPO / "configs/envs").glob("*.yaml"))), yaml.safe_load)
    config = {k: getattr(shipped, k) for k in ("env_id", "process", "class_path", "adapter")}
    config["mapping"] = Path(shipped.mapping_path).name
    (tmp_path / "env.yaml").write_text(yaml.safe_dump(config))
    entry = load_entry(tmp_path / "env.yaml", yaml.safe_load)
    assert Path(entry.mapping_path).parent == PACKAGED_MAPPINGS_DIR
    assert entry.mapping == shipped.mapping


def test_shipped_registry_declares_the_three_families() -> None:
    registry = EnvRegistry(REPO / "configs/envs", yaml.safe_load)
    assert registry.env_ids() == ["order_db_v1", "payment_api_v1", "web_checkout_v2"]
    assert {e.family: e.adapter for e in registry.entries()} == {
        "web_checkout": "web",
        "order_db": "db",
        "payment_api": "api",
    }


# ---------------------------------------------------------------- bad inputs name the file
BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "module_missing": (
        toy_config(class_path="agentflow_core.envs.no_such_family:Env"),
        "class_path: cannot import module",
    ),
    "attribute_missing": (
        toy_config(class_path="agentflow_core.envs.payment_api:NoSuchEnv"),
        "class_path: .*has no attribute 'NoSuchEnv'",
    ),
    "not_an_entry_point": (toy_config(class_path=f"{__name__}:NoSuchEnv"), "class_path: .*is not allowed"),
    "not_a_class_path": (toy_config(class_path="ToyEnv"), "class_path: .*not of the form"),
    "unknown_adapter": (toy_config(adapter="ftp"), "adapter: .*unknown adapter 'ftp'"),
    "mapping_missing": (toy_config(mapping="nope.json"), "mapping: file 'nope.json' not found"),
    "unknown_key": (toy_config(paramz={"inventory": 3}), r"unknown key\(s\) \['paramz'\]"),
    "missing_key": (toy_config(adapter=None), r"missing key\(s\) \['adapter'\]"),
    "bad_param_value": (toy_config(params={"network": "dialup"}), "params: scenario.network: got 'dialup'"),
    "unknown_param": (toy_config(params={"stock": 3}), r"params: scenario: unknown key\(s\) \['stock'\]"),
    "family_mismatch": (toy_config(env_id="shop_v1"), "env_id: got 'shop_v1', expected it to start with 'toy_v1'"),
    "version_mismatch": (toy_config(version=2), "version: got 2, but mapping .* declares 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_bad_config_names_the_file_and_key(config_dir: Path, case: str) -> None:
    config, message = BAD_CONFIGS[case]
    bad = config_dir / f"bad_{case}.yaml"
    bad.write_text(yaml.safe_dump(config))
    (config_dir / "toy_v1.yaml").unlink()
    with pytest.raises(RegistryError, match=message) as excinfo:
        EnvRegistry(config_dir, yaml.safe_load)
    assert excinfo.value.file == str(bad)
    assert str(excinfo.value).startswith(str(bad))


def test_unparseable_yaml_names_the_file(config_dir: Path) -> None:
    (config_dir / "broken.yaml").write_text("env_id: [unclosed\n")
    with pytest.raises(RegistryError, match="unreadable: .*Error") as excinfo:
        EnvRegistry(config_dir, yaml.safe_load)
    assert excinfo.value.file == str(config_dir / "broken.yaml")


def test_duplicate_env_id_names_both_files(config_dir: Path) -> None:
    (config_dir / "toy_v1_copy.yaml").write_text(yaml.safe_dump(toy_config()))
    with pytest.raises(RegistryError, match="already declared in .*toy_v1.yaml") as excinfo:
        EnvRegistry(config_dir, yaml.safe_load)
    assert excinfo.value.file == str(config_dir / "toy_v1_copy.yaml")


@pytest.mark.parametrize(
    ("mutate", "json_path"),
    [
        (lambda m: m["token_rules"][1].update(emit=["LOGGED_INN"]), "$.token_rules[1].emit[0]"),
        (lambda m: m["token_rules"][2].update(when={"stagee": "paid"}), "$.token_rules[2].when"),
        (lambda m: m.update(template="db"), "$.template"),
        (lambda m: m.pop("actions"), "$"),
    ],
    ids=["unknown_token", "bad_condition", "wrong_template", "missing_actions"],
)
def test_bad_mapping_names_the_mapping_file_and_json_path(config_dir: Path, mutate: Any, json_path: str) -> None:
    mapping = json.loads(json.dumps(TOY_MAPPING))
    mutate(mapping)
    (config_dir / "toy_v1.json").write_text(json.dumps(mapping))
    with pytest.raises(MappingError) as excinfo:
        EnvRegistry(config_dir, yaml.safe_load)
    assert excinfo.value.file == str((config_dir / "toy_v1.json").resolve())
    assert excinfo.value.json_path == json_path


def test_missing_yaml_loader_is_reported(config_dir: Path) -> None:
    with pytest.raises(RegistryError, match="no YAML loader was injected"):
        EnvRegistry(config_dir)


# ---------------------------------------------------------------- the `agentflow envs` CLI
def test_cli_list_and_check_pass_on_a_good_directory(config_dir: Path) -> None:
    runner = CliRunner()
    listed = runner.invoke(envs_app, ["list", "--config-dir", str(config_dir)], env={"COLUMNS": "200"})
    assert listed.exit_code == 0, listed.output
    assert "toy_v1" in listed.output and f"{__name__}:ToyEnv" in listed.output
    checked = runner.invoke(envs_app, ["check", "--config-dir", str(config_dir)], env={"COLUMNS": "200"})
    assert checked.exit_code == 0, checked.output
    assert "ok (0 warnings)" in checked.output and "1 env(s) ok" in checked.output


def test_cli_check_fails_on_a_bad_config_and_a_bad_mapping(config_dir: Path) -> None:
    (config_dir / "broken.yaml").write_text(
        yaml.safe_dump(toy_config(env_id="toy_v1_x", class_path=f"{__name__}:Nope"))
    )
    collapsing = json.loads(json.dumps(TOY_MAPPING))
    collapsing["token_rules"][2]["emit"] = ["LOGGED_IN", "PAYMENT_PAGE"]  # paid now reads like the shop page
    (config_dir / "toy_v1.json").write_text(json.dumps(collapsing))
    result = CliRunner().invoke(envs_app, ["check", "--config-dir", str(config_dir)], env={"COLUMNS": "250"})
    assert result.exit_code == 1
    assert "config error" in result.output and "Nope' is not allowed" in result.output
    assert "collapsed_meaning: rule(s) SHOP, PAID" in result.output
    assert "wrong_token: rule(s) PAID" in result.output


def test_cli_debug_adapter_logs_rule_decisions(config_dir: Path) -> None:
    import logging

    logger = logging.getLogger("agentflow.adapter")
    level, handlers = logger.level, list(logger.handlers)
    try:
        result = CliRunner().invoke(envs_app, ["check", "--config-dir", str(config_dir)], env={"DEBUG_ADAPTER": "1"})
        assert result.exit_code == 0, result.output
        assert logger.level == logging.DEBUG and len(logger.handlers) == len(handlers) + 1
        assert "rule=LOGIN_PAGE when={'stage': 'login'} -> ['LOGGED_OUT']" in result.output
    finally:
        logger.setLevel(level)
        logger.handlers[:] = handlers


SHOP_SPEC = """
openapi: 3.0.3
info: {title: Shop API, description: A small shop}
paths:
  /session:
    post:
      operationId: createSession
      requestBody:
        content:
          application/json:
            example: {user: demo}
      responses:
        "200":
          description: logged in
          content:
            application/json:
              schema:
                type: object
                properties:
                  session:
                    type: object
                    properties:
                      status: {type: string, enum: [active, expired]}
                      logged_in: {type: boolean}
        "401": {description: not logged in}
  /orders/checkout:
    post:
      operationId: checkout
      responses:
        "200":
          description: order created
          content:
            application/json:
              schema:
                type: object
                properties:
                  order:
                    type: object
                    properties:
                      status: {type: string, enum: [pending, paid, cancelled, expired]}
        "5XX": {description: server error}
  /payments:
    post:
      operationId: pay
      responses:
        "402": {description: insufficient funds}
"""


def test_cli_from_openapi_writes_a_registered_env_and_refuses_to_overwrite(tmp_path: Path) -> None:
    spec, out_dir = tmp_path / "shop.yaml", tmp_path / "envs"
    spec.write_text(SHOP_SPEC)
    args = ["from-openapi", str(spec), "--family", "shop_api", "--out-dir", str(out_dir)]
    runner = CliRunner()
    created = runner.invoke(envs_app, args, env={"COLUMNS": "200"})
    assert created.exit_code == 0, created.output
    assert sorted(p.name for p in out_dir.iterdir()) == ["shop_api_v1.json", "shop_api_v1.yaml"]
    entry = EnvRegistry(out_dir, yaml.safe_load).get("shop_api_v1")
    assert (entry.family, entry.version, entry.adapter) == ("shop_api", 1, "api")
    assert entry.mapping == json.loads((out_dir / "shop_api_v1.json").read_text())
    assert {"LOGIN", "CHECKOUT", "SUBMIT_PAYMENT", "RETRY"} <= set(entry.mapping["actions"])
    emitted = {t for rule in entry.mapping["token_rules"] for t in rule["emit"]}
    assert {
        "LOGGED_IN",
        "SESSION_EXPIRED",
        "ORDER_PENDING",
        "ORDER_EXPIRED",
        "INSUFFICIENT_FUNDS",
        "SERVER_ERROR",
    } <= emitted
    assert "registered shop_api_v1" in created.output

    before = (out_dir / "shop_api_v1.yaml").read_text()
    refused = runner.invoke(envs_app, args, env={"COLUMNS": "200"})
    assert refused.exit_code == 1 and "refusing to overwrite" in refused.output
    forced = runner.invoke(envs_app, [*args, "--force"], env={"COLUMNS": "200"})
    assert forced.exit_code == 0, forced.output
    assert (out_dir / "shop_api_v1.yaml").read_text() == before
    assert sorted(p.name for p in out_dir.iterdir()) == ["shop_api_v1.json", "shop_api_v1.yaml"]  # no temp files left


def test_cli_from_openapi_rejects_a_bad_family_without_writing(tmp_path: Path) -> None:
    spec = tmp_path / "shop.yaml"
    spec.write_text(SHOP_SPEC)
    result = CliRunner().invoke(
        envs_app, ["from-openapi", str(spec), "--family", "Shop-API", "--out-dir", str(tmp_path / "envs")]
    )
    assert result.exit_code == 2 and "family" in result.output
    assert not (tmp_path / "envs").exists()
