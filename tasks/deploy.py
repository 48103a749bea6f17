"""``agentflow deploy``: the training cycle as a deployment on a Prefect *process* work pool.

``agentflow serve`` keeps one process open that both holds the schedule and runs the flow; a
work-pool deployment leaves the schedule to the Prefect server and the runs to any number of
``prefect worker start --pool <pool>`` processes, started and supervised like any service. The
deployment's code is this checkout (``flow.from_source`` with a local path: the worker runs the
flow from ``flows/training_cycle.py`` with this directory as its working directory, in the
worker's own Python, so start the worker from this checkout's ``.venv``). Parameters a run can set
from the UI or the API: ``params_path``, ``overrides`` (dotted params.yaml keys, validated like the
file), ``retrain``, ``run_name``, ``resume``, ``use_cache``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast
from uuid import UUID

from agentflow_core.errors import AgentFlowError

REPO = Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/training_cycle.py:training_cycle"
POOL_TYPE = "process"
# The flow run's process gets the worker's environment plus these (no telemetry from an offline box).
RUN_ENV = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1", "RAY_USAGE_STATS_ENABLED": "0"}


def ensure_process_pool(name: str) -> str:
    """Create the process work pool ``name`` unless it exists; an existing pool of another type is an error."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            client.create_work_pool(
                WorkPoolCreate(
                    name=name, type=POOL_TYPE, base_job_template=ProcessWorker.get_default_base_job_template()
                )
            )
            return "created"
        except ObjectAlreadyExists:
            pool = client.read_work_pool(name)
            if pool.type != POOL_TYPE:
                raise AgentFlowError(
                    f"work pool {name!r} exists with type {pool.type!r}, expected {POOL_TYPE!r}"
                ) from None
            return "exists"


def deploy_cycle(
    name: str,
    pool: str,
    parameters: dict[str, Any],
    cron: str | None = None,
    source: Path = REPO,
) -> UUID:
    """Register (or update) the deployment ``agentflow-training-cycle/<name>`` on ``pool``; returns its id."""
    from prefect import Flow
    from prefect import flow as prefect_flow

    ensure_process_pool(pool)
    # from_source/deploy are sync here (called outside an event loop); their annotations also admit the async form
    remote = cast(Flow[..., Any], prefect_flow.from_source(source=str(source), entrypoint=ENTRYPOINT))
    deployment_id = remote.deploy(
        name=name,
        work_pool_name=pool,
        cron=cron,
        parameters=parameters,
        job_variables={"env": RUN_ENV, "working_dir": str(source)},
        description="AgentFlow training cycle: calibrate -> variants -> explore -> train -> stress -> report",
        build=False,
        push=False,
        print_next_steps=False,
    )
    return cast(UUID, deployment_id)
