"""Typed, frozen configuration of one training cycle (the parsed form of ``params.yaml``).

One section per phase plus a shared ``base``. Parsing from YAML happens at the edge
(``tasks.config_io``); the library only ever sees these validated models. Unknown keys are
errors (``extra="forbid"``), every range is declared, and derived values are properties.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RayConfig(_Section):
    address: str | None = Field(None, description="Ray cluster address; None starts a local Ray (RAY_ADDRESS overrides).")
    num_cpus: PositiveInt = 2
    include_dashboard: bool = False
    object_store_mb: Annotated[int, Field(ge=78)] = 512


class TrackingConfig(_Section):
    mlflow_uri: str | None = Field(None, description="MLflow tracking URI; None means sqlite:///<state_dir>/mlflow.db.")
    experiment: str = "agentflow"
    registered_model: str = "agentflow-policy"
    prefect_api_url: str | None = Field(None, description="Prefect server; None uses the ephemeral API.")


class BaseSection(_Section):
    seed: int = 0
    run_name: str = "demo"
    state_dir: str = Field(".agentflow", description="Prefect home, MLflow db, DVC remote, checkpoints live here.")
    data_dir: str = "data"
    env_config_dir: str = "configs/envs"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    ray: RayConfig = RayConfig()
    tracking: TrackingConfig = TrackingConfig()


class CalibrateConfig(_Section):
    variants_per_family: PositiveInt = 4
    resets: PositiveInt = 100
    max_reward_variance: Annotated[float, Field(gt=0.0)] = 0.05
    max_failed_fraction: Fraction = 0.2


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


class VariantsConfig(_Section):
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
    samples_per_combination: PositiveInt = 67

    @field_validator("dimensions")
    @classmethod
    def _non_empty(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, choices in value.items():
            if not choices:
                raise ValueError(f"dimension {name!r} has no values")
        return value


class PoolConfig(_Section):
    num_workers: Annotated[int, Field(ge=0)] = 2
    envs_per_worker: PositiveInt = 32
    max_live_per_worker: PositiveInt = 256
    step_timeout_s: Annotated[float, Field(gt=0.0)] = 5.0
    quarantine_after: PositiveInt = 3
    max_worker_restarts: Annotated[int, Field(ge=0)] = 3
    scheduler: Literal["uniform", "round_robin", "heat", "plr_coverage"] = "plr_coverage"
    heat_decay: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.95
    cold_threshold: Annotated[float, Field(gt=0.0)] = 0.3


class ExploreConfig(_Section):
    total_steps: PositiveInt = 20_000
    num_envs: PositiveInt = 32
    coverage_low: Fraction = 0.8
    coverage_high: Fraction = 0.9
    epsilon_high: Fraction = 0.95
    epsilon_mid: Fraction = 0.3
    epsilon_low: Fraction = 0.1
    shard_rows: PositiveInt = 50_000

    @model_validator(mode="after")
    def _order(self) -> ExploreConfig:
        if not self.coverage_low < self.coverage_high:
            raise ValueError(f"coverage_low ({self.coverage_low}) must be below coverage_high ({self.coverage_high})")
        return self


class ShapingTerm(_Section):
    condition: str
    reward: float
    weight: float = 1.0


class RewardConfig(_Section):
    mode: Literal["scalar", "token_table", "model"] = "token_table"
    token_rewards: dict[str, float] = {"PAYMENT_SUCCESS": 10.0}
    shaping: list[ShapingTerm] = []
    model_url: str | None = None
    model_timeout_s: Annotated[float, Field(gt=0.0)] = 0.5
    normalize: bool = True


class TrainConfig(_Section):
    total_steps: PositiveInt = 200_000
    num_envs: PositiveInt = 64
    n_steps: PositiveInt = 64
    learning_rate: Annotated[float, Field(gt=0.0, lt=1.0)] = 3e-4
    gamma: Annotated[float, Field(gt=0.0, le=1.0)] = 0.99
    gae_lambda: Annotated[float, Field(ge=0.0, le=1.0)] = 0.95
    clip_range: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.08
    ent_coef: Annotated[float, Field(ge=0.0)] = 0.01
    vf_coef: Annotated[float, Field(ge=0.0)] = 0.5
    max_grad_norm: Annotated[float, Field(gt=0.0)] = 0.5
    n_epochs: PositiveInt = 10
    batch_size: PositiveInt = 2048
    minibatch_size: PositiveInt = 512
    max_episode_steps: PositiveInt = 200
    target_kl: Annotated[float, Field(gt=0.0)] = 0.015
    kl_check_every: PositiveInt = 100
    hidden_sizes: list[PositiveInt] = [64, 64]
    checkpoint_every_updates: PositiveInt = 10
    checkpoint_every_minutes: Annotated[float, Field(gt=0.0)] = 120.0
    eval_every_updates: PositiveInt = 10
    eval_episodes: PositiveInt = 64
    heldout_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1
    bc_warm_start: bool = True
    reward: RewardConfig = RewardConfig()

    @model_validator(mode="after")
    def _batches(self) -> TrainConfig:
        if self.minibatch_size > self.batch_size:
            raise ValueError(f"minibatch_size ({self.minibatch_size}) must not exceed batch_size ({self.batch_size})")
        return self


class StressConfig(_Section):
    episodes: PositiveInt = 1000
    consistency_variants: PositiveInt = 100
    consistency_target: Fraction = 0.82
    failure_reward_threshold: float = 5.0
    risk_threshold: Fraction = 0.3
    risk_penalty: Annotated[float, Field(ge=0.0)] = 1.0
    hacking_reward_threshold: float = 5.0


class ReportConfig(_Section):
    formats: list[Literal["md", "html", "json"]] = ["md", "html", "json"]
    champion_slice: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    promote_min_consistency: Fraction = 0.85
    promote_min_reward_gain: float = 0.05


class AgentFlowConfig(_Section):
    """The whole of ``params.yaml``."""

    base: BaseSection = BaseSection()
    calibrate: CalibrateConfig = CalibrateConfig()
    variants: VariantsConfig = VariantsConfig()
    pool: PoolConfig = PoolConfig()
    explore: ExploreConfig = ExploreConfig()
    train: TrainConfig = TrainConfig()
    stress: StressConfig = StressConfig()
    report: ReportConfig = ReportConfig()

    @property
    def phases(self) -> tuple[str, ...]:
        return ("calibrate", "variants", "explore", "train", "stress", "report")
