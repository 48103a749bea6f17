"""The django-oscar store as a service of the project: started in its own process group, stopped on exit.

:func:`oscar_store` runs ``python -m agentflow_oscar.serve`` (it builds the store's template database on
first use, ~30 s, then reuses it), waits for the base URL it announces, and on exit closes its stdin (the
server's signal to stop) and, if it lingers, kills its whole process group. :func:`oscar_entry` turns the
real-env registry's ``web_site_v1_oscar`` entry into one bound to a running store: the site description named by
``kwargs.site_spec`` is read here (the core reads no files) and passed with the store's URL.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from agentflow_core.errors import AgentFlowError
from agentflow_core.registry import EnvEntry
from tasks.registry_io import load_registry

OSCAR_ENV_ID = "web_site_v1_oscar"
STOP_TIMEOUT_S = 10.0


@contextmanager
def oscar_store(workdir: Path | None = None) -> Iterator[str]:
    """A running Oscar store; yields its base URL (``http://127.0.0.1:<port>``), stops it on exit."""
    command = [sys.executable, "-m", "agentflow_oscar.serve"]
    if workdir is not None:
        command += ["--workdir", str(workdir)]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http://"):
            raise AgentFlowError(f"Oscar store exited before announcing its URL (rc {process.poll()})")
        yield url
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def oscar_entry(config_dir: Path, base_url: str) -> EnvEntry:
    """The registry's ``web_site_v1_oscar`` entry with its site description loaded and the store's URL set."""
    entry = load_registry(config_dir=config_dir).get(OSCAR_ENV_ID)
    kwargs = dict(entry.kwargs)
    site_path = (config_dir / str(kwargs.pop("site_spec"))).resolve()
    if not site_path.is_relative_to(config_dir.resolve()):
        raise AgentFlowError(f"{entry.source_file}: site_spec must stay inside {config_dir}")
    kwargs["site"] = json.loads(site_path.read_text(encoding="utf-8"))
    kwargs["base_url"] = base_url
    return dataclasses.replace(entry, kwargs=kwargs)
