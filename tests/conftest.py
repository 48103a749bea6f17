"""Shared fixtures. Services are real; each is started once per session where it is slow."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DVC_NO_ANALYTICS", "1")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for the whole session (~5 s to start); actors must not ask for whole CPUs."""
    import ray

    if not ray.is_initialized():
        ray.init(
            address="local",  # never join a Ray someone else started on this machine
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=512 * 1024**2,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(REPO)}},
        )
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect API for the session (~10 s), as Prefect recommends for tests."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
