"""The django-oscar store as a service of the project, and the site-channel entries bound to a running site.

:func:`oscar_store` runs ``python -m agentflow_oscar.serve`` (it builds the store's template database on
first use, ~30 s, then reuses it), waits for the base URL it announces, and on exit closes its stdin (the
server's signal to stop) and, if it lingers, kills its whole process group. :func:`live_site` binds a
registry's site-channel entry (``kwargs.site_spec``: a site description, ``configs/oscar/site/site.json``)
to a running site: the one at ``kwargs.base_url`` when the entry names one (another Oscar, or a similar
shop), else the project's store, started for the duration. The site description is read here (the core
reads no files) and passed with the site's URL; ``kwargs.raw_states`` names the site's recorded, labelled
pages that ``agentflow envs check`` audits the mapping against.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentflow_core.envs.web_browser import DEFAULT_CHROMIUM
from agentflow_core.errors import AgentFlowError
from agentflow_core.registry import EnvEntry
from tasks.registry_io import load_registry

OSCAR_ENV_ID = "web_site_v1_oscar"
STOP_TIMEOUT_S = 10.0


# What a site entry's kwargs say to the project, not to the env: the store to start, the pairing.
PROJECT_KWARGS = ("raw_states", "store", "paired_family", "scenario_fields")
DEFAULT_PAIRED_FAMILY = "web_checkout"


@contextmanager
def oscar_store(workdir: Path | None = None, store: Mapping[str, Any] | None = None) -> Iterator[str]:
    """A running Oscar store; yields its base URL (``http://127.0.0.1:<port>``), stops it on exit.

    ``store`` (an entry's ``kwargs.store``) picks the process it serves: ``{process: checkout_v2, machine:
    <machine.yaml>}`` starts the checkout_v2 store, whose outside world follows that machine.
    """
    command = [sys.executable, "-m", "agentflow_oscar.serve"]
    if workdir is not None:
        command += ["--workdir", str(workdir)]
    if store:
        command += ["--process", str(store["process"])]
        if store.get("machine"):
            command += ["--machine", str(Path(str(store["machine"])).resolve())]
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
    """The registry's site-channel entry (``web_site_v1_oscar``) with its site description loaded and the URL set."""
    return site_entry(site_entry_of(config_dir), config_dir, base_url)


def site_entry_of(config_dir: Path) -> EnvEntry:
    """The site-channel entry of a registry (the one whose kwargs name a ``site_spec``; ``web_site_v1_oscar`` first)."""
    registry = load_registry(config_dir=config_dir)
    sites = [e for e in registry.entries() if "site_spec" in e.kwargs]
    if not sites:
        raise AgentFlowError(f"{config_dir}: no env config names a site description (kwargs.site_spec)")
    return next((e for e in sites if e.env_id == OSCAR_ENV_ID), sites[0])


def site_entry(entry: EnvEntry, config_dir: Path, base_url: str) -> EnvEntry:
    """``entry`` ready to make: the site description named by ``kwargs.site_spec`` read, ``base_url`` set."""
    kwargs = {k: v for k, v in entry.kwargs.items() if k not in PROJECT_KWARGS}
    kwargs["site"] = json.loads(_inside(config_dir, kwargs.pop("site_spec"), entry).read_text(encoding="utf-8"))
    kwargs["base_url"] = base_url
    return dataclasses.replace(entry, kwargs=kwargs)


def site_raw_states(entry: EnvEntry, config_dir: Path) -> list[tuple[dict[str, Any], str]] | None:
    """The labelled raw states named by ``kwargs.raw_states`` (recorded pages of the site), or None."""
    if "raw_states" not in entry.kwargs:
        return None
    document = json.loads(_inside(config_dir, entry.kwargs["raw_states"], entry).read_text(encoding="utf-8"))
    return [(raw, str(token)) for raw, token in document["raw_states"]]


def site_pairing(entry: EnvEntry, dimensions: list[str]) -> tuple[str, list[str]]:
    """The simulator family a site entry is paired with, and the scenario fields its store accepts.

    ``kwargs.paired_family`` (default ``web_checkout``) and ``kwargs.scenario_fields`` (default: the
    stress phase's Oscar ``dimensions``; the entry's other params keep their defaults).
    """
    family = str(entry.kwargs.get("paired_family", DEFAULT_PAIRED_FAMILY))
    fields = entry.kwargs.get("scenario_fields")
    return family, [str(f) for f in fields] if fields is not None else list(dimensions)


def site_needs(entry: EnvEntry) -> str | None:
    """What a site-channel entry needs that this machine lacks, in one line (None: nothing)."""
    chromium = str(entry.kwargs.get("chromium_path", DEFAULT_CHROMIUM))
    if not Path(chromium).is_file():
        return f"{entry.env_id} needs Chromium at {chromium} (apt-get install -y chromium, or set kwargs.chromium_path)"
    if not entry.kwargs.get("base_url") and importlib.util.find_spec("oscar") is None:
        return f"{entry.env_id} needs django-oscar to start the store (pip install -c constraints.txt django-oscar)"
    return None


@contextmanager
def live_site(entry: EnvEntry, config_dir: Path) -> Iterator[EnvEntry]:
    """A site-channel entry bound to a running site for the duration; other entries pass through unchanged.

    With ``kwargs.base_url`` the site runs elsewhere (another Oscar, or a similar shop serving the control
    endpoints) and is used as it is; without it the project's Oscar store is started and stopped here.
    """
    if "site_spec" not in entry.kwargs:
        yield entry
    elif entry.kwargs.get("base_url"):
        yield site_entry(entry, config_dir, str(entry.kwargs["base_url"]))
    else:
        with oscar_store(store=entry.kwargs.get("store")) as url:
            yield site_entry(entry, config_dir, url)


def _inside(config_dir: Path, name: Any, entry: EnvEntry) -> Path:
    path = (config_dir / str(name)).resolve()
    if not path.is_relative_to(config_dir.resolve()):
        raise AgentFlowError(f"{entry.source_file}: {name} must stay inside {config_dir}")
    return path
