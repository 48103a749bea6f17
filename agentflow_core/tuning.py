"""Impedance matching between the training loop's components (docs/design.md §7.1): measure, then choose.

The design notes give three rules: env-step rate : policy-inference rate about 1.2 : 1, data production
about 1.5x consumption, and an update interval that matches how sparse the reward is. Here they
become measured quantities of AgentFlow's synchronous, worker-side-rollout PPO loop:

- *env-step rate* and *inference rate* of one env worker stepping ``k`` envs (its rollout loop is
  one batched policy forward, then one pool step, :func:`agentflow_core.rl.rollout.collect_slice`):
  ``k / t_env(k)`` and ``k / t_inf(k)``. The forward's fixed cost is paid once per pool step, so the
  inference rate grows with ``k`` while the env rate stays about flat; their ratio falls with ``k``.
  The tuner takes the smallest ``k`` at which it reaches the design's 1.2 (envs no longer wait on a
  forward that is too small to amortise its overhead), guarded by measured worker throughput.
- *production* = rollout samples per second of rollout time (``batch / rollout_s``), *consumption*
  = samples per second of update time (``batch / update_s``). The loop alternates the two, so
  ``production / consumption = update_s / rollout_s``: above 1.5 the learner holds the envs back
  and the tuner cuts the update's work (epochs, within a floor); below it the learner keeps up and
  the shipped learning settings stay (adding update work only to reach the ratio would cost
  env-steps/s and change learning for no measured gain).
- *update interval vs reward sparsity*: ``n_steps`` (env steps per slot between updates) against
  the env steps between goal events; the tuner sizes ``n_steps`` to hold ``goals_per_update`` goal
  events per slot, at least one whole episode (PPO never bootstraps across a rollout boundary).

Workers: as many as the cluster has cores that can step envs at the same time; Ray's logical CPUs
on a host are capped at the cores that host really schedules (more workers than cores only
time-share them). Everything here is pure: measurements in, a :class:`TuneChoice` out.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from agentflow_core.config import AgentFlowConfig, TuneConfig
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.semantics import Vocabulary

CHOICE_VERSION = 1
# the share of the best candidate's measured worker throughput a ratio-chosen k must keep
THROUGHPUT_GUARD = 0.9


@dataclass(frozen=True)
class WorkerTiming:
    """One probe point: one env worker stepping ``envs`` envs for ``steps`` pool steps."""

    envs: int
    steps: int
    env_s: float  # seconds in pool steps (env stepping, autoreset, the driver's bookkeeping)
    inference_s: float  # seconds in batched policy forwards

    @property
    def env_rate(self) -> float:
        """Env steps per second the envs alone sustain."""
        return self.envs * self.steps / max(self.env_s, 1e-12)

    @property
    def inference_rate(self) -> float:
        """Actions per second the policy's batched forward alone sustains at this batch."""
        return self.envs * self.steps / max(self.inference_s, 1e-12)

    @property
    def env_inference_ratio(self) -> float:
        """Env-step rate over inference rate (``t_inf / t_env``)."""
        return self.env_rate / self.inference_rate

    @property
    def worker_sps(self) -> float:
        """Env steps per second of the whole worker loop (forward, then step)."""
        return self.envs * self.steps / max(self.env_s + self.inference_s, 1e-12)

    def to_dict(self) -> dict[str, float]:
        """The timing and its derived rates (JSON)."""
        return {
            **asdict(self),
            "env_rate": self.env_rate,
            "inference_rate": self.inference_rate,
            "env_inference_ratio": self.env_inference_ratio,
            "worker_sps": self.worker_sps,
        }


@dataclass(frozen=True)
class UpdateTiming:
    """Measured cost of one PPO gradient step (forward, backward, clip, Adam) on ``minibatch`` samples."""

    minibatch: int
    step_s: float

    def update_s(self, batch: int, epochs: int) -> float:
        """Predicted update time: ``epochs x batch/minibatch`` gradient steps."""
        return epochs * (batch / self.minibatch) * self.step_s


