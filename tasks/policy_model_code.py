"""MLflow models-from-code script for the policy (``tasks.policy_model.log_policy_model`` logs it).

MLflow copies this file into the model and runs it at load time; ``set_model`` names the model
object. It is never imported as part of ``tasks``. It needs only ``agentflow_core`` (shipped as
the model's code path), torch, safetensors, numpy and pandas.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from agentflow_core.rl.checkpoint import load_checkpoint
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.semantics import ACTIONS, FEATURES, TOKENS

OBS_COLUMNS = [f"token.{t}" for t in TOKENS] + [f"feature.{f}" for f in FEATURES]
MASK_COLUMNS = [f"mask.{a}" for a in ACTIONS]


class PolicyModel(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined,misc]
    """Greedy semantic action ids from observation columns (and optional mask columns)."""

    def load_context(self, context: Any) -> None:
        """Load the checkpoint artifact into an eval-mode actor-critic, once per loaded model."""
        ckpt = load_checkpoint(Path(context.artifacts["checkpoint"]))
        self.policy = ActorCritic(hidden_sizes=ckpt.state["hidden_sizes"])
        self.policy.load_state_dict(ckpt.model)
        self.policy.eval()

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray:
        """Greedy action ids; mask columns, when all are present, restrict the choice to legal actions."""
        obs = np.array(model_input[OBS_COLUMNS], dtype=np.float32)  # a copy: pandas hands out read-only views
        mask = None
        if all(c in model_input.columns for c in MASK_COLUMNS):
            mask = np.array(model_input[MASK_COLUMNS], dtype=np.float32) > 0.5
        return np.asarray(self.policy.act(obs, mask), dtype=np.int64).reshape(-1)


mlflow.models.set_model(PolicyModel())
