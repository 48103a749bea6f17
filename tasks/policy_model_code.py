"""MLflow models-from-code script for the policy (``tasks.policy_model.log_policy_model`` logs it).

MLflow copies this file into the model and runs it at load time; ``set_model`` names the model
object. It is never imported as part of ``tasks``. It needs only ``agentflow_core`` (shipped as
the model's code path), torch, safetensors, numpy and pandas.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from agentflow_core.rl.checkpoint import load_checkpoint
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.semantics import CHECKOUT, Vocabulary


class PolicyModel(mlflow.pyfunc.PythonModel):  # type: ignore[name-defined,misc]
    """Greedy semantic action ids from observation columns (and optional mask columns)."""

    def load_context(self, context: Any) -> None:
        """Load the checkpoint artifact into an eval-mode actor-critic, once per loaded model."""
        names_file = context.artifacts.get("vocabulary")
        vocabulary = CHECKOUT
        if names_file is not None:  # the process the policy acts in (models logged before processes had none)
            names = json.loads(Path(names_file).read_text(encoding="utf-8"))
            vocabulary = Vocabulary(
                str(names["version"]),
                tuple(names["tokens"]),
                tuple(names["actions"]),
                tuple(names["features"]),
                tuple(float(r) for r in names["action_risk"]),
                str(names["goal"]),
            )
        self.obs_columns = [f"token.{t}" for t in vocabulary.tokens] + [f"feature.{f}" for f in vocabulary.features]
        self.mask_columns = [f"mask.{a}" for a in vocabulary.actions]
        ckpt = load_checkpoint(Path(context.artifacts["checkpoint"]), vocabulary=vocabulary)
        self.policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, ckpt.state["hidden_sizes"])
        self.policy.load_state_dict(ckpt.model)
        self.policy.eval()

    def predict(self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> np.ndarray:
        """Greedy action ids; mask columns, when all are present, restrict the choice to legal actions."""
        obs = np.array(model_input[self.obs_columns], dtype=np.float32)  # a copy: pandas hands out read-only views
        mask = None
        if all(c in model_input.columns for c in self.mask_columns):
            mask = np.array(model_input[self.mask_columns], dtype=np.float32) > 0.5
        return np.asarray(self.policy.act(obs, mask), dtype=np.int64).reshape(-1)


mlflow.models.set_model(PolicyModel())