@dataclass(frozen=True)
class Sparsity:
    """How often reward arrives, in env steps (from the exploration dataset)."""

    steps: int
    rewarded_steps: int  # steps with a non-zero env reward
    goals: int  # goal events (the goal token reached)
    max_episode_steps: int

    @property
    def steps_between_rewards(self) -> float:
        """Env steps per non-zero env reward."""
        return self.steps / max(self.rewarded_steps, 1)

    @property
    def steps_between_goals(self) -> float:
        """Env steps per goal event."""
        return self.steps / max(self.goals, 1)

    def to_dict(self) -> dict[str, float]:
        """Counts and intervals (JSON)."""
        return {
            **asdict(self),
            "steps_between_rewards": self.steps_between_rewards,
            "steps_between_goals": self.steps_between_goals,
        }


@dataclass(frozen=True)
class Cores:
    """What the cluster offers: Ray's logical CPUs and the cores that can really run at once."""

    logical: int
    usable: int
    detail: str  # e.g. "1 node(s); this host: 8 logical CPUs, 2 schedulable cores"


@dataclass(frozen=True)
class Decision:
    """One knob: what the tuner set, what params.yaml had, and why."""

    knob: str
    value: int
    shipped: int
    reason: str


@dataclass(frozen=True)
class TuneChoice:
    """The settings train runs with, every decision's reason and the measurements behind them."""

    num_workers: int
    num_envs: int
    n_steps: int
    minibatch_size: int
    n_epochs: int
    eval_every_updates: int
    decisions: list[Decision]
    measured: dict[str, Any] = field(default_factory=dict)
    shipped: dict[str, int] = field(default_factory=dict)

    @property
    def settings(self) -> dict[str, int]:
        """The dotted params.yaml keys the choice sets."""
        return {
            "pool.num_workers": self.num_workers,
            "train.num_envs": self.num_envs,
            "train.n_steps": self.n_steps,
            "train.minibatch_size": self.minibatch_size,
            "train.n_epochs": self.n_epochs,
            "train.eval_every_updates": self.eval_every_updates,
        }

    def to_json(self) -> dict[str, Any]:
        """``data/tuning/choice.json``."""
        return {
            "version": CHOICE_VERSION,
            "settings": self.settings,
            "shipped": self.shipped,
            "decisions": [asdict(d) for d in self.decisions],
            "measured": self.measured,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TuneChoice:
        """Inverse of :meth:`to_json`; raises ``ValueError`` on another version or a missing key."""
        if data.get("version") != CHOICE_VERSION:
            raise ValueError(f"choice version {data.get('version')!r}, expected {CHOICE_VERSION}")
        s = data["settings"]
        return cls(
            num_workers=int(s["pool.num_workers"]),
            num_envs=int(s["train.num_envs"]),
            n_steps=int(s["train.n_steps"]),
            minibatch_size=int(s["train.minibatch_size"]),
            n_epochs=int(s["train.n_epochs"]),
            eval_every_updates=int(s["train.eval_every_updates"]),
            decisions=[Decision(**d) for d in data["decisions"]],
            measured=dict(data.get("measured", {})),
            shipped={k: int(v) for k, v in data.get("shipped", {}).items()},
        )


def shipped_settings(cfg: AgentFlowConfig) -> dict[str, int]:
    """The static settings of ``cfg`` for the knobs the tuner owns (what a choice was made from)."""
    return {
        "pool.num_workers": cfg.pool.num_workers,
        "train.num_envs": cfg.train.num_envs,
        "train.n_steps": cfg.train.n_steps,
        "train.minibatch_size": cfg.train.minibatch_size,
        "train.n_epochs": cfg.train.n_epochs,
        "train.eval_every_updates": cfg.train.eval_every_updates,
    }


def apply_choice(cfg: AgentFlowConfig, choice: TuneChoice, vocabulary: Vocabulary) -> AgentFlowConfig:
    """``cfg`` with the choice's settings, validated like params.yaml (minibatch must divide the batch).

    ``vocabulary`` is the selected process's: reward names are checked against it, as at load.
    """
    train = cfg.train.model_dump()
    train.update(
        num_envs=choice.num_envs,
        n_steps=choice.n_steps,
        minibatch_size=choice.minibatch_size,
        n_epochs=choice.n_epochs,
        eval_every_updates=choice.eval_every_updates,
    )
    pool = cfg.pool.model_dump()
    pool["num_workers"] = choice.num_workers if cfg.pool.backend == "ray" else cfg.pool.num_workers
    data = cfg.model_dump()
    data.update(train=train, pool=pool)
    return AgentFlowConfig.model_validate(data, context={"vocabulary": vocabulary})


def _pow2_at_least(x: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1.0))))


