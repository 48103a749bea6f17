"""The real channels of the sim-to-real run, opened and closed at the edge.

A process names its real channels in its file (``real_channels``, :class:`~agentflow_core.process.RealChannelSpec`):
per family, the env its variants also run on (the channel's own unless ``env`` names another) with
``kwargs`` replaced -- ``url: pgserver`` puts a SQL channel on a real PostgreSQL server, held for the
whole run -- and, with ``service``, an installed service started in a process of its own (:mod:`tasks.service_process`)
whose URL the env gets as ``base_url``. Checkout's three are built here:

* ``web_checkout`` -> ``web_browser_v1`` of the real-env registry (``stress.sim_to_real.env_config_dir``):
  headless Chromium on the storefront web app;
* ``order_db``     -> the same entry with ``url: pgserver`` (a real PostgreSQL server, embedded);
* ``payment_api``  -> the same entry with ``server_url`` of a payment API server started as a separate
  process (:mod:`tasks.payment_api_process`).

:func:`open_real_channels` holds each service for the whole run (one browser, one PostgreSQL server,
one server process) and shuts all of them down on exit, also on an error.
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from agentflow_core.config import AgentFlowConfig
from agentflow_core.envs.order_db.postgres import EMBEDDED_POSTGRES
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.sim_to_real import (
    PairedEpisode,
    SimToRealReport,
    paired_episodes,
    per_dimension,
    select_pairs,
    stratify,
    summarize,
)
from agentflow_core.process import ProcessSpec, RealChannelSpec
from agentflow_core.registry import EnvEntry, EnvRegistry
from agentflow_core.variants import VariantSpec
from tasks.child_reaper import start_reaper
from tasks.context import PhaseContext
from tasks.registry_io import load_registry
from tasks.rollout import LoadedPolicy

BROWSER_ENV_ID = "web_browser_v1"
REAL_CHANNELS = {
    "web_checkout": "headless Chromium (Playwright) on the storefront web app",
    "order_db": "PostgreSQL (pgserver)",
    "payment_api": "HTTP server in a separate process",
}
logger = logging.getLogger("agentflow.real_channels")


@contextmanager
def payment_api_process(on_start: Callable[[subprocess.Popen[str]], None] | None = None) -> Iterator[str]:
    """A payment API server in its own process; yields its base URL, stops it on exit.

    ``on_start`` receives the process (the real channels watch it to notice its death).
    """
    with server_process(["tasks.payment_api_process"], "payment API", on_start) as url:
        yield url


@contextmanager
def server_process(
    module: list[str], what: str, on_start: Callable[[subprocess.Popen[str]], None] | None = None
) -> Iterator[str]:
    """``python -m <module...>``, a server announcing its URL on stdout's first line; stopped on exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", *module], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http://"):
            raise AgentFlowError(f"{what} process exited before announcing its URL (rc {process.poll()})")
        if on_start is not None:
            on_start(process)
        yield url
    finally:
        if process.stdin is not None:
            process.stdin.close()  # the server's signal to stop
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@dataclass(frozen=True)
class RealChannels:
    """Env makers for both sides of each variant, and the health of each real channel's process.

    ``probes`` tells whether a family's process still serves; ``starters`` start it again (once per
    family: a channel that dies twice, or cannot come back, ends the run with one error).
    """

    sim: EnvRegistry
    real: dict[str, EnvEntry]
    probes: dict[str, Callable[[], bool]] = field(default_factory=dict)
    starters: dict[str, Callable[[], None]] = field(default_factory=dict)
    restarted: set[str] = field(default_factory=set)
    pids: dict[str, int] = field(default_factory=dict)  # the serving process of a family, where one is known

    def alive(self, family: str) -> bool:
        """Is the family's real channel process still serving (True when it has no probe)?"""
        probe = self.probes.get(family)
        return probe is None or probe()

    def restart(self, family: str) -> None:
        """Start the family's channel again, once; a second death or a failed start is an AgentFlowError."""
        if family in self.restarted or family not in self.starters:
            raise AgentFlowError(
                f"real channel {family} ({REAL_CHANNELS.get(family, family)}) died again after a restart"
            )
        self.restarted.add(family)
        logger.warning("real channel %s died; restarting it once", family)
        try:
            self.starters[family]()
        except Exception as exc:
            raise AgentFlowError(f"real channel {family} could not be restarted: {type(exc).__name__}: {exc}") from None

    def make_sim(self, variant: VariantSpec) -> SemanticEnv:
        """The variant on its simulated channel (the training registry)."""
        return self.sim.get(variant.base_env_id).make(variant.params, variant.env_id)

    def make_real(self, variant: VariantSpec) -> SemanticEnv:
        """The variant on its family's real channel."""
        return self.real[variant.family].make(variant.params, variant.env_id)


def _postmaster_pid() -> int | None:
    from agentflow_core.envs.order_db.postgres import _folder_path

    folder = _folder_path()
    try:
        return int((folder / "pgdata" / "postmaster.pid").read_text().splitlines()[0]) if folder else None
    except (OSError, ValueError, IndexError):
        return None


