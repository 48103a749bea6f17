"""Sim-to-real validation: the same policy, variants and seeds on a simulated channel and on its real one.

For every family, each selected variant runs one episode on the simulated env and one on the real
env (the browser, PostgreSQL, an HTTP server in another process) with the same seed. The measure is
the *gap* in process success (:meth:`~agentflow_core.semantics.Vocabulary.process_success` of the env's
process, the stress phase's definition): ``sim - real`` per family, so a positive gap is what the real channel loses. Paired
runs also say how many episodes took exactly the same path (actions and token sets) on both sides --
where the real channel is a faithful carrier of the simulated process, the gap is zero *because* the
paths are equal, and where it is not, the first differing step is what to look at.

Real channels are slow (a browser step is a click, a network round trip and a DOM read), so the
wall time of each real step is recorded (``clock`` is injected) and reported as p50/p95.

A real channel is a process that can die (Chromium, the PostgreSQL server, the payment server).
Given a :class:`ChannelHealth`, :func:`paired_episodes` checks the family's channel after each real
episode (and when the episode raised, for up to :data:`DEATH_GRACE_S`: a killed process takes a moment
to exit after its sockets close): a dead channel costs the episode it was running -- recorded as
a failed real episode with its ``failure_reason`` -- and is restarted; the run goes on. A channel
that cannot be restarted (:meth:`ChannelHealth.restart` raises) ends the run with that one error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agentflow_core.contracts import ChannelHealth
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.variants import VariantSpec

PolicyFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
EnvMaker = Callable[[VariantSpec], SemanticEnv]

DEATH_GRACE_S = 2.0  # how long a channel whose episode raised may take to show it died


@dataclass(frozen=True)
class EpisodeTrace:
    """One greedy episode: the actions taken, the token sets seen after each, and how it ended."""

    actions: tuple[int, ...]
    tokens: tuple[tuple[str, ...], ...]
    terminated: bool
    success: bool
    reached_goal: bool
    step_seconds: tuple[float, ...]
    failure_reason: str | None = None  # set when the channel failed under the episode (it then counts as failed)
    business_value: float | None = None  # the channel's ``info["business_value"]`` at the end, if it prices episodes


def run_episode(
    env: SemanticEnv, policy_fn: PolicyFn, seed: int, params: Mapping[str, Any], clock: Callable[[], float]
) -> EpisodeTrace:
    """Reset with ``seed`` and act greedily until the episode ends (the env truncates at its step limit)."""
    obs, info = env.reset(seed=seed)
    actions: list[int] = []
    tokens: list[tuple[str, ...]] = []
    seconds: list[float] = []
    terminated = truncated = False
    while not (terminated or truncated):
        action = int(np.asarray(policy_fn(obs[None, :], np.asarray(info["action_mask"])[None, :])).reshape(-1)[0])
        started = clock()
        obs, _reward, terminated, truncated, info = env.step(action)
        seconds.append(clock() - started)
        actions.append(action)
        tokens.append(tuple(info["tokens"]))
    vocabulary = env.vocabulary
    reached = any(vocabulary.goal in t for t in tokens)
    success = (reached and terminated) or vocabulary.process_success(params, tokens[-1], terminated)
    value = info.get("business_value")
    return EpisodeTrace(
        tuple(actions),
        tuple(tokens),
        terminated,
        success,
        reached,
        tuple(seconds),
        business_value=None if value is None else float(value),
    )


@dataclass(frozen=True)
class PairedEpisode:
    """One variant and seed, run on both channels."""

    family: str
    env_id: str
    seed: int
    sim: EpisodeTrace
    real: EpisodeTrace

    @property
    def identical(self) -> bool:
        """Both channels took the same actions and saw the same token sets at every step."""
        return self.sim.actions == self.real.actions and self.sim.tokens == self.real.tokens


def _real_episode(
    variant: VariantSpec,
    seed: int,
    make_real: EnvMaker,
    policy_fn: PolicyFn,
    clock: Callable[[], float],
    health: ChannelHealth,
) -> EpisodeTrace:
    """One real episode; a channel found dead after it (or under its exception) costs just this episode."""
    trace, error = None, None
    try:
        env = make_real(variant)
        try:
            trace = run_episode(env, policy_fn, seed, variant.params, clock)
        finally:
            with suppress(Exception):  # closing talks to the channel too, which may be gone
                env.close()
    except Exception as exc:
        error = exc
    if _still_alive(health, variant.family, grace=DEATH_GRACE_S if error is not None else 0.0):
        if error is not None:
            raise error  # the channel is fine: a real error, not a channel failure
        assert trace is not None
        return trace
    reason = "real channel process died" + (f" ({type(error).__name__}: {str(error)[:160]})" if error else "")
    health.restart(variant.family)
    return EpisodeTrace((), (), False, False, False, (), failure_reason=reason)


def _still_alive(health: ChannelHealth, family: str, grace: float) -> bool:
    """Is the family's channel alive, asked again for ``grace`` seconds while it still says so?"""
    deadline = time.monotonic() + grace
    while health.alive(family):
        if time.monotonic() >= deadline:
            return True
        time.sleep(0.05)
    return False


