"""The config's building blocks: bounded field types, the strict frozen section, shared validators, ``base``.

Every section forbids unknown keys, is frozen and refuses NaN/inf; the bounds below are what no
run on one machine reaches (beyond them a typo would allocate, loop or wait forever).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
# Upper bounds that no run on one machine reaches; beyond them a typo would allocate, loop or wait forever.
MAX_ENVS = 4096
MAX_STEPS = 10**10
MAX_COUNT = 10**7
MAX_WIDTH = 4096
MAX_LAYERS = 8
MAX_TIMEOUT_S = 3600.0
MAX_VARIANTS = 10**6
EnvCount = Annotated[int, Field(gt=0, le=MAX_ENVS)]
StepCount = Annotated[int, Field(gt=0, le=MAX_STEPS)]
Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Seed = Annotated[int, Field(ge=0, lt=2**32, description="numpy and torch seeds are 32-bit.")]
TimeoutS = Annotated[float, Field(gt=0.0, le=MAX_TIMEOUT_S)]
# A phase's wall-clock allotment (docs/design.md §2.2: the article's days become per-phase budgets); at most 30 days.
MAX_BUDGET_S = 30 * 24 * 3600.0
BudgetS = Annotated[
    float, Field(gt=0.0, le=MAX_BUDGET_S, description="Wall-clock seconds this phase is allotted (recorded vs used).")
]


class _Section(BaseModel):
    # Every float is finite: a NaN reward or an infinite timeout passes every range check and
    # surfaces hours later as an all-NaN policy or a hang.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def _vocabulary(info: ValidationInfo) -> Any:
    """The selected process's vocabulary (``context={"vocabulary": ...}`` at load), else checkout's."""
    from agentflow_core.semantics import CHECKOUT

    return (info.context or {}).get("vocabulary", CHECKOUT)


class RayConfig(_Section):
    """`base.ray`: where Ray runs and how much of the machine it may take."""

    address: str | None = Field(
        None, description="Ray cluster address; None starts a local Ray (RAY_ADDRESS overrides)."
    )
    num_cpus: Annotated[int, Field(gt=0, le=1024)] = 2
    include_dashboard: bool = False
    object_store_mb: Annotated[int, Field(ge=78, le=1 << 20)] = 512


class TrackingConfig(_Section):
    """`base.tracking`: where MLflow and Prefect keep runs, and the names runs and the champion go under."""

    mlflow_uri: str | None = Field(None, description="MLflow tracking URI; None means sqlite:///<state_dir>/mlflow.db.")
    experiment: str = "agentflow"
    registered_model: str = "agentflow-policy"
    prefect_api_url: str | None = Field(None, description="Prefect server; None uses the ephemeral API.")


class BaseSection(_Section):
    """`base`: what every phase shares: seed, run name, state and data directories, device, Ray and tracking."""

    seed: Seed = 0
    run_name: str = "demo"
    state_dir: str = Field(".agentflow", description="Prefect home, MLflow db, DVC remote, checkpoints live here.")
    data_dir: str = "data"
    env_config_dir: str = "configs/envs"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    ray: RayConfig = RayConfig()
    tracking: TrackingConfig = TrackingConfig()

    @field_validator("device")
    @classmethod
    def _device_present(cls, value: str) -> str:
        if value != "cuda":
            return value
        # Imported here, for "cuda" only: torch is heavy, and a command imports it when it needs it.
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' but torch sees no CUDA GPU on this machine (use 'cpu' or 'auto')")
        return value
