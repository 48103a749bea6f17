"""MLflow at the edge: one parent run per cycle, nested runs per phase, metrics in batches.

The core never imports MLflow; it records diagnostics into a sink with ``record(step, metrics)``.
:class:`MlflowSink` is that sink: each record (one PPO update's diagnostics) goes out as one
``log_batch`` call (a single metric call on the sqlite store costs ~13 ms here, a batch of 1,000
~80 ms), sent by a writer thread while the learner goes on, so a killed run loses at most the
update in flight; it drops steps that the run already holds, so a resumed run continues its
metric history without duplicates.
Every run carries its process tags (:mod:`tasks.provenance`): the next start closes runs whose
process died as KILLED. Every call passes ``run_id`` explicitly: the fluent active run is
thread-local and Prefect runs tasks on worker threads.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from tasks.provenance import holder_alive, process_tags

PARENT_TAG = "mlflow.parentRunId"
KIND_TAG = "agentflow.kind"
CHECKPOINTS_TAG = "agentflow.checkpoints"
PARAMS_HASH_TAG = "agentflow.params_hash"
MAX_BATCH = 900  # log_batch accepts up to 1,000 metrics per call
_NOT_IN_METRIC_NAME = re.compile(r"[^/\w.\- :]")


def metric_name(key: str) -> str:
    """``key`` as MLflow accepts it: a dimension value such as ``packet_loss_5%`` becomes ``packet_loss_5pct``."""
    return _NOT_IN_METRIC_NAME.sub("_", key.replace("%", "pct"))


def local_artifact_root(tracking_uri: str) -> str | None:
    """Artifacts beside a sqlite store (``<dir>/mlartifacts``), not in ``./mlruns`` of whatever the cwd is.

    A tracking server decides its own artifact location, so other URIs get None.
    """
    if not tracking_uri.startswith("sqlite:///"):
        return None
    return (Path(tracking_uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()


class MlflowTracker:
    """Thin, explicit wrapper over :class:`MlflowClient` for the training cycle's run tree."""

    def __init__(self, tracking_uri: str, experiment: str) -> None:
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        found = self.client.get_experiment_by_name(experiment)
        self.experiment_id = (
            found.experiment_id
            if found
            else self.client.create_experiment(experiment, artifact_location=local_artifact_root(tracking_uri))
        )

    def start_cycle(
        self, run_name: str, params: Mapping[str, str], tags: Mapping[str, str] | None = None, kind: str = "cycle"
    ) -> str:
        """Create the top-level run of a cycle (or of a standalone phase) and log the flattened params once."""
        run = self.client.create_run(
            self.experiment_id, run_name=run_name, tags={KIND_TAG: kind, **process_tags(), **(tags or {})}
        )
        items = [Param(key, str(value)[:6000]) for key, value in params.items()]
        for start in range(0, len(items), 100):
            self.client.log_batch(run.info.run_id, params=items[start : start + 100])
        return run.info.run_id

    def close_orphans(self) -> list[str]:
        """Close as KILLED the RUNNING runs whose process on this host is gone; returns their ids."""
        closed = []
        for run in self.client.search_runs([self.experiment_id], filter_string="attributes.status = 'RUNNING'"):
            if not holder_alive(run.data.tags):
                self.client.set_terminated(run.info.run_id, status="KILLED")
                closed.append(run.info.run_id)
        return closed

    def resumable(self, kind: str, checkpoints: Path, params_hash: str) -> str | None:
        """The newest unfinished top-level run of ``kind`` over the same checkpoints and params, if any.

        ``--resume`` continues it (one run, one continuous metric history) instead of opening another.
        """
        found = self.client.search_runs(
            [self.experiment_id],
            filter_string=(
                f"tags.`{KIND_TAG}` = '{kind}' and tags.`{CHECKPOINTS_TAG}` = '{checkpoints.resolve()}' "
                f"and tags.`{PARAMS_HASH_TAG}` = '{params_hash}' and attributes.status != 'FINISHED'"
            ),
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return found[0].info.run_id if found else None

    def reopen(self, run_id: str) -> None:
        """Mark a resumed run RUNNING again, held by this process."""
        self.client.update_run(run_id, status="RUNNING")
        self.set_tags(run_id, process_tags())

    def start_phase(self, parent_run_id: str, phase: str, params: Mapping[str, Any] | None = None) -> str:
        """Create (or reuse, on a rerun) the nested run of one phase under the cycle's run."""
        existing = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}' and tags.`agentflow.phase` = '{phase}'",
            max_results=1,
        )
        if existing:
            run_id = existing[0].info.run_id
            self.reopen(run_id)
            return run_id
        run = self.client.create_run(
            self.experiment_id,
            run_name=phase,
            tags={PARENT_TAG: parent_run_id, "agentflow.phase": phase, **process_tags()},
        )
        if params:
            self.client.log_batch(run.info.run_id, params=[Param(k, str(v)[:6000]) for k, v in params.items()])
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """Log a small dict of metrics in one call."""
        now = int(time.time() * 1000)
        batch = [Metric(metric_name(k), float(v), now, step) for k, v in metrics.items()]
        for start in range(0, len(batch), MAX_BATCH):
            self.client.log_batch(run_id, metrics=batch[start : start + MAX_BATCH])

    def log_new_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """Log only the metrics the run does not already hold at that value (a resumed cycle's cached phase).

        A resume reopens the phase's nested run; logging an unchanged summary again would add a second
        point of every metric to its history.
        """
        held = self.client.get_run(run_id).data.metrics
        fresh = {k: v for k, v in metrics.items() if held.get(metric_name(k)) != float(v)}
        if fresh:
            self.log_metrics(run_id, fresh, step)

    def set_tags(self, run_id: str, tags: Mapping[str, str]) -> None:
        """Set several tags in one call."""
        self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    def log_artifacts(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file or a folder."""
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        elif path.exists():
            self.client.log_artifact(run_id, str(path), artifact_path)

    def end(self, run_id: str, status: str = "FINISHED") -> None:
        """Close a run as FINISHED (or FAILED / KILLED)."""
        self.client.set_terminated(run_id, status=status)

    def run_url(self, run_id: str) -> str:
        """The run's page: on the tracking server, or on ``mlflow ui`` (port 5000) over a local store."""
        base = self.tracking_uri if self.tracking_uri.startswith("http") else "http://127.0.0.1:5000"
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run_id}"

    def sink(self, run_id: str, prefix: str = "") -> MlflowSink:
        """A metrics sink for the core's ``record(step, metrics)`` calls into ``run_id``."""
        return MlflowSink(self, run_id, prefix)


