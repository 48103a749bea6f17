"""Soak benchmark: the product pool with live envs for a fixed time, clean vs with faulty variants.

The catalogue is the configured one (``agentflow variants``' generator), sampled to ``n_variants``;
1% of those variants per fault kind get a fault on the ``at_step``-th step of every episode:

- ``raise``: the step raises (``env_crash``);
- ``sleep``: the step sleeps far past the step timeout (``env_timeout``);
- ``spin``: the step busy-loops in Python far past the step timeout (``env_timeout``: with a step
  patience it is ended once it has used the patience's worth of CPU, else at the step timeout; its
  thread is interrupted either way);
- ``nan``: the step returns a NaN observation and reward (``env_invalid``).

Faults are injected by wrapping the registry factory (:class:`FaultInjectingFactory`): the envs
under test are the product's, the pool is the product's :class:`InProcessPool` with the configured
pool settings (``--backend ray``: the product's :class:`RayPool`, a private local Ray started in
the side's process, not timed), driven with random legal actions. Each side runs in a fresh spawned
process, and the sides alternate clean, faulty, clean, faulty, clean (``SIDES``), so a drift of the
machine's speed weighs on both kinds alike; the ratio is the faulty sides' mean env-steps/s over
the clean sides' mean.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentflow_core.config import AgentFlowConfig, PoolConfig
from agentflow_core.contracts import POOL_FAILURES
from agentflow_core.pool.base import EnvFactory, PoolEnv, PreparingEnvFactory, VariantLike, factory_vocabulary
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import Vocabulary

FAULT_KINDS = ("raise", "sleep", "spin", "nan")
# healthy episodes the faulty side loses beyond the worse clean side (a loaded machine times out a few
# healthy steps on either side; the faults must add none)
TARGETS = {"throughput_ratio": 0.9, "extra_healthy_episodes_lost": 0}
# clean and faulty sides alternate: the machine's speed drifts over minutes (other tenants)
SIDES = ("clean_1", "faulty_1", "clean_2", "faulty_2", "clean_3")


class FaultyEnv:
    """A product env whose ``at_step``-th step of every episode fails in the declared way."""

    def __init__(self, inner: PoolEnv, kind: str, at_step: int, hang_s: float) -> None:
        self.inner, self.kind, self.at_step, self.hang_s = inner, kind, at_step, hang_s
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """The inner env's reset."""
        self.t = 0
        return self.inner.reset(seed=seed, options=options)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """The inner env's step, except the ``at_step``-th, which fails."""
        self.t += 1
        if self.t == self.at_step:
            if self.kind == "raise":
                raise RuntimeError("injected fault")
            if self.kind == "sleep":
                time.sleep(self.hang_s)
            elif self.kind == "spin":
                until = time.monotonic() + self.hang_s
                while time.monotonic() < until:
                    pass
        obs, reward, terminated, truncated, info = self.inner.step(action)
        if self.kind == "nan" and self.t == self.at_step:
            return np.full_like(obs, np.nan), float("nan"), terminated, truncated, info
        return obs, reward, terminated, truncated, info

    def action_masks(self) -> np.ndarray:
        """The inner env's legal actions."""
        return self.inner.action_masks()

    def close(self) -> None:
        """Close the inner env."""
        self.inner.close()


@dataclass(frozen=True)
class FaultInjectingFactory:
    """Picklable factory: the product factory's envs, wrapped in :class:`FaultyEnv` for faulty variants."""

    inner: EnvFactory
    faults: dict[str, str] = field(default_factory=dict, hash=False)  # env_id -> fault kind
    at_step: int = 2
    hang_s: float = 600.0

    @property
    def vocabulary(self) -> Vocabulary:
        """The product factory's vocabulary (the faults change no width or name)."""
        return factory_vocabulary(self.inner)

    def __call__(self, variant: VariantLike) -> PoolEnv:
        """The variant's product env, faulty if the variant is."""
        env = self.inner(variant)
        kind = self.faults.get(variant.env_id)
        return env if kind is None else FaultyEnv(env, kind, self.at_step, self.hang_s)

    def prepare(self) -> None:
        """The product factory's one-off costs, paid before the first timed reset (as without faults)."""
        if isinstance(self.inner, PreparingEnvFactory):
            self.inner.prepare()

    def reuse(self, env: PoolEnv, variant: VariantLike) -> PoolEnv | None:
        """Re-target through the product factory; never into or out of a faulty variant."""
        reuse = getattr(self.inner, "reuse", None)
        if reuse is None or isinstance(env, FaultyEnv) or variant.env_id in self.faults:
            return None
        out: PoolEnv | None = reuse(env, variant)
        return out