def paired_episodes(
    variants: Sequence[VariantSpec],
    seeds: Sequence[int],
    make_sim: EnvMaker,
    make_real: EnvMaker,
    policy_fn: PolicyFn,
    clock: Callable[[], float],
    health: ChannelHealth | None = None,
) -> list[PairedEpisode]:
    """Run each (variant, seed) on a fresh simulated env and a fresh real env; envs are closed after use.

    With ``health``, a real channel that dies costs the episode it was running (see the module notes).
    """
    out = []
    for variant, seed in zip(variants, seeds, strict=True):
        env = make_sim(variant)
        try:
            sim = run_episode(env, policy_fn, seed, variant.params, clock)
        finally:
            env.close()
        if health is None:
            env = make_real(variant)
            try:
                real = run_episode(env, policy_fn, seed, variant.params, clock)
            finally:
                env.close()
        else:
            real = _real_episode(variant, seed, make_real, policy_fn, clock, health)
        out.append(PairedEpisode(variant.family, variant.env_id, seed, sim, real))
    return out


def _percentile_ms(seconds: Sequence[float], q: float) -> float:
    return round(float(np.percentile(np.asarray(seconds), q)) * 1000.0, 3) if seconds else float("nan")


@dataclass(frozen=True)
class FamilyGap:
    """Process success of one family on both channels, and the gap between them."""

    family: str
    real_channel: str
    episodes: int
    sim_success: float
    real_success: float
    identical_fraction: float
    real_step_ms_p50: float
    real_step_ms_p95: float
    sim_step_ms_p50: float
    real_channel_failures: int = 0

    @property
    def gap(self) -> float:
        """``sim - real`` process success (positive: the real channel does worse)."""
        return round(self.sim_success - self.real_success, 6)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for summary.json and the report."""
        return {
            "family": self.family,
            "real_channel": self.real_channel,
            "episodes": self.episodes,
            "sim_process_success": self.sim_success,
            "real_process_success": self.real_success,
            "gap": self.gap,
            "identical_fraction": self.identical_fraction,
            "real_step_ms_p50": self.real_step_ms_p50,
            "real_step_ms_p95": self.real_step_ms_p95,
            "sim_step_ms_p50": self.sim_step_ms_p50,
            "real_channel_failures": self.real_channel_failures,
        }


@dataclass(frozen=True)
class SimToRealReport:
    """The gap per family; ``max_gap`` is what the stress gate checks."""

    families: tuple[FamilyGap, ...]
    episodes: list[PairedEpisode] = field(repr=False, default_factory=list)

    @property
    def max_gap(self) -> float:
        """The largest per-family gap (0.0 when no family ran)."""
        return max((f.gap for f in self.families), default=0.0)

    def metrics(self) -> dict[str, float]:
        """Flat metrics: ``sim_to_real_max_gap`` and ``sim_to_real_gap_<family>``."""
        out = {"sim_to_real_max_gap": self.max_gap}
        out.update({f"sim_to_real_gap_{f.family}": f.gap for f in self.families})
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain data for summary.json."""
        failed = [
            {"family": e.family, "env_id": e.env_id, "seed": e.seed, "failure_reason": e.real.failure_reason}
            for e in self.episodes
            if e.real.failure_reason is not None
        ]
        return {"max_gap": self.max_gap, "families": [f.to_dict() for f in self.families], "real_failures": failed}


