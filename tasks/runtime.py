"""Embedded defaults for the external services, each overridable the usual way.

- Prefect: the ephemeral API with ``PREFECT_HOME`` inside ``<state_dir>/prefect`` unless
  ``PREFECT_API_URL`` (or ``base.tracking.prefect_api_url``) names a server.
- MLflow: ``sqlite:///<state_dir>/mlflow.db`` unless ``MLFLOW_TRACKING_URI`` or
  ``base.tracking.mlflow_uri`` is set.
- Ray: see :mod:`tasks.compose` (a private local Ray unless ``RAY_ADDRESS`` or ``base.ray.address``).
- DVC: the repository's ``.dvc/`` with a local remote under ``<state_dir>/dvc-remote``.

Environment variables win over ``params.yaml`` so the same config runs against a cluster.
"""

from __future__ import annotations

import os
from pathlib import Path

from agentflow_core.config import AgentFlowConfig


def state_dir(cfg: AgentFlowConfig) -> Path:
    """The project-local folder for services' state (created on demand)."""
    path = Path(cfg.base.state_dir).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def configure_services(cfg: AgentFlowConfig) -> dict[str, str]:
    """Set the service environment before prefect/mlflow are imported; returns what was chosen."""
    root = state_dir(cfg)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
    os.environ.setdefault("DVC_NO_ANALYTICS", "1")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("PREFECT_RESULTS_DEFAULT_SERIALIZER", "json")  # a result is never cloudpickled
    if cfg.base.tracking.prefect_api_url and "PREFECT_API_URL" not in os.environ:
        os.environ["PREFECT_API_URL"] = cfg.base.tracking.prefect_api_url
    if "PREFECT_API_URL" not in os.environ:
        os.environ.setdefault("PREFECT_HOME", str(root / "prefect"))
    os.environ.setdefault("MLFLOW_TRACKING_URI", mlflow_uri(cfg))
    return {
        "prefect": os.environ.get("PREFECT_API_URL", f"ephemeral (PREFECT_HOME={os.environ.get('PREFECT_HOME')})"),
        "mlflow": os.environ["MLFLOW_TRACKING_URI"],
    }


def mlflow_uri(cfg: AgentFlowConfig) -> str:
    """Tracking URI: environment, then config, then the project's sqlite file."""
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    if cfg.base.tracking.mlflow_uri:
        return cfg.base.tracking.mlflow_uri
    return f"sqlite:///{state_dir(cfg) / 'mlflow.db'}"