def pick_faulty(variants: list[VariantLike], share: float, rng: np.random.Generator) -> dict[str, str]:
    """``share`` of the variants per fault kind (at least one each), disjoint: env_id -> kind."""
    per_kind = max(1, round(share * len(variants)))
    picks = rng.choice(len(variants), size=per_kind * len(FAULT_KINDS), replace=False).tolist()
    return {variants[i].env_id: FAULT_KINDS[j // per_kind] for j, i in enumerate(picks)}


def _build_pool(
    variants: list[VariantLike], factory: EnvFactory, num_envs: int, app: AgentFlowConfig, seed: int
) -> InProcessPool | Any:
    """The configured backend's pool; for Ray a private local Ray first (in this side's process)."""
    if app.pool.backend != "ray":
        return InProcessPool(variants, factory, num_envs, app.pool, seed=seed)
    from agentflow_core.pool.ray_pool import RayPool
    from tasks.ray_runtime import start_ray

    start_ray(app)
    pool = RayPool(variants, factory, num_envs, app.pool, seed=seed)
    pool.wait_standby()  # the standby's one-off warm-up is not steady-state throughput
    return pool


def _soak_side(
    variants: list[VariantLike], factory: EnvFactory, num_envs: int, app: AgentFlowConfig, seconds: float, seed: int
) -> dict[str, Any]:
    """Runs in a fresh process: build, reset, then step with random legal actions for ``seconds``."""
    import logging
    import threading

    import psutil

    logging.getLogger("agentflow.pool").setLevel(logging.ERROR)  # the faulty side fails on purpose
    faults: dict[str, str] = getattr(factory, "faults", {})
    pool = _build_pool(variants, factory, num_envs, app, seed)
    rng = np.random.default_rng(seed)
    mask = pool.reset(seed=seed).action_mask
    steps, episodes, lost_healthy, lost_faulty, slowest, pending_rows = 0, 0, 0, 0, 0.0, 0
    by_reason: dict[str, int] = {}
    healthy_lost_by: dict[str, int] = {}  # <base env>/<reason> of each healthy episode lost
    base_of = {v.env_id: v.base_env_id for v in variants}
    started = time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        t0 = time.perf_counter()
        batch = pool.step(np.argmax(rng.random(mask.shape) * mask, axis=1))
        slowest = max(slowest, time.perf_counter() - t0)
        mask = batch.action_mask
        held = 0 if batch.pending is None else int(batch.pending.sum())
        steps += num_envs - held  # a pending slot took no step
        pending_rows += held
        for info in batch.infos:
            if "episode_length" not in info:
                continue
            episodes += 1
            reason = info["failure_reason"]
            if reason in POOL_FAILURES:
                by_reason[reason] = by_reason.get(reason, 0) + 1
                if info["env_id"] in faults:
                    lost_faulty += 1
                else:
                    lost_healthy += 1
                    key = f"{base_of.get(info['env_id'], '?')}/{reason}"
                    healthy_lost_by[key] = healthy_lost_by.get(key, 0) + 1
    stats = pool.stats()
    me = psutil.Process()
    out = {
        # why healthy variants were quarantined, when they were: the workers' last failures
        "recent_failures": [f for w in stats.get("workers", []) for f in w.get("recent_failures", [])],
        "seconds": elapsed,
        "env_steps": steps,
        "env_steps_per_s": steps / elapsed,
        "episodes": episodes,
        "faulty_episodes_lost": lost_faulty,
        "healthy_episodes_lost": lost_healthy,
        "healthy_lost_by": dict(sorted(healthy_lost_by.items())),
        "failures": by_reason,
        "slowest_pool_step_s": slowest,
        "pending_slot_steps": pending_rows,
        "worker_restarts": stats["worker_restarts"],
        "quarantined": len(stats["quarantined"]),
        "quarantined_by": _quarantined_by(variants, stats["quarantined"], faults),
        "threads_at_end": threading.active_count(),
        "cpu_s": sum(me.cpu_times()[:2]),
        "child_processes_at_end": len(me.children(recursive=True)),
    }
    pool.close()
    if app.pool.backend == "ray":
        from tasks.ray_runtime import stop_ray

        stop_ray()  # and its session folder
    return out


def _quarantined_by(variants: list[VariantLike], quarantined: dict[str, str], faults: dict[str, str]) -> dict[str, int]:
    """Quarantined variants counted by ``<base env>/<last failure reason>`` ("faulty/..." for injected faults)."""
    base = {v.env_id: v.base_env_id for v in variants}
    out: dict[str, int] = {}
    for env_id, reason in quarantined.items():
        key = f"{'faulty' if env_id in faults else base.get(env_id, '?')}/{reason}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))


def _side_main(conn: Any, *args: Any) -> None:
    conn.send(_soak_side(*args))
    conn.close()


def _in_fresh_process(*args: Any) -> dict[str, Any]:
    """``_soak_side(*args)`` in a fresh spawned (non-daemonic: its pool may start children) process."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    process = ctx.Process(target=_side_main, args=(child, *args))
    process.start()
    child.close()
    try:
        result: dict[str, Any] = parent.recv()
    except EOFError as exc:
        raise RuntimeError(f"the soak process died (exit code {process.exitcode})") from exc
    finally:
        process.join()
    return result


def run_soak_bench(
    variants: list[VariantLike],
    factory: EnvFactory,
    app: AgentFlowConfig,
    num_envs: int = 300,
    n_variants: int = 300,
    seconds: float = 45.0,
    share: float = 0.01,
    seed: int = 0,
) -> dict[str, Any]:
    """Alternating clean and faulty soak runs (``SIDES``) of the configured pool (``app.pool``); figures and verdicts."""
    config: PoolConfig = app.pool
    rng = np.random.default_rng(seed)
    picks = rng.choice(len(variants), size=min(n_variants, len(variants)), replace=False)
    sample = [variants[i] for i in sorted(picks.tolist())]
    faults = pick_faulty(sample, share, rng)
    faulty_factory = FaultInjectingFactory(factory, faults)
    load_before = os.getloadavg()
    runs: dict[str, dict[str, Any]] = {}
    for name in SIDES:
        side_factory = faulty_factory if name.startswith("faulty") else factory
        runs[name] = _in_fresh_process(sample, side_factory, num_envs, app, seconds, seed)
    clean = [r for name, r in runs.items() if name.startswith("clean")]
    faulty_runs = [r for name, r in runs.items() if name.startswith("faulty")]
    clean_rate = float(np.mean([r["env_steps_per_s"] for r in clean]))
    faulty_rate = float(np.mean([r["env_steps_per_s"] for r in faulty_runs]))
    ratio = faulty_rate / clean_rate
    # the worse faulty side against the worse clean side
    extra_lost = max(r["healthy_episodes_lost"] for r in faulty_runs) - max(r["healthy_episodes_lost"] for r in clean)
    result = {
        "backend": config.backend,
        "step_isolation": config.step_isolation,
        "step_timeout_s": config.step_timeout_s,
        "step_patience_s": config.step_patience_s,
        "step_patience_engages": config.step_patience_engages,
        "quarantine_after": config.quarantine_after,
        "num_workers": max(config.num_workers, 1),
        "num_envs": num_envs,
        "n_variants": len(sample),
        "faulty_variants": {k: sum(v == k for v in faults.values()) for k in FAULT_KINDS},
        "seconds": seconds,
        "clean_env_steps_per_s": clean_rate,
        "faulty_env_steps_per_s": faulty_rate,
        "throughput_ratio": ratio,
        "healthy_episodes_lost": max(r["healthy_episodes_lost"] for r in faulty_runs),
        "extra_healthy_episodes_lost": extra_lost,
        "runs": runs,
        "load_avg_1m": [load_before[0], os.getloadavg()[0]],
        "cpu_count": os.cpu_count(),
        "targets": TARGETS,
        "met": {
            "throughput_ratio": ratio >= TARGETS["throughput_ratio"],
            "extra_healthy_episodes_lost": extra_lost <= TARGETS["extra_healthy_episodes_lost"],
        },
    }
    return result | {"notes": soak_notes(result)}


def soak_notes(result: dict[str, Any]) -> list[str]:
    """What a reader needs to judge one soak run's ratio: the machine's load and how far the clean sides differ."""
    runs = result["runs"]
    clean = [r["env_steps_per_s"] for name, r in runs.items() if name.startswith("clean")]
    before, after = result["load_avg_1m"]
    order = "; ".join(f"{name} {r['env_steps_per_s']:,.0f} env-steps/s" for name, r in runs.items())
    return [
        f"sides in order: {order}; "
        f"the ratio is the faulty sides' mean over the clean sides' mean (the sides alternate, so a drift of the "
        f"machine's speed weighs on both alike); clean sides {max(clean) / max(min(clean), 1e-9):.2f}x apart",
        f"load average (1 min) {before:.1f} before the sides, {after:.1f} after, on {result['cpu_count']} CPUs",
        "variants quarantined per side: "
        + ", ".join(f"{name} {r['quarantined']}" for name, r in runs.items())
        + f" (faulty variants: {sum(result['faulty_variants'].values())}; a variant is also quarantined for "
        "resets that fail, e.g. waiting past the step timeout on a loaded machine)"
        + "".join(
            f"; {side} by base env/reason: {r['quarantined_by']}"
            for side, r in runs.items()
            if side.startswith("clean") and r.get("quarantined_by")
        ),
    ]