def summarize(episodes: Sequence[PairedEpisode], real_channels: Mapping[str, str]) -> SimToRealReport:
    """Per family (in name order): success on both sides, the share of identical paths, step latencies."""
    families = []
    for family in sorted({e.family for e in episodes}):
        mine = [e for e in episodes if e.family == family]
        n = len(mine)
        real_steps = [s for e in mine for s in e.real.step_seconds]
        sim_steps = [s for e in mine for s in e.sim.step_seconds]
        families.append(
            FamilyGap(
                family=family,
                real_channel=real_channels.get(family, family),
                episodes=n,
                sim_success=round(sum(e.sim.success for e in mine) / n, 6),
                real_success=round(sum(e.real.success for e in mine) / n, 6),
                identical_fraction=round(sum(e.identical for e in mine) / n, 6),
                real_step_ms_p50=_percentile_ms(real_steps, 50),
                real_step_ms_p95=_percentile_ms(real_steps, 95),
                sim_step_ms_p50=_percentile_ms(sim_steps, 50),
                real_channel_failures=sum(e.real.failure_reason is not None for e in mine),
            )
        )
    return SimToRealReport(tuple(families), list(episodes))


def select_pairs(
    sample: Sequence[VariantSpec], families: Sequence[str], per_family: int, seed: int
) -> tuple[list[VariantSpec], list[int]]:
    """The first ``per_family`` variants of each family in the stress sample (cycled when it has fewer),
    and one seed per episode from ``seed`` (the same seeds on both channels)."""
    chosen: list[VariantSpec] = []
    for family in families:
        mine = [v for v in sample if v.family == family]
        chosen.extend(mine[i % len(mine)] for i in range(per_family) if mine)
    rng = np.random.default_rng(seed)
    return chosen, [int(s) for s in rng.integers(0, 2**31 - 1, size=len(chosen))]


def stratum(value: Any) -> str:
    """A dimension value as a stratum: text for a category; a number is split at zero ("0" / "> 0": for
    inventory, out of stock or not), since variants sample numeric dimensions continuously."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "0" if value == 0 else "> 0"
    return str(value)


def stratify(sample: Sequence[VariantSpec], dimensions: Sequence[str], episodes: int) -> list[VariantSpec]:
    """Up to ``episodes`` variants that cover each stratum of each dimension in turn (round-robin over
    (dimension, :func:`stratum`) pairs, first unused variant of each), so a small sample sees every value."""
    strata = [(d, v) for d in dimensions for v in sorted({stratum(x.params.get(d)) for x in sample if d in x.params})]
    chosen: list[VariantSpec] = []
    while len(chosen) < episodes and strata:
        progressed = False
        for dimension, value in strata:
            if len(chosen) >= episodes:
                break
            match = next(
                (v for v in sample if stratum(v.params.get(dimension)) == value and v not in chosen),
                None,
            )
            if match is not None:
                chosen.append(match)
                progressed = True
        if not progressed:
            break
    return chosen


def root_cause(trace: EpisodeTrace) -> str:
    """Why an episode failed, from what the channel showed last ("" when it succeeded)."""
    if trace.success:
        return ""
    last = set(trace.tokens[-1]) if trace.tokens else set()
    for token in ("NETWORK_TIMEOUT", "SERVER_ERROR", "OUT_OF_STOCK", "LOGGED_OUT", "PAYMENT_PAGE"):
        if token in last:
            return f"stuck at {token}" if trace.terminated is False else f"ended at {token}"
    return "max_steps" if not trace.terminated else f"ended with {sorted(last)}"


def per_dimension(
    episodes: Sequence[PairedEpisode], params: Mapping[str, Mapping[str, Any]], dimensions: Sequence[str]
) -> list[dict[str, Any]]:
    """Per (dimension, :func:`stratum`): episodes, success in the simulator and on the real system, the gap,
    root causes."""
    rows = []
    for dimension in dimensions:
        for value in sorted({stratum(params[e.env_id].get(dimension)) for e in episodes}):
            mine = [e for e in episodes if stratum(params[e.env_id].get(dimension)) == value]
            sim = sum(e.sim.success for e in mine) / len(mine)
            real = sum(e.real.success for e in mine) / len(mine)
            causes = sorted({root_cause(e.real) for e in mine} - {""})
            rows.append(
                {
                    "dimension": dimension,
                    "value": value,
                    "episodes": len(mine),
                    "sim_process_success": round(sim, 6),
                    "real_process_success": round(real, 6),
                    "gap": round(sim - real, 6),
                    "root_causes": causes,
                }
            )
    return rows
