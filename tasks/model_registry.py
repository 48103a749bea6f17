"""Champion/challenger in the MLflow Model Registry (docs/design.md §5.3).

Every trained candidate is registered as a new version of ``base.tracking.registered_model``;
only a promoted one gets the ``champion`` alias. The decision itself (consistency and reward
gain on a slice of the variants, and for a retrain the paired held-out comparison) is made in
:mod:`tasks.promotion`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
from mlflow.exceptions import MlflowException

from agentflow_core.rl.checkpoint import BEST, load_intact
from tasks.context import PhaseContext
from tasks.policy_model import log_policy_model, tracking_uri_set
from tasks.tracking import MlflowTracker

CHAMPION = "champion"


def candidate_checkpoint(ctx: PhaseContext) -> Path:
    """The best checkpoint of the last training run (the latest if none was ranked)."""
    root = ctx.paths.checkpoints / "checkpoints"
    found = load_intact(root, BEST, vocabulary=ctx.vocabulary) if root.is_dir() else None
    if found is None:
        raise FileNotFoundError(f"no checkpoint under {root}: run `agentflow train` first")
    return found.path


def champion_version(tracker: MlflowTracker, name: str) -> str | None:
    """The registry version the ``champion`` alias points at, or None if there is no champion yet."""
    try:
        return str(tracker.client.get_model_version_by_alias(name, CHAMPION).version)
    except MlflowException:
        return None


def champion_checkpoint(tracker: MlflowTracker, name: str) -> Path | None:
    """Download the current champion's checkpoint folder, or None if there is no champion yet."""
    try:
        version = tracker.client.get_model_version_by_alias(name, CHAMPION)
    except MlflowException:
        return None
    with tracking_uri_set(tracker.tracking_uri):  # models:/ URIs resolve through the fluent registry URI
        local = Path(mlflow.artifacts.download_artifacts(artifact_uri=version.source))
    # pyfunc copies each artifact folder to artifacts/<its own name>; the checkpoint is the one holding state.json
    found = sorted(p.parent for p in local.glob("artifacts/*/state.json"))
    if not found:
        raise FileNotFoundError(f"champion {name} v{version.version} ({version.source}) holds no checkpoint folder")
    return found[0]


def register_candidate(
    ctx: PhaseContext, tracker: MlflowTracker, train_run_id: str, challenger: Path, decision: dict[str, Any]
) -> dict[str, Any]:
    """Register ``challenger`` as a new version; move the ``champion`` alias to it if ``decision`` promotes it."""
    name = ctx.cfg.base.tracking.registered_model
    info = log_policy_model(train_run_id, challenger, tracker.tracking_uri, ctx.vocabulary)
    try:
        tracker.client.get_registered_model(name)
    except MlflowException:
        tracker.client.create_registered_model(
            name, description="AgentFlow semantic policy (one network, all channels)"
        )
    # A tracking server accepts a ``models:/m-…`` source only together with the logged model's id.
    with tracking_uri_set(tracker.tracking_uri):  # the registry resolves models:/<id> through the fluent store
        version = tracker.client.create_model_version(
            name,
            info.model_uri,
            run_id=train_run_id,
            tags={"promotion": str(decision["promote"]), "reason": str(decision["reason"])[:5000]},
            model_id=info.model_id,
        )
    if decision["promote"]:
        tracker.client.set_registered_model_alias(name, CHAMPION, version.version)
    return {**decision, "model_version": version.version, "model_uri": info.model_uri}
