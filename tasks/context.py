"""What every phase works with, built once at its entry point and handed to its steps.

A CLI command, a Prefect task or a DVC stage parses ``params.yaml`` and builds one
:class:`PhaseContext`: the configuration, where the phase reads and writes, the env registry, the
business process and the pool backend. The step functions receive it instead of rebuilding the
registry, the process and the paths from the configuration in every helper they call.
"""

from __future__ import annotations

from dataclasses import dataclass

from agentflow_core.config import AgentFlowConfig
from agentflow_core.process import ProcessSpec
from agentflow_core.registry import EnvRegistry
from agentflow_core.semantics import Vocabulary
from tasks.backend import Backend, backend_of
from tasks.paths import DataPaths
from tasks.process_io import load_process
from tasks.registry_io import load_registry


@dataclass(frozen=True)
class PhaseContext:
    """A phase's configuration with the registry, process, paths and backend it implies."""

    cfg: AgentFlowConfig
    paths: DataPaths
    registry: EnvRegistry
    process: ProcessSpec
    backend: Backend

    @classmethod
    def of(cls, cfg: AgentFlowConfig) -> PhaseContext:
        """Everything ``cfg`` selects: its data layout, env registry, process (validated with its channels), backend."""
        return cls(cfg, DataPaths.of(cfg), load_registry(cfg), load_process(cfg), backend_of(cfg))

    def with_config(self, cfg: AgentFlowConfig) -> PhaseContext:
        """The context of a changed configuration (a retrain's seed, a one-worker probe), reusing what it keeps."""
        same_envs = cfg.base.env_config_dir == self.cfg.base.env_config_dir
        registry = self.registry if same_envs else load_registry(cfg)
        process = self.process if same_envs and cfg.process == self.cfg.process else load_process(cfg)
        return PhaseContext(cfg, DataPaths.of(cfg), registry, process, backend_of(cfg))

    @property
    def vocabulary(self) -> Vocabulary:
        """The process's vocabulary: the widths and names every phase builds over."""
        return self.process.vocabulary