def choose_workers(cfg: AgentFlowConfig, tc: TuneConfig, cores: Cores) -> Decision:
    """One env worker per core that can step envs at the same time (the driver waits during rollouts)."""
    shipped = cfg.pool.num_workers
    if cfg.pool.backend != "ray":
        return Decision("pool.num_workers", shipped, shipped, "inprocess backend: workers run one after the other")
    n = max(1, min(cores.usable, tc.max_workers))
    why = f"{cores.detail}: {n} worker(s) step envs in parallel"
    if cores.logical > cores.usable:
        why += f"; {cores.logical} logical CPUs would only time-share {cores.usable} cores"
    if n == tc.max_workers and cores.usable > tc.max_workers:
        why += f" (capped at tune.max_workers={tc.max_workers})"
    return Decision("pool.num_workers", n, shipped, why)


def choose_envs_per_worker(tc: TuneConfig, timings: Sequence[WorkerTiming], shipped_k: int) -> Decision:
    """The smallest measured ``k`` whose env : inference ratio is at most the target, if it keeps
    :data:`THROUGHPUT_GUARD` of the best measured worker throughput; else the fastest ``k``."""
    if not timings:
        return Decision("envs_per_worker", shipped_k, shipped_k, "no probe timings: kept")
    best = max(timings, key=lambda t: t.worker_sps)
    target = tc.env_inference_ratio
    at_target = [t for t in sorted(timings, key=lambda t: t.envs) if t.env_inference_ratio <= target]
    rates = ", ".join(f"k={t.envs}: {t.env_inference_ratio:.2f} ({t.worker_sps:.0f} sps)" for t in timings)
    if at_target and at_target[0].worker_sps >= THROUGHPUT_GUARD * best.worker_sps:
        pick = at_target[0]
        why = (
            f"env:inference ratio per k {rates}; k={pick.envs} is the smallest at or below {target:g}:1 "
            f"and keeps {pick.worker_sps / best.worker_sps:.0%} of the best worker throughput"
        )
    else:
        pick = best
        reached = f"k={at_target[0].envs} reaches {target:g}:1 but" if at_target else f"no k reaches {target:g}:1 and"
        why = f"env:inference ratio per k {rates}; {reached} the fastest is k={best.envs}: taken"
    return Decision("envs_per_worker", pick.envs, shipped_k, why)


def choose_n_steps(tc: TuneConfig, sparsity: Sparsity, shipped: int) -> Decision:
    """``n_steps`` holding ``goals_per_update`` goal events per slot, at least one whole episode."""
    want = tc.goals_per_update * sparsity.steps_between_goals
    n = min(max(_pow2_at_least(want), _pow2_at_least(sparsity.max_episode_steps)), tc.max_n_steps)
    why = (
        f"a goal every {sparsity.steps_between_goals:.1f} env steps (a non-zero reward every "
        f"{sparsity.steps_between_rewards:.1f}); {tc.goals_per_update} goals per slot per update need "
        f"{want:.0f} steps, episodes last up to {sparsity.max_episode_steps}: n_steps {n}"
    )
    if n == tc.max_n_steps and want > tc.max_n_steps:
        why += f" (capped at tune.max_n_steps={tc.max_n_steps})"
    return Decision("train.n_steps", n, shipped, why)


