"""The trained policy as an MLflow model: ``mlflow.pyfunc.load_model("models:/<name>@champion")``.

The model's artifact is the checkpoint folder (safetensors weights + JSON state, no pickled
code of ours). ``predict`` takes encoded semantic observations (``OBS_DIM`` columns, optionally
followed by ``N_ACTIONS`` mask columns) and returns the greedy semantic action ids.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from agentflow_core.rl.checkpoint import load_checkpoint
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.semantics import N_ACTIONS, OBS_DIM

CHECKPOINT_ARTIFACT = "checkpoint"


def hidden_sizes_of(model: dict[str, Any]) -> list[int]:
    """Recover the actor's hidden layer widths from a state dict (weights ``actor.<i>.weight``)."""
    weights = sorted(
        (k for k in model if k.startswith("actor.") and k.endswith(".weight")), key=lambda k: int(k.split(".")[1])
    )
    return [int(model[k].shape[0]) for k in weights[:-1]]


def policy_from_checkpoint(path: Path) -> ActorCritic:
    """Rebuild the actor-critic of a checkpoint folder on CPU."""
    ckpt = load_checkpoint(Path(path))
    policy = ActorCritic(hidden_sizes=hidden_sizes_of(ckpt.model))
    policy.load_state_dict(ckpt.model)
    policy.eval()
    return policy


class PolicyModel(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined,misc]
    """Greedy semantic actions from encoded observations."""

    def load_context(self, context: Any) -> None:
        self.policy = policy_from_checkpoint(Path(context.artifacts[CHECKPOINT_ARTIFACT]))

    def predict(self, context: Any, model_input: Any, params: dict[str, Any] | None = None) -> np.ndarray:
        values = model_input.to_numpy() if isinstance(model_input, pd.DataFrame) else np.asarray(model_input)
        values = values.astype(np.float32).reshape(len(values), -1)
        obs = values[:, :OBS_DIM]
        mask = values[:, OBS_DIM : OBS_DIM + N_ACTIONS] > 0.5 if values.shape[1] >= OBS_DIM + N_ACTIONS else None
        return self.policy.act(obs, mask)


def log_policy_model(run_id: str, checkpoint: Path, tracking_uri: str) -> str:
    """Log ``checkpoint`` as a pyfunc model in ``run_id``; returns the model URI (``runs:/...``)."""
    example = np.zeros((1, OBS_DIM), dtype=np.float32)
    with tracking_uri_set(tracking_uri), mlflow.start_run(run_id=run_id):
        info = mlflow.pyfunc.log_model(
            name="policy",
            python_model=PolicyModel(),
            artifacts={CHECKPOINT_ARTIFACT: str(checkpoint)},
            input_example=example,
            pip_requirements=["torch==2.13.0", "safetensors", "numpy", "pandas"],
        )
    return str(info.model_uri)


@contextmanager
def tracking_uri_set(tracking_uri: str) -> Iterator[None]:
    """Point the fluent API at ``tracking_uri`` for one block, then restore it.

    ``mlflow.set_tracking_uri`` also exports ``MLFLOW_TRACKING_URI``; left alone it would leak into
    every later run of this process (another cycle with another store).
    """
    previous_env = os.environ.get("MLFLOW_TRACKING_URI")
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(tracking_uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if previous_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous_env
