"""Config of the evaluation phases: stress (with sim-to-real), the report, the reward validator."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from agentflow_core.config.base import (
    MAX_WIDTH,
    BudgetS,
    Count,
    EnvCount,
    Fraction,
    _Section,
)


class SimToRealConfig(_Section):
    """Sim-to-real validation in Phase 3: the policy on the real channels next to the simulated ones.

    Per family, the first ``episodes_per_family`` variants of the stress sample (test split) run once on
    the simulated channel and once on its real counterpart with the same seed (web_checkout: headless
    Chromium on the storefront web app; order_db: PostgreSQL through pgserver; payment_api: the HTTP
    server in a separately started process; any process's channel: what its ``real_channels`` declare).
    """

    enabled: bool = False
    episodes_per_family: Annotated[int, Field(gt=0, le=1000)] = 16
    max_gap: Fraction = Field(
        0.02, description="Gate: sim minus real process success, per family, at most this (when enabled)."
    )
    families: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]] | None = Field(
        None,
        description="Families to pair with their real channel (null: every channel of the process that has one: "
        "its process file's real_channels; checkout's three in tasks/real_channels.py).",
    )
    env_config_dir: str = Field("configs/real_envs", description="Registry of the real-only envs (the browser).")
    oscar_env_config_dir: str = Field("configs/oscar", description="Registry of the django-oscar store's env.")
    oscar_episodes: Annotated[int, Field(ge=0, le=1000)] = Field(
        0,
        description="Paired episodes on the django-oscar store (0: off), with variants of the family its env "
        "config pairs it with (kwargs.paired_family; default web_checkout).",
    )
    oscar_dimensions: list[Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")]] = Field(
        ["network", "inventory", "start_stage"],
        description="Scenario dimensions the Oscar sample is stratified over (checkout: network, inventory, "
        "start_stage, price_factor; checkout_v2: card, gateway, customer, account).",
    )


class StressConfig(_Section):
    """Phase 3 stress validation (agentflow_core.evaluation documents every measure)."""

    episodes: Count = 1000
    variants: Count = Field(720, description="Size of the stratified catalogue sample the episodes run on.")
    num_envs: EnvCount = 32
    consistency_variants: Count = 100
    consistency_target: Fraction = 0.82
    failure_reward_threshold: float = 5.0
    risk_threshold: Fraction = 0.3
    risk_penalty: Annotated[float, Field(ge=0.0)] = 1.0
    hacking_reward_threshold: float = 5.0
    coverage_group: str = Field(
        "network", description="Variant dimension that groups the coverage heatmap rows (with the family)."
    )
    long_tail_frequency: Fraction = Field(
        0.01, description="Tokens seen on fewer than this share of steps are long-tail."
    )
    min_robustness: Fraction = Field(0.8, description="Phase 3 gate: robustness_score must reach this.")
    max_crash_rate: Fraction = Field(0.0, description="Phase 3 gate: share of crashed episodes allowed.")
    sim_to_real: SimToRealConfig = SimToRealConfig()
    budget_s: BudgetS = 600.0


class ReportConfig(_Section):
    """Reports and the champion/challenger canary (docs/design.md §5.3)."""

    formats: list[Literal["md", "html", "json"]] = ["md", "html", "json"]
    champion_slice: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    champion_episodes: Count = Field(200, description="Episodes per policy on the champion slice.")
    promote_min_consistency: Fraction = 0.85
    promote_min_reward_gain: float = 0.05
    budget_s: BudgetS = 300.0


class ValidatorConfig(_Section):
    """`validator`: the discriminator reward validator (docs/design-003.md §3.2, ``agentflow_core.evaluation.validator``).

    Trained after exploration to tell the expert's steps from a near-uniform policy's at the same
    states; an episode whose mean authenticity is below ``threshold`` is suspicious. Training pays
    the positive rewards of suspicious episodes times ``suspicious_weight``; stress and the report
    flag them.
    """

    enabled: bool = True
    hidden: Annotated[int, Field(gt=0, le=MAX_WIDTH)] = 64
    epochs: Annotated[int, Field(gt=0, le=1000)] = 30
    max_samples: Count = 50_000
    threshold: Fraction = Field(0.5, description="Episodes with mean authenticity below this are suspicious.")
    suspicious_weight: Fraction = Field(0.1, description="Factor on the positive rewards of suspicious episodes.")
    min_heldout_accuracy: Fraction = Field(
        0.8, description="Gate: expert-vs-policy accuracy of the discriminator on 10% held-out states."
    )
    budget_s: BudgetS = 60.0
