"""Where each phase reads and writes, shared by the CLI, the DVC stages and the Prefect flow."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agentflow_core.config import AgentFlowConfig


@dataclass(frozen=True)
class DataPaths:
    """The data layout under ``base.data_dir``; each folder is one DVC output."""

    root: Path

    @classmethod
    def of(cls, cfg: AgentFlowConfig) -> DataPaths:
        return cls(Path(cfg.base.data_dir))

    @property
    def calibration(self) -> Path:
        return self.root / "calibration"

    @property
    def variants(self) -> Path:
        return self.root / "variants"

    @property
    def catalogue(self) -> Path:
        return self.variants / "catalogue.parquet"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def stress(self) -> Path:
        return self.root / "stress"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def bench(self) -> Path:
        return self.root / "bench"

    def metrics_file(self, phase: str) -> Path:
        return self.metrics / f"{phase}.json"