def choose_cadence(
    cfg: AgentFlowConfig,
    tc: TuneConfig,
    batch: int,
    production_sps: float,
    update: UpdateTiming,
) -> tuple[Decision, Decision, dict[str, float]]:
    """Minibatch size (the shipped gradient steps per sample) and epochs (cut only while production
    over consumption stays above the target). Returns the two decisions and the predicted rates."""
    shipped_mb, shipped_epochs = cfg.train.minibatch_size, cfg.train.n_epochs
    # the shipped samples per gradient step: each sample sees the same number of gradient steps per epoch
    minibatch = min(shipped_mb, batch)
    while batch % minibatch:
        minibatch //= 2
    mb_why = f"batch {batch}: minibatches of {minibatch} keep the shipped {shipped_mb} samples per gradient step"
    if minibatch != shipped_mb:
        mb_why = f"batch {batch}: the shipped {shipped_mb} halved until it divides the batch: {minibatch}"
    epochs = shipped_epochs

    def ratio(e: int) -> float:
        return production_sps / (batch / max(update.update_s(batch, e), 1e-12))

    while ratio(epochs) > tc.production_consumption_ratio and epochs > tc.min_epochs:
        epochs -= 1
    consumption = batch / max(update.update_s(batch, epochs), 1e-12)
    rates = {
        "production_sps": production_sps,
        "consumption_sps": consumption,
        "production_over_consumption": production_sps / consumption,
    }
    if epochs < shipped_epochs:
        ep_why = (
            f"production {production_sps:.0f}/s vs consumption {consumption:.0f}/s at {epochs} epochs "
            f"({rates['production_over_consumption']:.2f}x): the learner held the envs back "
            f"(> {tc.production_consumption_ratio:g}x at {shipped_epochs} epochs), epochs cut (floor {tc.min_epochs})"
        )
    else:
        ep_why = (
            f"production {production_sps:.0f}/s vs consumption {consumption:.0f}/s "
            f"({rates['production_over_consumption']:.2f}x, target <= {tc.production_consumption_ratio:g}x): "
            "the learner keeps up, the shipped epochs stay"
        )
    return (
        Decision("train.minibatch_size", minibatch, shipped_mb, mb_why),
        Decision("train.n_epochs", epochs, shipped_epochs, ep_why),
        rates,
    )