def _postmaster_alive() -> bool:
    pid = _postmaster_pid()
    try:
        return pid is not None and psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.Error:
        return False


def _open_browser(cfg: AgentFlowConfig, stack: ExitStack, channels: RealChannels) -> None:
    from agentflow_core.envs.web_browser import BrowserHost, acquire_browser, release_browser

    entry = load_registry(config_dir=Path(cfg.stress.sim_to_real.env_config_dir)).get(BROWSER_ENV_ID)
    path = str(entry.kwargs.get("chromium_path", "/usr/bin/chromium"))
    hosts: list[BrowserHost] = []

    def start() -> None:
        if hosts:
            with suppress(Exception):  # the dead browser's host: its driver may be gone too
                release_browser(hosts.pop())
        hosts.append(acquire_browser(path))

    start()
    stack.callback(lambda: hosts and release_browser(hosts.pop()))
    channels.real["web_checkout"] = entry
    channels.probes["web_checkout"] = lambda: bool(hosts) and hosts[-1].browser.is_connected()
    channels.starters["web_checkout"] = start


def _open_postgres(stack: ExitStack, channels: RealChannels, family: str, entry: EnvEntry) -> None:
    """Hold the embedded PostgreSQL server for the run; ``entry`` (its ``url: pgserver``) is the family's real env."""
    from agentflow_core.envs.order_db.postgres import acquire_embedded, release_embedded, restart_embedded

    def start() -> None:
        restart_embedded()
        channels.pids[family] = _postmaster_pid() or 0

    acquire_embedded()
    channels.pids[family] = _postmaster_pid() or 0
    stack.callback(release_embedded)
    channels.real[family] = entry
    channels.probes[family] = _postmaster_alive
    channels.starters[family] = start


def _open_service(stack: ExitStack, channels: RealChannels, family: str, service: str, entry: EnvEntry) -> None:
    """Start the installed ``service`` in its own process; the family's real env is ``entry`` with its ``base_url``."""
    processes: list[subprocess.Popen[str]] = []

    def start() -> None:
        url = stack.enter_context(server_process(["tasks.service_process", service], service, processes.append))
        channels.pids[family] = processes[-1].pid
        channels.real[family] = dataclasses.replace(entry, kwargs={**entry.kwargs, "base_url": url})

    start()
    channels.probes[family] = lambda: processes[-1].poll() is None
    channels.starters[family] = start


def _open_declared(stack: ExitStack, channels: RealChannels, spec: RealChannelSpec, base_env_id: str) -> None:
    """A process's declared real channel: the env, its kwargs replaced, and the service or server it needs."""
    base = channels.sim.get(spec.env or base_env_id)
    entry = dataclasses.replace(base, kwargs={**base.kwargs, **dict(spec.kwargs)})
    if spec.service is not None:
        _open_service(stack, channels, spec.family, spec.service, entry)
    elif entry.kwargs.get("url") == EMBEDDED_POSTGRES:
        _open_postgres(stack, channels, spec.family, entry)
    else:
        channels.real[spec.family] = entry


def _open_payment(stack: ExitStack, channels: RealChannels, base: EnvEntry) -> None:
    processes: list[subprocess.Popen[str]] = []

    def start() -> None:
        url = stack.enter_context(payment_api_process(processes.append))
        channels.pids["payment_api"] = processes[-1].pid
        channels.real["payment_api"] = dataclasses.replace(base, kwargs={**base.kwargs, "server_url": url})

    start()
    channels.probes["payment_api"] = lambda: processes[-1].poll() is None
    channels.starters["payment_api"] = start


def real_channel_names(process: ProcessSpec) -> dict[str, str]:
    """Family -> its real channel's description, for every channel of ``process`` that has one."""
    declared = {r.family: r.description for r in process.real_channels}
    return {
        c.family: declared.get(c.family) or REAL_CHANNELS[c.family]
        for c in process.channels
        if c.family in {**REAL_CHANNELS, **declared}
    }


def sim_to_real_families(cfg: AgentFlowConfig, process: ProcessSpec) -> list[str]:
    """The families the sim-to-real run pairs: ``stress.sim_to_real.families``, else every one with a real channel."""
    chosen = cfg.stress.sim_to_real.families
    return list(real_channel_names(process)) if chosen is None else list(chosen)


@contextmanager
def open_real_channels(ctx: PhaseContext, families: list[str], base_env_ids: dict[str, str]) -> Iterator[RealChannels]:
    """Start the real services the families need; yield the env makers; stop every service on exit."""
    cfg = ctx.cfg
    channels = RealChannels(ctx.registry, {})
    declared = {r.family: r for r in ctx.process.real_channels}
    start_reaper()  # Chromium, PostgreSQL and the server process end with this command, even a killed one
    with ExitStack() as stack:
        for family in families:
            if family in declared:
                _open_declared(stack, channels, declared[family], base_env_ids[family])
            elif family == "web_checkout":
                _open_browser(cfg, stack, channels)
            elif family == "order_db":
                base = channels.sim.get(base_env_ids[family])
                _open_postgres(
                    stack, channels, family, dataclasses.replace(base, kwargs={**base.kwargs, "url": EMBEDDED_POSTGRES})
                )
            elif family == "payment_api":
                _open_payment(stack, channels, channels.sim.get(base_env_ids[family]))
        yield channels


