"""The trained policy as an MLflow model: ``mlflow.pyfunc.load_model("models:/<name>@champion")``.

The model is logged from code (MLflow's models-from-code): ``tasks/policy_model_code.py`` is
copied into the model as a script and the checkpoint folder (safetensors weights + JSON state)
as its artifact, with ``agentflow_core`` as its code path, so nothing of ours is pickled and the
model loads without this repository. ``predict`` takes a DataFrame with one column per
observation entry (``token.<TOKEN>`` multi-hot, ``feature.<name>`` scaled numbers; build it with
:func:`policy_frame`) and optional ``mask.<ACTION>`` columns (1 = legal); it returns the greedy
semantic action id per row (``agentflow_core.semantics.ACTIONS``). The signature and an input
example travel with the model.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.types import ColSpec, Schema, TensorSpec

import agentflow_core
from agentflow_core.semantics import Vocabulary

CHECKPOINT_ARTIFACT = "checkpoint"
MODEL_CODE = Path(__file__).with_name("policy_model_code.py")
VOCABULARY_ARTIFACT = "vocabulary"  # the process's names and widths (policy_model_code.py reads it)


def columns(vocabulary: Vocabulary) -> tuple[list[str], list[str]]:
    """(observation columns, mask columns) of a policy over ``vocabulary``."""
    obs = [f"token.{t}" for t in vocabulary.tokens] + [f"feature.{f}" for f in vocabulary.features]
    return obs, [f"mask.{a}" for a in vocabulary.actions]


def policy_frame(obs: np.ndarray, mask: np.ndarray | None = None, *, vocabulary: Vocabulary) -> pd.DataFrame:
    """The model's input for encoded observations ``(n, obs_dim)`` and optional masks ``(n, n_actions)``."""
    obs_columns, mask_columns = columns(vocabulary)
    frame = pd.DataFrame(np.asarray(obs, dtype=np.float32).reshape(-1, len(obs_columns)), columns=obs_columns)
    if mask is not None:
        masks = np.asarray(mask, dtype=np.float32).reshape(-1, len(mask_columns))
        frame = pd.concat([frame, pd.DataFrame(masks, columns=mask_columns)], axis=1)
    return frame


def policy_signature(vocabulary: Vocabulary) -> ModelSignature:
    """Observation columns required, mask columns optional; one action id out."""
    obs_columns, mask_columns = columns(vocabulary)
    inputs: list[ColSpec | TensorSpec] = [ColSpec("float", c) for c in obs_columns]
    inputs += [ColSpec("float", c, required=False) for c in mask_columns]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema([ColSpec("long", "action")]))


def log_policy_model(
    run_id: str, checkpoint: Path, tracking_uri: str, vocabulary: Vocabulary
) -> mlflow.models.model.ModelInfo:
    """Log ``checkpoint`` (a policy over ``vocabulary``) as a models-from-code pyfunc model in ``run_id``."""
    example = policy_frame(np.zeros((1, vocabulary.obs_dim)), np.ones((1, vocabulary.n_actions)), vocabulary=vocabulary)
    names = {
        "version": vocabulary.version,
        "tokens": list(vocabulary.tokens),
        "actions": list(vocabulary.actions),
        "features": list(vocabulary.features),
        "action_risk": list(vocabulary.action_risk),
        "goal": vocabulary.goal,
    }
    with (
        tempfile.TemporaryDirectory() as tmp,
        tracking_uri_set(tracking_uri),
        mlflow.start_run(run_id=run_id),
    ):
        names_file = Path(tmp) / "vocabulary.json"
        names_file.write_text(json.dumps(names), encoding="utf-8")
        return mlflow.pyfunc.log_model(
            name="policy",
            python_model=str(MODEL_CODE),
            artifacts={CHECKPOINT_ARTIFACT: str(checkpoint), VOCABULARY_ARTIFACT: str(names_file)},
            code_paths=[str(Path(agentflow_core.__file__).parent)],
            signature=policy_signature(vocabulary),
            input_example=example,
            pip_requirements=["torch==2.13.0", "safetensors", "numpy", "pandas"],
        )


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
