"""A stepped wall clock does not make a live process look gone.

psutil's ``create_time()`` adds the boot time, which moves with the wall clock (NTP, a VM
resumed); a CI run saw both env workers of a Ray pool declared lost in one step that way. The
identity checks (env workers, the Prefect-server watcher, a run's holder) use the start in ticks
since boot instead. The clock step is simulated by moving psutil's boot time an hour.
"""

from __future__ import annotations

import os
import subprocess
import sys

import psutil
import pytest
from psutil import _pslinux

from agentflow_core.procs import start_time
from tasks import lifetime
from tasks.provenance import holder_alive, process_tags

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the boot clock is read from /proc")


def test_the_start_time_is_psutils_boot_clock_value() -> None:
    me = psutil.Process()
    assert start_time(os.getpid()) == pytest.approx(me.create_time() - psutil.boot_time(), abs=0.02)
    assert start_time(os.getpid()) == me._proc.create_time(monotonic=True)  # psutil's own identity


def test_a_clock_step_moves_psutils_create_time_but_not_the_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    tags, identity = process_tags(), lifetime._identity(psutil.Process())
    before, booted = psutil.Process().create_time(), _pslinux.boot_time()
    monkeypatch.setattr(_pslinux, "boot_time", lambda: booted + 3600.0)  # the wall clock steps an hour
    assert psutil.Process().create_time() == pytest.approx(before + 3600.0)
    assert holder_alive(tags)  # a live run's holder is not taken for dead (its run closed as KILLED)
    assert lifetime._alive(identity) is not None  # nor a live parent (its Prefect servers stopped)


def test_a_process_that_ended_is_gone() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = start_time(child.pid)
    child.wait()
    with pytest.raises(psutil.NoSuchProcess):
        start_time(child.pid)
    assert started > 0


@pytest.mark.usefixtures("ray_session")
def test_a_ray_pool_keeps_its_workers_across_a_clock_step(monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from agentflow_core.config import PoolConfig
    from agentflow_core.pool.ray_pool import RayPool
    from agentflow_core.semantics import SemanticAction
    from tests.pool_fixtures import Fault, TinyFactory, tiny_variants

    variants = tiny_variants(4)
    # one env's first step takes 0.3 s, so the driver polls its workers' liveness while it waits
    factory = TinyFactory(faults={variants[1].env_id: Fault("hang", at_step=1, hang_s=0.3)})
    cfg = PoolConfig(num_workers=2, scheduler="round_robin", step_timeout_s=5.0, step_patience_s=None)
    pool = RayPool(variants, factory, 4, cfg, seed=0)
    try:
        pool.reset(seed=0)
        booted = _pslinux.boot_time()
        monkeypatch.setattr(_pslinux, "boot_time", lambda: booted - 3600.0)  # the clock steps back an hour
        batch = pool.step(np.full(4, int(SemanticAction.LOGIN)))
        assert [info["failure_reason"] for info in batch.infos] == [None] * 4
        assert pool.worker_restarts == 0
    finally:
        pool.close()
