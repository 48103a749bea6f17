"""Typed, frozen configuration of one training cycle (the parsed form of ``params.yaml``).

One section per phase plus a shared ``base``. Parsing from YAML happens at the edge
(``tasks.config_io``); the library only ever sees these validated models. Unknown keys are
errors (``extra="forbid"``), every range is declared, and derived values are properties.

The sections live by subject (:mod:`.base`: field types and ``base``; :mod:`.envs`: calibration,
variants, pool; :mod:`.learning`: explore, reward, train, offline, tune; :mod:`.evaluation`:
stress, report, validator); every name is importable from ``agentflow_core.config``.
"""

from __future__ import annotations

from pydantic import Field

from agentflow_core.config.base import (
    MAX_BUDGET_S,
    MAX_COUNT,
    MAX_ENVS,
    MAX_LAYERS,
    MAX_STEPS,
    MAX_TIMEOUT_S,
    MAX_VARIANTS,
    MAX_WIDTH,
    BaseSection,
    BudgetS,
    Count,
    EnvCount,
    Fraction,
    PositiveInt,
    RayConfig,
    Seed,
    StepCount,
    TimeoutS,
    TrackingConfig,
    _Section,
)
from agentflow_core.config.envs import (
    CalibrateConfig,
    PoolConfig,
    RangeSpec,
    SplitConfig,
    VariantsConfig,
)
from agentflow_core.config.evaluation import (
    ReportConfig,
    SimToRealConfig,
    StressConfig,
    ValidatorConfig,
)
from agentflow_core.config.learning import (
    CoverageRemediation,
    EWCConfig,
    ExploreConfig,
    OfflineConfig,
    OfflineGate,
    OfflineReplay,
    RewardConfig,
    ShapingTerm,
    TrainConfig,
    TrainGate,
    TuneConfig,
)

__all__ = [
    "AgentFlowConfig",
    "BaseSection",
    "BudgetS",
    "CalibrateConfig",
    "Count",
    "CoverageRemediation",
    "EWCConfig",
    "EnvCount",
    "ExploreConfig",
    "Fraction",
    "MAX_BUDGET_S",
    "MAX_COUNT",
    "MAX_ENVS",
    "MAX_LAYERS",
    "MAX_STEPS",
    "MAX_TIMEOUT_S",
    "MAX_VARIANTS",
    "MAX_WIDTH",
    "OfflineConfig",
    "OfflineGate",
    "OfflineReplay",
    "PoolConfig",
    "PositiveInt",
    "RangeSpec",
    "RayConfig",
    "ReportConfig",
    "RewardConfig",
    "Seed",
    "ShapingTerm",
    "SimToRealConfig",
    "SplitConfig",
    "StepCount",
    "StressConfig",
    "TimeoutS",
    "TrackingConfig",
    "TrainConfig",
    "TrainGate",
    "TuneConfig",
    "ValidatorConfig",
    "VariantsConfig",
]


class AgentFlowConfig(_Section):
    """The whole of ``params.yaml``."""

    process: str = Field(
        "checkout",
        pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$",
        description="The business process: configs/processes/<process>.yaml (agentflow_core/process.py).",
    )
    base: BaseSection = BaseSection()
    calibrate: CalibrateConfig = CalibrateConfig()
    variants: VariantsConfig = VariantsConfig()
    pool: PoolConfig = PoolConfig()
    explore: ExploreConfig = ExploreConfig()
    offline: OfflineConfig = OfflineConfig()
    train: TrainConfig = TrainConfig()
    stress: StressConfig = StressConfig()
    report: ReportConfig = ReportConfig()
    validator: ValidatorConfig = ValidatorConfig()
    tune: TuneConfig = TuneConfig()

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases in the order the cycle runs them."""
        return ("calibrate", "variants", "explore", "offline", "train", "stress", "report")
