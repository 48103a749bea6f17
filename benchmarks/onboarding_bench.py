"""``agentflow bench onboarding``: from an OpenAPI spec to a trainable env for the refund service, and the refund expert.

Spec to trainable env, timed per repeat against a running refund service (started first, not
timed): parse the spec, generate the env config + ``api`` mapping for the refund process, write
both, load them through the registry, build the env, pass gymnasium's ``check_env``, and play one
scripted-expert episode to the goal. Then the refund process's expert plays the same scenario grid
on every channel -- the SQL case store, the shipped HTTP env, the onboarded HTTP env -- for process
success and env steps per second.
"""

from __future__ import annotations

import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from gymnasium.utils.env_checker import check_env

from agentflow_core.adapters.openapi import generate_from_openapi
from agentflow_core.process import ProcessSpec
from agentflow_core.registry import EnvEntry
from agentflow_refund.service import RefundService
from tasks.process_io import SHIPPED_PROCESS_DIR, read_process
from tasks.registry_io import load_registry
from tasks.yaml_io import load_yaml_file

REPO = Path(__file__).resolve().parents[1]
SPEC = REPO / "agentflow_refund" / "openapi.yaml"
REFUND_ENVS = REPO / "configs" / "refund" / "envs"
CLASS_PATH = "agentflow_core.envs.http_channel:HttpChannelEnv"  # the generic HTTP channel, driven by the spec's data
GRID = tuple(
    itertools.product(
        ("normal", "latency_500ms", "packet_loss_5%"),
        ("ok", "flagged"),
        ("signed_out", "order_found", "request_draft", "under_review"),
        (90.0, 130.0),
    )
)


def _episode(entry: EnvEntry, process: ProcessSpec, params: dict[str, Any], seed: int) -> tuple[bool, int]:
    env = entry.make(params, entry.env_id)
    try:
        obs, info = env.reset(seed=seed)
        steps, terminated, truncated = 0, False, False
        while not (terminated or truncated):
            obs, _, terminated, truncated, info = env.step(process.expert(entry.family).act(obs, info["action_mask"]))
            steps += 1
        return process.vocabulary.process_success(params, info["tokens"], terminated), steps
    finally:
        env.close()


def spec_to_env(service_url: str, out_dir: Path, process: ProcessSpec) -> tuple[float, bool]:
    """Seconds from the spec file to an env that passed check_env and one expert episode (and its outcome)."""
    t0 = time.perf_counter()
    spec = load_yaml_file(SPEC)
    config, mapping = generate_from_openapi(
        spec, "refund_api", process="refund", vocabulary=process.vocabulary, class_path=CLASS_PATH, base_url=service_url
    )
    (out_dir / config["mapping"]).write_text(json.dumps(mapping))
    (out_dir / f"{config['env_id']}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    entry = load_registry(config_dir=out_dir).get(config["env_id"])
    check_env(entry.make({}, entry.env_id), skip_render_check=True)
    ok, _ = _episode(entry, process, {}, seed=0)
    return time.perf_counter() - t0, ok


def run_onboarding_bench(repeats: int = 5, seeds: int = 2) -> dict[str, Any]:
    """Spec-to-env seconds (p50, max) and the expert's process success / steps per second on every refund channel."""
    process = read_process(SHIPPED_PROCESS_DIR / "refund.yaml")
    service = RefundService().start()
    try:
        times, onboarded_ok = [], True
        for _ in range(repeats):
            with tempfile.TemporaryDirectory() as tmp:
                seconds, ok = spec_to_env(service.url, Path(tmp), process)
                times.append(seconds)
                onboarded_ok &= ok
        with tempfile.TemporaryDirectory() as tmp:
            spec_to_env(service.url, Path(tmp), process)
            channels = {
                "refund_db": load_registry(config_dir=REFUND_ENVS).get("refund_db_v1"),
                "refund_api": load_registry(config_dir=REFUND_ENVS).get("refund_api_v1"),
                "onboarded_api": load_registry(config_dir=Path(tmp)).get("refund_api_v1"),
            }
            result: dict[str, Any] = {
                "repeats": repeats,
                "spec_to_trainable_env_p50_s": float(np.median(times)),
                "spec_to_trainable_env_max_s": float(max(times)),
                "onboarded_env_first_episode_succeeds": onboarded_ok,
                "episodes_per_channel": len(GRID) * seeds,
            }
            for name, entry in channels.items():
                t0, outcomes, steps = time.perf_counter(), [], 0
                for (network, account, stage, value), seed in itertools.product(GRID, range(seeds)):
                    params = {"network": network, "account": account, "entry_stage": stage, "order_value": value}
                    ok, length = _episode(entry, process, params, seed)
                    outcomes.append(ok)
                    steps += length
                result[f"{name}_expert_process_success"] = float(np.mean(outcomes))
                result[f"{name}_env_steps_per_s"] = steps / (time.perf_counter() - t0)
    finally:
        service.stop()
    result["load_avg_1m"] = os.getloadavg()[0]
    result["notes"] = [
        "Spec to trainable env: parse agentflow_refund/openapi.yaml, generate the env config + api mapping for the "
        "refund process, write and register them, build the env, pass check_env and one expert episode to the goal "
        "against the running refund service (its start-up not included).",
        "Expert process success: the refund process's scripted expert (configs/processes/refund.yaml) over "
        f"{len(GRID)} scenarios x {seeds} seeds per channel; env steps/s include env construction and reset.",
        "Measured on a shared, loaded 2-core machine (other jobs running): re-measure on a quiet one.",
    ]
    return result