def run_sim_to_real(ctx: PhaseContext, policy: LoadedPolicy, sample: list[VariantSpec]) -> SimToRealReport:
    """The configured families' paired episodes (same variants, same seeds) and their gaps."""
    cfg = ctx.cfg
    settings = cfg.stress.sim_to_real
    present = {v.family: v.base_env_id for v in sample}
    families: list[str] = [f for f in sim_to_real_families(cfg, ctx.process) if f in present]
    variants, seeds = select_pairs(sample, families, settings.episodes_per_family, cfg.base.seed)
    with open_real_channels(ctx, families, present) as channels:
        episodes = paired_episodes(
            variants, seeds, channels.make_sim, channels.make_real, policy.act, time.perf_counter, channels
        )
    names = real_channel_names(ctx.process)
    return summarize(episodes, {f: names[f] for f in families})


def sim_to_real_by_dimension(
    report: SimToRealReport, sample: list[VariantSpec], dimensions: list[str]
) -> dict[str, Any]:
    """The paired episodes per dimension value (success on both sides, the gap) and their flat metrics."""
    rows = per_dimension(report.episodes, {v.env_id: v.params for v in sample}, dimensions)
    metrics = {f"real_process_success_{f.family}": f.real_success for f in report.families}
    for row in rows:
        metrics[f"sim_to_real_gap/{row['dimension']}/{row['value']}"] = row["gap"]
        metrics[f"sim_to_real_real_process_success/{row['dimension']}/{row['value']}"] = row["real_process_success"]
    return {"per_dimension": rows, "metrics": metrics}


def _business_values(episodes: list[PairedEpisode]) -> dict[str, float]:
    """Mean business value on both sides, when both channels price every episode (checkout_v2 does)."""
    sim = [e.sim.business_value for e in episodes]
    real = [e.real.business_value for e in episodes]
    if not episodes or any(v is None for v in sim + real):
        return {}
    return {
        "sim_business_value": round(float(np.mean([float(v or 0.0) for v in sim])), 4),
        "real_business_value": round(float(np.mean([float(v or 0.0) for v in real])), 4),
    }


def run_sim_to_real_oscar(ctx: PhaseContext, policy: LoadedPolicy, sample: list[VariantSpec]) -> dict[str, Any]:
    """The policy on the django-oscar store (zero-shot) next to the simulator, over a stratified sample of the
    test variants of the family the store's entry is paired with (``kwargs.paired_family``); per dimension
    value: success on both sides, the gap, business value on both sides where the channels report it."""
    from agentflow_core.envs.web_browser import acquire_browser, release_browser
    from tasks.oscar_site import live_site, site_entry_of, site_pairing

    cfg = ctx.cfg
    settings = cfg.stress.sim_to_real
    dimensions = list(settings.oscar_dimensions)
    config_dir = Path(settings.oscar_env_config_dir)
    site = site_entry_of(config_dir)
    if site.process != ctx.process.name:
        raise AgentFlowError(
            f"{settings.oscar_env_config_dir}: its store serves process {site.process!r}, the run is "
            f"{ctx.process.name!r} (point stress.sim_to_real.oscar_env_config_dir at the process's store)"
        )
    paired, accepted = site_pairing(site, dimensions)
    chosen = stratify([v for v in sample if v.family == paired], dimensions, settings.oscar_episodes)
    if not chosen:
        return {"episodes": 0, "metrics": {}}
    seeds = [int(s) for s in np.random.default_rng(cfg.base.seed + 39).integers(0, 2**31 - 1, size=len(chosen))]
    sim = ctx.registry
    with live_site(site, config_dir) as entry:
        host = acquire_browser(str(entry.kwargs.get("chromium_path", "/usr/bin/chromium")))
        try:
            episodes = paired_episodes(
                chosen,
                seeds,
                lambda v: sim.get(v.base_env_id).make(v.params, v.env_id),
                lambda v: entry.make({k: v.params[k] for k in accepted if k in v.params}, v.env_id),
                policy.act,
                clock=time.perf_counter,
            )
        finally:
            release_browser(host)
    report = summarize(episodes, {paired: "django-oscar 4.2.1 store in headless Chromium"})
    family = report.families[0]
    return {
        "episodes": family.episodes,
        "paired_family": paired,
        "sim_process_success": family.sim_success,
        "real_process_success": family.real_success,
        "gap": family.gap,
        "identical_fraction": family.identical_fraction,
        **_business_values(episodes),
        "real_step_ms_p50": family.real_step_ms_p50,
        "real_step_ms_p95": family.real_step_ms_p95,
        "per_dimension": per_dimension(episodes, {v.env_id: v.params for v in chosen}, dimensions),
        "metrics": {"sim_to_real_gap_oscar": family.gap, "real_process_success_oscar": family.real_success},
    }
