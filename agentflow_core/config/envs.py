"""Config of the envs a cycle runs on: calibration, the variant catalogue and its splits, the env pool."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from agentflow_core.config.base import (
    MAX_VARIANTS,
    BudgetS,
    Count,
    EnvCount,
    Fraction,
    PositiveInt,
    TimeoutS,
    _Section,
)


class CalibrateConfig(_Section):
    """`calibrate` (Phase 0): the sandbox gate a variant family must pass before training sees it."""

    variants_per_family: Annotated[int, Field(gt=0, le=10_000)] = 4
    resets: Count = 100
    max_reward_variance: Annotated[float, Field(gt=0.0)] = 0.05
    max_failed_fraction: Fraction = 0.2
    min_expert_success: Fraction = 0.9
    handled_outcomes: list[str] | None = Field(
        None,
        description=(
            "null: the expert succeeds on the process's goal or a handled outcome it declares for the variant; "
            "a list of failure reasons: those instead of the declared handled outcomes"
        ),
    )
    budget_s: BudgetS = 600.0


class RangeSpec(_Section):
    """A perturbation: uniform float range ``low..high``, integer range, or a list of choices."""

    kind: Literal["uniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    choices: list[Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> RangeSpec:
        if self.kind in ("uniform", "int"):
            if self.low is None or self.high is None:
                raise ValueError(f"a {self.kind} perturbation needs both low and high")
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        elif not self.choices:
            raise ValueError("a choice perturbation needs a non-empty 'choices' list")
        return self


class SplitConfig(_Section):
    """Shares of the catalogue held out for validation (checkpoint choice) and test (reporting only)."""

    validation: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1
    test: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1

    @model_validator(mode="after")
    def _train_left(self) -> SplitConfig:
        if self.validation + self.test >= 1.0:
            raise ValueError(f"validation + test ({self.validation} + {self.test}) must leave a train share (< 1)")
        return self


class VariantsConfig(_Section):
    """`variants`: the catalogue, dimensions (cartesian) x perturbations x samples, and its split."""

    base_envs: list[str] = ["web_checkout_v2", "order_db_v1", "payment_api_v1"]
    dimensions: dict[str, list[Any]] = {
        "start_stage": ["login", "product_detail", "checkout", "payment"],
        "user_tier": ["standard", "vip", "blocked"],
        "network": ["normal", "latency_500ms", "packet_loss_5%"],
    }
    perturbations: dict[str, RangeSpec] = {
        "price_factor": RangeSpec(kind="uniform", low=0.85, high=1.15),
        "inventory": RangeSpec(kind="int", low=0, high=100),
    }
    samples_per_combination: Annotated[int, Field(gt=0, le=100_000)] = 67
    split: SplitConfig = SplitConfig()
    budget_s: BudgetS = 120.0

    @field_validator("dimensions")
    @classmethod
    def _non_empty(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, choices in value.items():
            if not choices:
                raise ValueError(f"dimension {name!r} has no values")
        return value

    @model_validator(mode="after")
    def _catalogue_size(self) -> VariantsConfig:
        size = len(self.base_envs) * self.samples_per_combination
        for choices in self.dimensions.values():
            size *= len(choices)
        if size > MAX_VARIANTS:
            raise ValueError(f"the catalogue would hold {size} variants, more than {MAX_VARIANTS}")
        return self


class PoolConfig(_Section):
    """`pool`: the Ray-backed env pool and its scheduler over the catalogue."""

    num_workers: Annotated[int, Field(ge=0, le=1024)] = 2
    backend: Literal["ray", "inprocess"] = Field(
        "ray",
        description=(
            "where env workers run: Ray actors ('ray') or this process ('inprocess'). "
            "Left out, it is 'ray' whenever num_workers > 0."
        ),
    )
    max_live_per_worker: EnvCount = 256
    step_timeout_s: TimeoutS = 5.0
    step_patience_s: TimeoutS | None = Field(
        0.02,
        description=(
            "a pool step waits this long for an env step, then goes on without it: the slot is left out "
            "of the next pool steps until its step returns (or is ended at step_timeout_s). Hangs then "
            "cost the other slots nothing, but which steps are late depends on timing. A step busy on the "
            "CPU that long (its own thread's CPU clock) is ended as env_timeout instead. When it engages: "
            "see step_patience_engages. null: always wait up to step_timeout_s (training's worker-side "
            "rollouts always wait)."
        ),
    )
    step_patience_engages: Literal["after_timeout", "always"] = Field(
        "after_timeout",
        description=(
            "'after_timeout' (default): an env worker waits for every step, as with a null patience, until "
            "one of its steps or resets has run into step_timeout_s; from then on it applies "
            "step_patience_s. A run in which no step times out is bit-identical to one with a null patience, "
            "and a run with a hang pays the step timeout once per worker instead of once per hang. "
            "'always': apply the patience from the first step (never bit-reproducible)."
        ),
    )
    step_isolation: Literal["thread", "process"] = Field(
        "thread",
        description=(
            "inprocess backend only: 'process' hosts each env worker in a child process that is killed "
            "and replaced after a hung step (no thread outlives it); 'thread' steps envs in this process "
            "(a hung step is abandoned after step_timeout_s, its thread stays)."
        ),
    )
    quarantine_after: PositiveInt = 3
    max_worker_restarts: Annotated[
        int, Field(ge=0, le=10_000, description="Worker restarts allowed within any restart_window_s.")
    ] = 3
    restart_window_s: Annotated[
        float,
        Field(
            gt=0.0,
            le=30 * 24 * 3600.0,
            description="The window the restart budget counts over (a multi-day run "
            "that loses a worker now and then keeps going; a crash loop still stops it).",
        ),
    ] = 3600.0
    scheduler: Literal["uniform", "round_robin", "heat", "plr_coverage"] = "plr_coverage"
    heat_decay: Annotated[
        float, Field(gt=0.0, lt=1.0, description="docs/design.md §2.1: h <- decay*h + k each round (k: times drawn).")
    ] = 0.95
    cold_threshold: Annotated[float, Field(gt=0.0, description="a variant with heat below this is cold.")] = 0.3
    heat_cold_weight: Annotated[
        float, Field(ge=1.0, description="heat: weight of a cold variant (a warm one weighs 1).")
    ] = 20.0
    plr_temperature: Annotated[float, Field(gt=0.0, description="PLR beta: P_S ∝ (1/rank)^(1/beta).")] = 1.0
    plr_staleness_coef: Annotated[
        float, Field(ge=0.0, le=1.0, description="PLR rho: share of the staleness distribution.")
    ] = 0.3
    plr_token_coef: Annotated[float, Field(ge=0.0, le=1.0, description="share of the rare-semantic-token bonus.")] = 0.1
    plr_cold_coef: Annotated[
        float,
        Field(ge=0.0, lt=1.0, description="share of draws given to cold variants (heat < cold_threshold), uniformly."),
    ] = 0.0
    plr_floor: Annotated[float, Field(gt=0.0, le=1.0, description="uniform share so no variant starves.")] = 0.05
    plr_score_ema: Annotated[
        float, Field(gt=0.0, le=1.0, description="EMA rate of a variant's learning-signal score.")
    ] = 0.5
    plr_max_staleness: Annotated[
        float, Field(ge=1.0, description="catalogue sweeps without a draw after which a variant is drawn first.")
    ] = 4.0

    @model_validator(mode="before")
    @classmethod
    def _default_backend(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("backend") is None:
            workers = data.get("num_workers", 2)
            return {**data, "backend": "inprocess" if isinstance(workers, int) and workers == 0 else "ray"}
        return data

    @model_validator(mode="after")
    def _plr_mix(self) -> PoolConfig:
        if self.backend == "ray" and self.num_workers == 0:
            raise ValueError("backend 'ray' needs num_workers >= 1 (or backend: inprocess)")
        if self.plr_staleness_coef + self.plr_token_coef > 1.0:
            raise ValueError(
                f"plr_staleness_coef + plr_token_coef must not exceed 1, got {self.plr_staleness_coef + self.plr_token_coef}"
            )
        return self
