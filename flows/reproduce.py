"""``agentflow reproduce RUN_ID``: rerun a tracked cycle from its commit and params and compare every metric.

The run must come from this checkout's commit with a clean tree (a run made from uncommitted
changes names code that no longer exists): otherwise the command refuses and says how to check
the commit out into a separate git work tree and reproduce there; it never switches the
checkout under the user. The params.yaml logged with the run is restored (and checked against
the run's params hash), the cycle reruns without reusing any cached phase, and each parent-run
metric (the phases' metrics files) and the policy hash are compared; any difference exits 1.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from flows.cli.common import PARAMS_OPTION, config_or_exit

if TYPE_CHECKING:
    from mlflow.entities import Run

    from tasks.tracking import MlflowTracker

console = Console()
err_console = Console(stderr=True, soft_wrap=True)
RUN_ID_ARGUMENT = typer.Argument(..., help="The MLflow parent run of the cycle to reproduce.")
COMPARED_TAGS = ("agentflow.policy_hash",)


def refuse(message: str) -> typer.Exit:
    """Print one line and return the exit-2 error to raise."""
    err_console.print(f"[bold red]cannot reproduce[/]: {escape(message)}", highlight=False)
    return typer.Exit(code=2)


def comparison(original: dict[str, float | str], rerun: dict[str, float | str]) -> tuple[Table, int]:
    """A metric-by-metric table and the number of differences (a missing value is a difference)."""
    table = Table("metric", "original", "reproduced", "same", title="reproduction")
    differences = 0
    for key in sorted(set(original) | set(rerun)):
        a, b = original.get(key), rerun.get(key)
        same = a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))
        differences += not same
        table.add_row(key, str(a), str(b), "[green]yes[/]" if same else "[bold red]NO[/]")
    return table, differences


def is_timing(key: str) -> bool:
    """Wall-clock use (``budget/<phase>/wall_s``, ``.../wall_fraction``, a phase summary's ``wall_s``) and the
    training loop's measured rates (``impedance/*``): measured, never reproduced."""
    if key.startswith(("impedance/", "train/impedance/")):  # the cycle's measured rates (agentflow_core.tuning)
        return True
    return key.rsplit("/", 1)[-1] in ("wall_s", "wall_fraction")  # budget/<phase>/wall_s, a phase's own wall_s


def tracked_values(run: Run) -> dict[str, float | str]:
    """What a reproduction must match: every metric of the parent run but timings, and the policy hash."""
    metrics = {k: v for k, v in run.data.metrics.items() if not is_timing(k)}
    return {**metrics, **{k: run.data.tags[k] for k in COMPARED_TAGS if k in run.data.tags}}


def reproduce_command(run_id: str = RUN_ID_ARGUMENT, params: Path = PARAMS_OPTION) -> None:
    """Rerun an MLflow cycle run from its commit and params; print every metric side by side; exit 1 on a difference.

    ``--params`` only locates the tracking store (``base.state_dir``, ``base.tracking``); the run's
    own params.yaml is restored from MLflow.
    """
    from mlflow.exceptions import MlflowException

    from tasks.runtime import configure_services, mlflow_uri, state_dir

    cfg = config_or_exit(params)
    configure_services(cfg)
    from tasks.provenance import GIT_COMMIT_TAG, GIT_DIRTY_TAG, git_state
    from tasks.tracking import KIND_TAG, PARAMS_HASH_TAG, MlflowTracker

    tracker = MlflowTracker(mlflow_uri(cfg), cfg.base.tracking.experiment)
    try:
        run = tracker.client.get_run(run_id)
    except MlflowException:
        raise refuse(f"no run {run_id} in {tracker.tracking_uri}") from None
    tags = run.data.tags
    if tags.get(KIND_TAG) != "cycle":
        raise refuse(f"run {run_id} is not a training cycle's parent run (kind {tags.get(KIND_TAG)!r})")
    commit, here = tags.get(GIT_COMMIT_TAG, "unknown"), git_state()
    if tags.get(GIT_DIRTY_TAG) != "false":
        raise refuse(f"run {run_id} ran uncommitted changes on top of {commit}: its code is not recorded")
    if here is None or here.commit != commit or here.dirty:
        at = "no git checkout" if here is None else f"{here.commit}{' with uncommitted changes' if here.dirty else ''}"
        raise refuse(
            f"run {run_id} ran commit {commit}; this checkout is at {at}. Reproduce it in a separate work tree: "
            f"git worktree add ../agentflow-{commit[:8]} {commit} && cd ../agentflow-{commit[:8]} && make install "
            f"&& bin/agentflow reproduce {run_id}"
        )
    restored = restore_params(tracker, run_id, state_dir(cfg) / "reproduce" / run_id)
    from tasks.stages import params_hash

    rerun_cfg = config_or_exit(restored)
    if params_hash(rerun_cfg) != tags.get(PARAMS_HASH_TAG):
        raise refuse(f"the params.yaml logged with run {run_id} does not match its params hash")

    from flows.training_cycle import training_cycle
    from tasks.prefect_tasks import GateFailed

    try:
        choice = restore_choice(tracker, run_id, state_dir(cfg) / "reproduce" / run_id)
        results = training_cycle(
            params_path=str(restored), run_name=f"reproduce-{run_id[:8]}", use_cache=False, tuning_choice=choice
        )
        new_id = results["mlflow_run_id"]
    except GateFailed as exc:
        err_console.print(f"[bold red]gate failed[/] in the rerun: {exc}")
        new_id = None
    again = tracked_values(tracker.client.get_run(new_id)) if new_id else {}
    table, differences = comparison(tracked_values(run), again)
    console.print(table)
    if differences:
        err_console.print(f"[bold red]{differences} of {len(table.rows)} values differ[/] (rerun: {new_id})")
        raise typer.Exit(code=1)
    console.print(f"[green]all {len(table.rows)} values identical[/]: run {new_id} reproduces {run_id}")


def restore_choice(tracker: MlflowTracker, run_id: str, dest: Path) -> str | None:
    """The auto-tuner's choice.json logged with the run (its rerun replays it), or None for a run without one."""
    from mlflow.exceptions import MlflowException

    dest.mkdir(parents=True, exist_ok=True)
    try:
        local = Path(tracker.client.download_artifacts(run_id, "tuning", str(dest)))
    except (MlflowException, OSError):
        return None
    found = sorted(local.glob("choice.json"))
    return str(found[0]) if found else None


def restore_params(tracker: MlflowTracker, run_id: str, dest: Path) -> Path:
    """Download the params.yaml logged with the run into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    local = tracker.client.download_artifacts(run_id, "config", str(dest))
    files = sorted(Path(local).glob("*.yaml")) + sorted(Path(local).glob("*.yml"))
    if not files:
        raise refuse(f"run {run_id} has no params.yaml artifact (config/)")
    return files[0]