class TrackingError(RuntimeError):
    """The MLflow store refused what a run recorded."""


class MlflowSink:
    """A core-facing metrics sink: ``record(step, metrics)`` hands the record to a writer thread.

    The writer sends each record as it comes (what queued up meanwhile goes in the same
    ``log_batch``), so the caller does not wait for the store: a call costs ~15-40 ms on the sqlite
    store here, about 2 s of a 60-update run, which the driver spends waiting on its env workers
    instead. :meth:`flush` waits until every record is in the store and raises what the writer
    hit; :meth:`close` flushes and stops the thread. A killed process loses what is still queued
    (at most the update just recorded: a write is far shorter than an update), which a resumed
    run logs again.
    """

    def __init__(self, tracker: MlflowTracker, run_id: str, prefix: str = "") -> None:
        self.tracker, self.run_id, self.prefix = tracker, run_id, prefix
        self._last_step = self._last_logged_steps()
        self._queue: queue.SimpleQueue[list[Metric] | None] = queue.SimpleQueue()
        self._done = threading.Condition()
        self._queued = self._written = 0  # records handed over / in the store (or failed)
        self._error: BaseException | None = None
        self._writer: threading.Thread | None = None

    def _last_logged_steps(self) -> dict[str, int]:
        """The highest step of each metric already in the run (a resumed run must not log them again)."""
        client = self.tracker.client
        return {
            key: max(m.step for m in client.get_metric_history(self.run_id, key))
            for key in client.get_run(self.run_id).data.metrics
        }

    def record(self, step: int, metrics: Mapping[str, float]) -> None:
        """Queue one update's metrics for the store, minus those the run already holds at this step or later."""
        self._raise_failure()
        now = int(time.time() * 1000)
        batch = [
            Metric(name, float(v), now, step)
            for name, v in ((metric_name(self.prefix + k), v) for k, v in metrics.items())
            if step > self._last_step.get(name, -1)
        ]
        if not batch:
            return
        if self._writer is None:
            self._writer = threading.Thread(target=self._write, name="agentflow-mlflow-sink", daemon=True)
            self._writer.start()
        with self._done:
            self._queued += 1
        self._queue.put(batch)

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            records: list[list[Metric]] = []
            while item is not None:
                records.append(item)
                if self._queue.empty():
                    break
                item = self._queue.get()
            metrics = [m for batch in records for m in batch]
            try:
                for start in range(0, len(metrics), MAX_BATCH):
                    self.tracker.client.log_batch(self.run_id, metrics=metrics[start : start + MAX_BATCH])
            except BaseException as exc:  # handed to the caller by flush/record
                self._error = self._error or exc
            with self._done:
                self._written += len(records)
                self._done.notify_all()
            if item is None:
                return

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise TrackingError(f"MLflow run {self.run_id}: writing metrics failed: {self._error}") from self._error

    def flush(self) -> None:
        """Wait until every record so far is in the store; raise what the writer hit."""
        with self._done:
            self._done.wait_for(lambda: self._written >= self._queued)
        self._raise_failure()

    def close(self) -> None:
        """Flush, then stop the writer thread."""
        try:
            self.flush()
        finally:
            if self._writer is not None:
                self._queue.put(None)
                self._writer.join()
                self._writer = None
