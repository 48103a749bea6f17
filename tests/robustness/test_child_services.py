"""A killed command leaves no child service behind: each is gone within 10 s of a ``kill -9``.

Each case starts a small command process that starts one real service the way the product does
(the payment API server process, the embedded PostgreSQL, headless Chromium, a private local Ray)
with its watchdog (:func:`tasks.child_reaper.start_reaper`), records the service's processes --
the command's descendants, plus the postmaster, which ``pg_ctl`` reparents away at once -- then
SIGKILLs the command (no exit handler runs) and waits for every recorded process to end.
Everything listens on loopback only. The postmaster is found by construction, not by polling: the
command tells its watchdog the server's folder before the server starts, and the watchdog stops
whatever names that folder (checked on its own with a process outside any command's tree).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tasks.child_reaper import reap

REPO = Path(__file__).resolve().parents[2]
DEADLINE_S = 10.0

COMMAND = """
import sys, time
from tasks.child_reaper import start_reaper
kind = sys.argv[1]
start_reaper()
extra = []
if kind == "payment":
    from tasks.real_channels import payment_api_process
    server = payment_api_process()  # held: a collected generator would stop the server
    server.__enter__()
elif kind == "postgres":
    from agentflow_core.envs.order_db import postgres
    postgres.acquire_embedded()
    pid_file = postgres._folder / "pgdata" / "postmaster.pid"
    extra.append(pid_file.read_text().splitlines()[0])
elif kind == "chromium":
    from agentflow_core.envs.web_browser import acquire_browser
    acquire_browser()
elif kind == "ray":
    from tasks.ray_runtime import start_ray
    from tasks.config_io import load_config
    start_ray(load_config(sys.argv[2]))
print("ready", *extra, flush=True)
time.sleep(600)
"""


def _services(command: psutil.Process, extra: list[int]) -> dict[int, float]:
    found = {p.pid: p.create_time() for p in command.children(recursive=True)}
    for pid in extra:
        process = psutil.Process(pid)
        found[pid] = process.create_time()
        found.update({p.pid: p.create_time() for p in process.children(recursive=True)})
    return found


def _alive(processes: dict[int, float]) -> list[str]:
    alive = []
    for pid, created in processes.items():
        try:
            process = psutil.Process(pid)
            if process.create_time() == created and process.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{pid} {process.name()}")
        except psutil.Error:
            continue
    return alive


@pytest.mark.parametrize(
    "kind",
    [
        "payment",
        "postgres",
        "chromium",
        "ray",
    ],
)
def test_killing_the_command_stops_its_child_services(kind: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    command = subprocess.Popen(
        [sys.executable, "-c", COMMAND, kind, str(REPO / "params-checkout.yaml")],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    try:
        assert command.stdout is not None
        line = command.stdout.readline().split()  # blocks until the service is up (or the command died)
        assert line[:1] == ["ready"], f"the command did not start {kind} (rc {command.poll()})"
        services = _services(psutil.Process(command.pid), [int(pid) for pid in line[1:]])
        names = {psutil.Process(pid).name() for pid in services}
        assert names - {"python", "python3", "python3.11"} or kind == "payment", f"{kind} started no service: {names}"
        assert len(services) >= 2, f"{kind}: only the watchdog runs"
        command.send_signal(signal.SIGKILL)
        command.wait(timeout=10)
        started = time.monotonic()
        while _alive(services) and time.monotonic() - started < DEADLINE_S:
            time.sleep(0.2)
        assert not _alive(services), f"alive {time.monotonic() - started:.1f} s after the kill: {_alive(services)}"
    finally:
        if command.poll() is None:
            command.kill()
            command.wait()


def test_a_detached_service_naming_a_told_folder_is_stopped(tmp_path: Path) -> None:
    # started in its own session by the test, never a descendant of any recorded process
    service = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", "-D", str(tmp_path / "pgdata")],
        start_new_session=True,
    )
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", str(tmp_path) + "-other"])
    try:
        assert reap({}, [os.fsencode(str(tmp_path))]) == [service.pid]
        assert not psutil.pid_exists(service.pid)  # reap waited for it (and so collected its exit status)
        assert bystander.poll() is None
    finally:
        for process in (service, bystander):
            process.kill()
            process.wait()
