"""The real channels of the sim-to-real run, opened and closed at the edge.

Per simulated family, the env the same variant gets on its real counterpart:

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
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentflow_core.config import AgentFlowConfig
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.sim_to_real import (
    SimToRealReport,
    paired_episodes,
    per_dimension,
    select_pairs,
    stratify,
    summarize,
)
from agentflow_core.registry import EnvEntry, EnvRegistry
from agentflow_core.variants import VariantSpec
from tasks.registry_io import load_registry
from tasks.rollout import LoadedPolicy

BROWSER_ENV_ID = "web_browser_v1"
REAL_CHANNELS = {
    "web_checkout": "headless Chromium (Playwright) on the storefront web app",
    "order_db": "PostgreSQL (pgserver)",
    "payment_api": "HTTP server in a separate process",
}
SERVER_START_TIMEOUT_S = 30.0


@contextmanager
def payment_api_process() -> Iterator[str]:
    """A payment API server in its own process; yields its base URL, stops it on exit."""
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.payment_api_process"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        url = process.stdout.readline().strip()
        if not url.startswith("http://"):
            raise AgentFlowError(f"payment API process exited before announcing its URL (rc {process.poll()})")
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
    """Env makers for both sides of each variant."""

    sim: EnvRegistry
    real: dict[str, EnvEntry]

    def make_sim(self, variant: VariantSpec) -> SemanticEnv:
        """The variant on its simulated channel (the training registry)."""
        return self.sim.get(variant.base_env_id).make(variant.params, variant.env_id)

    def make_real(self, variant: VariantSpec) -> SemanticEnv:
        """The variant on its family's real channel."""
        return self.real[variant.family].make(variant.params, variant.env_id)


@contextmanager
def open_real_channels(
    cfg: AgentFlowConfig, families: list[str], base_env_ids: dict[str, str]
) -> Iterator[RealChannels]:
    """Start the real services the families need; yield the env makers; stop every service on exit."""
    from agentflow_core.envs.order_db.postgres import EMBEDDED_POSTGRES, acquire_embedded, release_embedded

    sim = load_registry(cfg)
    real: dict[str, EnvEntry] = {}
    with ExitStack() as stack:
        for family in families:
            if family == "web_checkout":
                from agentflow_core.envs.web_browser import acquire_browser, release_browser

                registry = load_registry(config_dir=Path(cfg.stress.sim_to_real.env_config_dir))
                entry = registry.get(BROWSER_ENV_ID)
                host = acquire_browser(str(entry.kwargs.get("chromium_path", "/usr/bin/chromium")))
                stack.callback(release_browser, host)
                real[family] = entry
            elif family == "order_db":
                acquire_embedded()
                stack.callback(release_embedded)
                base = sim.get(base_env_ids[family])
                real[family] = dataclasses.replace(base, kwargs={**base.kwargs, "url": EMBEDDED_POSTGRES})
            elif family == "payment_api":
                url = stack.enter_context(payment_api_process())
                base = sim.get(base_env_ids[family])
                real[family] = dataclasses.replace(base, kwargs={**base.kwargs, "server_url": url})
        yield RealChannels(sim, real)


def run_sim_to_real(cfg: AgentFlowConfig, policy: LoadedPolicy, sample: list[VariantSpec]) -> SimToRealReport:
    """The configured families' paired episodes (same variants, same seeds) and their gaps."""
    settings = cfg.stress.sim_to_real
    present = {v.family: v.base_env_id for v in sample}
    families: list[str] = [f for f in settings.families if f in present]
    variants, seeds = select_pairs(sample, families, settings.episodes_per_family, cfg.base.seed)
    with open_real_channels(cfg, families, present) as channels:
        episodes = paired_episodes(
            variants, seeds, channels.make_sim, channels.make_real, policy.act, clock=time.perf_counter
        )
    return summarize(episodes, {f: REAL_CHANNELS[f] for f in families})


def run_sim_to_real_oscar(cfg: AgentFlowConfig, policy: LoadedPolicy, sample: list[VariantSpec]) -> dict[str, Any]:
    """The policy on the django-oscar store (zero-shot) next to the simulator, over a stratified sample of the
    web_checkout test variants; per dimension value: success on both sides, the gap, root causes on Oscar."""
    from agentflow_core.envs.web_browser import acquire_browser, release_browser
    from tasks.oscar_site import oscar_entry, oscar_store

    settings = cfg.stress.sim_to_real
    dimensions = list(settings.oscar_dimensions)
    chosen = stratify([v for v in sample if v.family == "web_checkout"], dimensions, settings.oscar_episodes)
    if not chosen:
        return {"episodes": 0, "metrics": {}}
    seeds = [int(s) for s in np.random.default_rng(cfg.base.seed + 39).integers(0, 2**31 - 1, size=len(chosen))]
    sim = load_registry(cfg)
    config_dir = Path(settings.oscar_env_config_dir)
    with oscar_store() as url:
        entry = oscar_entry(config_dir, url)
        host = acquire_browser(str(entry.kwargs.get("chromium_path", "/usr/bin/chromium")))
        try:
            episodes = paired_episodes(
                chosen,
                seeds,
                lambda v: sim.get(v.base_env_id).make(v.params, v.env_id),
                lambda v: entry.make({k: v.params[k] for k in dimensions if k in v.params}, v.env_id),
                policy.act,
                clock=time.perf_counter,
            )
        finally:
            release_browser(host)
    report = summarize(episodes, {"web_checkout": "django-oscar 4.2.1 store in headless Chromium"})
    family = report.families[0]
    return {
        "episodes": family.episodes,
        "sim_process_success": family.sim_success,
        "real_process_success": family.real_success,
        "gap": family.gap,
        "real_step_ms_p50": family.real_step_ms_p50,
        "real_step_ms_p95": family.real_step_ms_p95,
        "per_dimension": per_dimension(episodes, {v.env_id: v.params for v in chosen}, dimensions),
        "metrics": {"sim_to_real_gap_oscar": family.gap, "real_process_success_oscar": family.real_success},
    }
