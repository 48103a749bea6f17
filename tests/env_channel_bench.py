"""Steps per second of each family's envs in a single-worker in-process pool (16 envs), by wall clock
and by CPU time of the whole process (the loopback HTTP server thread included).

Usage: ``python tests/env_channel_bench.py PARAMS [BATCHES]`` where PARAMS is a params.yaml with
``pool.backend: inprocess`` whose ``<data_dir>/variants`` exists (``agentflow variants -p PARAMS``).
CPU time is the figure to compare on a shared machine: wall time there also counts other jobs.
Not a test (no ``test_`` prefix); BENCHMARKS.md quotes its output.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from agentflow_core.envs.experts import expert_for
from tasks.compose import build_pool
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.rollout import load_variants


def main(params: str, batches: int) -> None:
    cfg = load_config(params)
    cfg = cfg.model_copy(update={"pool": cfg.pool.model_copy(update={"num_workers": 1})})
    variants = load_variants(PhaseContext.of(cfg))
    expert = expert_for("any")
    for family in sorted({v.base_env_id for v in variants}):
        own = [v for v in variants if v.base_env_id == family]
        for mode in ("expert", "random"):
            rng = np.random.default_rng(0)
            pool = build_pool(PhaseContext.of(cfg), own, 16, seed=0)
            batch = pool.reset(seed=0)
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(batches):
                if mode == "expert":
                    actions = expert.act_batch(batch.obs, batch.action_mask)
                else:
                    actions = np.array([rng.choice(np.flatnonzero(m)) for m in batch.action_mask])
                batch = pool.step(actions)
            steps = 16 * batches
            wall_rate, cpu_rate = steps / (time.perf_counter() - wall), steps / (time.process_time() - cpu)
            sys.stdout.write(f"{family:16s} {mode:7s} {wall_rate:6.0f} steps/wall-s {cpu_rate:6.0f} steps/cpu-s\n")
            pool.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100)