def choose(
    cfg: AgentFlowConfig,
    cores: Cores,
    timings: Sequence[WorkerTiming],
    sparsity: Sparsity,
    update: UpdateTiming,
) -> TuneChoice:
    """Every knob from the measurements, in order: workers, envs per worker, n_steps, minibatch, epochs."""
    tc, train = cfg.tune, cfg.train
    workers = choose_workers(cfg, tc, cores)
    n_workers = workers.value if cfg.pool.backend == "ray" else 1
    shipped_k = max(train.num_envs // max(cfg.pool.num_workers, 1), 1)
    per_worker = choose_envs_per_worker(tc, timings, shipped_k)
    num_envs = min(per_worker.value * n_workers, tc.max_num_envs)
    n_steps = choose_n_steps(tc, sparsity, train.n_steps)
    batch = num_envs * n_steps.value
    timing = {t.envs: t for t in timings}.get(per_worker.value)
    production = (timing.worker_sps if timing else float("nan")) * n_workers
    minibatch, epochs, rates = choose_cadence(cfg, tc, batch, production, update)
    shipped_interval = train.eval_every_updates * train.num_envs * train.n_steps
    eval_every = max(1, round(shipped_interval / batch))
    eval_decision = Decision(
        "train.eval_every_updates",
        eval_every,
        train.eval_every_updates,
        f"a validation evaluation every {eval_every * batch} env steps (the static settings: every {shipped_interval})",
    )
    envs = Decision(
        "train.num_envs", num_envs, train.num_envs, f"{n_workers} worker(s) x {per_worker.value} envs per worker"
    )
    measured = {
        "cores": asdict(cores),
        "worker_timings": [t.to_dict() for t in timings],
        "sparsity": sparsity.to_dict(),
        "update_step": asdict(update),
        "predicted": {**rates, "batch": batch, "update_s": update.update_s(batch, epochs.value)},
    }
    return TuneChoice(
        num_workers=workers.value,
        num_envs=num_envs,
        n_steps=n_steps.value,
        minibatch_size=minibatch.value,
        n_epochs=epochs.value,
        eval_every_updates=eval_every,
        decisions=[workers, per_worker, envs, n_steps, minibatch, epochs, eval_decision],
        measured=measured,
        shipped=shipped_settings(cfg),
    )


# ------------------------------------------------------------------------------------ per-cycle metrics
@dataclass
class ImpedanceMeter:
    """Per-update impedance metrics from PPO's own diagnostics, plus their means over the cycle.

    ``inference_s_per_step`` is one batched forward at the per-worker batch, timed in this process;
    with the worker's loop being forward-then-step, a worker's env-step time is its per-step
    rollout time less that forward.
    """

    num_envs: int
    n_steps: int
    workers: int
    inference_s_per_step: float
    sums: dict[str, float] = field(default_factory=dict)
    updates: int = 0

    def observe(self, metrics: dict[str, float]) -> dict[str, float]:
        """The impedance metrics of one update (``impedance/*``); accumulated for :meth:`summary`."""
        batch = self.num_envs * self.n_steps
        rollout_s, update_s = metrics["time/rollout_s"], metrics["time/update_s"]
        per_step_s = rollout_s / self.n_steps  # the workers run their slices side by side
        env_s = per_step_s - self.inference_s_per_step
        k = self.num_envs / max(self.workers, 1)
        goals = metrics.get("rollout/episodes", 0.0) * metrics.get("rollout/success_rate", 0.0)
        out = {
            "impedance/production_sps": batch / max(rollout_s, 1e-12),
            "impedance/consumption_sps": batch / max(update_s, 1e-12),
            "impedance/production_over_consumption": update_s / max(rollout_s, 1e-12),
            "impedance/inference_rate": k / max(self.inference_s_per_step, 1e-12),
            "impedance/env_step_rate": k / env_s if env_s > 0 else float("nan"),
            "impedance/env_inference_ratio": self.inference_s_per_step / env_s if env_s > 0 else float("nan"),
            "impedance/steps_between_goals": batch / goals if goals > 0 else float("nan"),
            "impedance/goals_per_slot_per_update": goals / self.num_envs,
        }
        for key, value in out.items():
            if math.isfinite(value):
                self.sums[key] = self.sums.get(key, 0.0) + value
                self.sums[key + "#n"] = self.sums.get(key + "#n", 0.0) + 1
        self.updates += 1
        return out

    def summary(self) -> dict[str, float]:
        """Each metric's mean over the updates observed (finite values only)."""
        return {
            key: self.sums[key] / self.sums[key + "#n"]
            for key in sorted(self.sums)
            if not key.endswith("#n") and self.sums[key + "#n"]
        }


def time_forward(policy: ActorCritic, k: int, repeats: int = 20) -> float:
    """Median seconds of one rollout forward (``policy.sample``) on ``k`` observations, one torch thread
    as in an env worker; the weights are not changed and no global generator is drawn from."""
    obs = torch.zeros((k, policy.obs_dim))
    mask = torch.ones((k, policy.n_actions), dtype=torch.bool)
    generator = torch.Generator().manual_seed(0)
    threads = torch.get_num_threads()
    times = []
    try:
        torch.set_num_threads(1)
        device = next(policy.parameters()).device
        obs, mask = obs.to(device), mask.to(device)
        for _ in range(repeats + 1):
            started = time.perf_counter()
            policy.sample(obs, mask, generator=generator if device.type == "cpu" else None)
            times.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    return float(sorted(times[1:])[len(times[1:]) // 2])
