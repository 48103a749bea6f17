"""The test configurations in one place: the tiny cycle (every phase, minutes not hours) and the
shipped defaults with their outputs under a test's folder.

Tests take them through the fixtures in ``tests/conftest.py`` (``tiny_config``, ``local_config``) or,
where they need the file a command reads, :func:`write_tiny_params`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agentflow_core.config import AgentFlowConfig

REPO = Path(__file__).resolve().parents[1]


def tiny_params(root: Path, **section_overrides: dict[str, Any]) -> dict[str, Any]:
    """params.yaml content whose outputs and service state all live under ``root``."""
    params: dict[str, Any] = {
        "base": {
            "seed": 0,
            "run_name": "tiny",
            "state_dir": str(root / ".agentflow"),
            "data_dir": str(root / "data"),
            "env_config_dir": str(REPO / "configs" / "envs"),
        },
        "calibrate": {"variants_per_family": 1, "resets": 5},
        "variants": {
            "dimensions": {
                "start_stage": ["login", "checkout"],
                "user_tier": ["standard", "vip"],
                "network": ["normal", "packet_loss_5%"],
            },
            "samples_per_combination": 2,
            "split": {"validation": 0.2, "test": 0.2},
        },
        "pool": {"num_workers": 0},
        # the tiny catalogue has no blocked user, so USER_BLOCKED/ESCALATED are out of its reach: its gate sits lower
        "explore": {
            "total_steps": 320,
            "num_envs": 8,
            "reference_pool_steps": 10,
            "min_state_coverage": 0.5,
            "remediation": {"max_steps": 320},
        },
        # a few hundred exploration rows teach CQL little: a short stage, its gate recorded only
        "offline": {
            "gradient_steps": 200,
            "improve_steps": 50,
            "eval_episodes": 8,
            "gate": {"min_validation_process_success": 0.0, "max_regression_vs_bc": 1.0},
        },
        "train": {
            "total_steps": 1024,
            "num_envs": 8,
            "n_steps": 64,
            "minibatch_size": 128,
            "n_epochs": 2,
            "checkpoint_every_updates": 1,
            "eval_every_updates": 1,
            "eval_episodes": 8,
            "gate": {"min_validation_process_success": 0.0},
        },
        # a few updates do not make a consistent policy: on the hardened probe (every feature varied) the
        # tiny policy scores ~0.64 against a random policy's ~0.08, so its gate sits between the two
        "stress": {
            "episodes": 24,
            "variants": 12,
            "num_envs": 8,
            "consistency_variants": 6,
            "consistency_target": 0.4,
            # nor a robust one (robustness 0.04-0.3 depending on the sampling seeds); tests/test_gates.py
            # puts this gate out of reach to see it fail
            "min_robustness": 0.0,
        },
        # a tiny exploration (eps 0.95) keeps 16-30 expert steps, so the discriminator is judged on 1-3 held-out
        # states: 0.5-1.0 by chance, and a retrain's fresh cycle seed draws it anew. Its gate is recorded only
        # here; tests/test_validator.py checks the discriminator's accuracy on a dataset big enough to judge
        "validator": {"min_heldout_accuracy": 0.0},
        "report": {"champion_episodes": 8, "champion_slice": 0.5},
    }
    for section, values in section_overrides.items():
        params.setdefault(section, {}).update(values)
    return params


def tiny_config(root: Path, **section_overrides: dict[str, Any]) -> AgentFlowConfig:
    """The tiny cycle's validated configuration, its outputs under ``root``."""
    return AgentFlowConfig.model_validate(tiny_params(root, **section_overrides))


def local_config(root: Path, **section_overrides: dict[str, Any]) -> AgentFlowConfig:
    """The shipped defaults (full-size catalogue) with the repo's envs and the data under ``root``."""
    params: dict[str, Any] = {
        "base": {"data_dir": str(root / "data"), "env_config_dir": str(REPO / "configs" / "envs")},
    }
    for section, values in section_overrides.items():
        params.setdefault(section, {}).update(values)
    return AgentFlowConfig.model_validate(params)


def write_tiny_params(root: Path, **section_overrides: dict[str, Any]) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_params(root, **section_overrides), sort_keys=False))
    return path


def tiny_refund_params(root: Path, **section_overrides: dict[str, Any]) -> dict[str, Any]:
    """The tiny cycle on the refund process (configs/processes/refund.yaml) over its two channels."""
    params = tiny_params(root)
    params["process"] = "refund"
    params["base"]["env_config_dir"] = str(REPO / "configs" / "refund" / "envs")
    params["variants"] = {
        "base_envs": ["refund_db_v1", "refund_api_v1"],
        "dimensions": {  # refund's own scenario fields (configs/processes/refund.yaml)
            "entry_stage": ["signed_out", "request_draft"],
            "account": ["ok", "flagged"],
            "network": ["normal", "packet_loss_5%"],
        },
        "perturbations": {"order_value": {"kind": "uniform", "low": 50, "high": 150}},
        "samples_per_combination": 2,
        "split": {"validation": 0.2, "test": 0.2},
    }
    params["train"]["reward"] = {"token_rewards": {"REFUND_ISSUED": 10.0}, "env_reward_weight": 1.0}
    # every phase runs, offline, validator and the auto-tuner included (a small probe)
    # (its choice capped at the tiny rollout batch, so training stays as short as checkout's tiny cycle)
    params["tune"] = {"enabled": True, "envs_per_worker": [8], "probe_steps": 4, "max_num_envs": 8, "max_n_steps": 64}
    # the refund probes (configs/processes/refund.yaml) on a few updates' policy: recorded, not gated
    params["stress"] = {**params["stress"], "consistency_target": 0.0}
    # sim-to-real on the real channels refund's process file names: PostgreSQL, the service in its own process
    params["stress"]["sim_to_real"] = {"enabled": True, "episodes_per_family": 2, "max_gap": 0.02}
    for section, values in section_overrides.items():
        params.setdefault(section, {}).update(values)
    return params


def write_tiny_refund_params(root: Path, **section_overrides: dict[str, Any]) -> Path:
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(tiny_refund_params(root, **section_overrides), sort_keys=False))
    return path
