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
        """The layout of ``cfg``'s data directory, so every entry point agrees on where a phase writes."""
        return cls(Path(cfg.base.data_dir))

    @property
    def calibration(self) -> Path:
        """Output of ``calibrate``: per-variant stability and step-reward statistics."""
        return self.root / "calibration"

    @property
    def variants(self) -> Path:
        """Output of ``variants``: the catalogue and its metadata."""
        return self.root / "variants"

    @property
    def catalogue(self) -> Path:
        """The variant catalogue table (one row per variant) inside :attr:`variants`."""
        return self.variants / "catalogue.parquet"

    @property
    def trajectories(self) -> Path:
        """Output of ``explore``: the trajectories train's behaviour-cloning warm start reads."""
        return self.root / "trajectories"

    @property
    def offline(self) -> Path:
        """Output of ``offline``: the BC+CQL actor train starts from, the Q network, the summary."""
        return self.root / "offline"

    @property
    def tuning(self) -> Path:
        """Output of ``tune``: ``choice.json``, the settings train runs with and why (``tasks.steps.tune``)."""
        return self.root / "tuning"

    @property
    def checkpoints(self) -> Path:
        """Output of ``train``: checkpoints, learning curves and the best policy."""
        return self.root / "checkpoints"

    @property
    def stress(self) -> Path:
        """Output of ``stress``: step and episode records of the stratified sample and their summary."""
        return self.root / "stress"

    @property
    def reports(self) -> Path:
        """Output of ``report``: the evaluation report in JSON, markdown and HTML."""
        return self.root / "reports"

    @property
    def metrics(self) -> Path:
        """One small JSON per phase, declared as DVC metrics (kept out of the cache)."""
        return self.root / "metrics"

    def metrics_file(self, phase: str) -> Path:
        """Where ``phase`` writes its DVC metrics (``dvc metrics show`` reads them)."""
        return self.metrics / f"{phase}.json"
