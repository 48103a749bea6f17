"""Phase 0: the calibration gate passes stable, correctly mapped envs and fails the others."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from agentflow_core.calibration import calibrate, calibrate_variant
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.registry import EnvRegistry
from tasks.config_io import parse_config
from tasks.context import PhaseContext
from tasks.steps.calibrate import run_calibrate

REPO = Path(__file__).resolve().parents[1]
HANDLED = frozenset({"user_blocked"})
ACCEPTED = frozenset({"PAYMENT_SUCCESS"})


@pytest.fixture(scope="module")
def registry() -> EnvRegistry:
    return EnvRegistry(REPO / "configs" / "envs", yaml.safe_load)


@pytest.mark.parametrize("env_id", ["web_checkout_v2", "order_db_v1", "payment_api_v1"])
def test_real_envs_are_stable_under_the_expert(registry: EnvRegistry, env_id: str) -> None:
    entry = registry.get(env_id)
    env = entry.make({"network": "packet_loss_5%"})
    try:
        result = calibrate_variant(
            env,
            expert_for(entry.family).act,
            resets=20,
            seed=0,
            max_variance=0.05,
            accepted=ACCEPTED,
            min_success=0.9,
            handled_outcomes=HANDLED,
        )
    finally:
        env.close()
    assert result.stable and result.deterministic and result.reason is None
    assert result.success_rate >= 0.9
    assert result.variance < 0.05
    assert result.step_count > 20 and np.isfinite(result.step_reward_std)


def _broken_mapping_env(registry: EnvRegistry) -> SemanticEnv:
    """The web env with a planted mapping bug: the payment page is never recognised."""
    entry = registry.get("web_checkout_v2")
    mapping = copy.deepcopy(entry.mapping)
    mapping["token_rules"] = [r for r in mapping["token_rules"] if "PAYMENT_PAGE" not in r["emit"]]
    adapter = type(entry.make().adapter)(mapping, vocabulary=entry.vocabulary)
    env = entry.make()
    return SemanticEnv(env.physical, adapter)


def test_a_consistently_failing_mapping_fails_the_gate(registry: EnvRegistry) -> None:
    env = _broken_mapping_env(registry)
    result = calibrate_variant(
        env,
        expert_for("web_checkout").act,
        resets=10,
        seed=0,
        max_variance=0.05,
        accepted=ACCEPTED,
        min_success=0.9,
        handled_outcomes=HANDLED,
    )
    assert result.success_rate == 0.0
    assert result.variance < 0.05  # zero variance: the old variance-only gate would have passed it
    assert not result.stable and "mapping or the business rules are broken" in (result.reason or "")


def test_a_crashing_env_fails_with_its_reason(registry: EnvRegistry) -> None:
    entry = registry.get("web_checkout_v2")

    def crashing() -> SemanticEnv:
        env = entry.make()
        original = env.physical.step

        def step(action):  # type: ignore[no-untyped-def]
            if env.step_id == 3:
                raise RuntimeError("renderer died")
            return original(action)

        env.physical.step = step  # type: ignore[method-assign]
        return env

    report = calibrate(
        [(crashing, expert_for("web_checkout").act, ACCEPTED)],
        resets=3,
        seed=0,
        max_variance=0.05,
        max_failed_fraction=0.0,
    )
    assert report.env_stability_score == 0.0 and not report.passed
    assert "env_crash" in (report.failed[0].reason or "") and "renderer died" in (report.failed[0].reason or "")
    assert "0/1 stable" in report.summary()


def test_run_calibrate_writes_report_stats_and_metrics(tmp_path: Path, local_config: Any) -> None:
    cfg = local_config(calibrate={"variants_per_family": 2, "resets": 5})
    summary = run_calibrate(PhaseContext.of(cfg), tmp_path / "calibration", tmp_path / "metrics" / "calibrate.json")
    # 2 per family asked, 4 per family drawn: the sample covers the 4 start stages of every family
    assert summary["passed"] and summary["variants"] == 12 and summary["env_stability_score"] == 1.0
    stats = json.loads((tmp_path / "calibration" / "reward_stats.json").read_text())
    assert set(stats["per_base_env"]) == {"web_checkout_v2", "order_db_v1", "payment_api_v1"}
    assert len(stats["per_env"]) == 12
    assert json.loads((tmp_path / "metrics" / "calibrate.json").read_text())["env_stability_score"] == 1.0
    assert sorted(p.name for p in (tmp_path / "calibration").iterdir()) == [
        "audit.json",
        "quarantine.json",
        "report.json",
        "reward_stats.json",
    ]
    from tasks.steps.calibrate import sample_variants

    sampled = sample_variants(PhaseContext.of(cfg), 2, np.random.default_rng(cfg.base.seed))
    report = json.loads((tmp_path / "calibration" / "report.json").read_text())
    assert [v["env_id"] for v in report["variants"]] == [v.env_id for v in sampled]
    for dim, values in cfg.variants.dimensions.items():  # every family x every dimension value is calibrated
        for family in ("web_checkout", "order_db", "payment_api"):
            assert {v.params[dim] for v in sampled if v.family == family} == set(values), (family, dim)


def test_planted_broken_env_config_fails_run_calibrate(tmp_path: Path) -> None:
    """A registry whose web mapping lost its PAYMENT_PAGE rules: the gate fails and names the variants."""
    config_dir = tmp_path / "envs"
    shutil.copytree(REPO / "configs" / "envs", config_dir)
    mapping = json.loads((REPO / "agentflow_core" / "mappings" / "web_checkout_v2.json").read_text())
    mapping["token_rules"] = [r for r in mapping["token_rules"] if "PAYMENT_PAGE" not in r["emit"]]
    (config_dir / "web_checkout_v2.json").write_text(json.dumps(mapping))
    cfg = parse_config(
        {
            "base": {"env_config_dir": str(config_dir)},
            "calibrate": {"variants_per_family": 3, "resets": 5, "max_failed_fraction": 0.1},
            "variants": {"dimensions": {"user_tier": ["standard"], "start_stage": ["login"]}},
        }
    )
    summary = run_calibrate(PhaseContext.of(cfg), tmp_path / "calibration")
    assert not summary["passed"]
    assert summary["failed"] >= 1
    assert all(env_id.startswith("web_checkout_v2") for env_id in summary["quarantine"])
    assert "env_stability_score=" in summary["message"]
