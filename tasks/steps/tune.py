"""Tune step: the impedance-matching probe before train (docs/design.md §7.1), and train's reading of its choice.

The probe (``agentflow tune``, the DVC stage ``tune``, the flow's ``tune`` phase) measures, on this
machine and the train split of the catalogue:

- per envs-per-worker candidate ``k``: one env worker (the same :class:`EnvWorker` and pool driver
  a Ray actor hosts) stepping ``k`` envs with a fresh policy for ``tune.probe_steps`` pool steps,
  the batched forwards timed apart from the pool steps, the candidates taking turns (fastest of 3);
- one PPO gradient step at the shipped minibatch size (forward, backward, clip, Adam);
- reward sparsity in the exploration dataset (steps between non-zero env rewards and goal events);
- the cores: Ray's logical CPUs, and per host the cores that host schedules.

:func:`agentflow_core.tuning.choose` turns them into settings; ``data/tuning/choice.json`` holds
the settings, each decision's reason, the measurements, and the static settings they replace.
Train (:func:`tuned_config`) runs with them when ``tune.enabled`` and the choice was made from
the same static settings; otherwise with the static ones, saying why.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch
from torch import nn

from agentflow_core.atomic import check_output, write_json
from agentflow_core.config import AgentFlowConfig
from agentflow_core.rl.losses import LossCoefficients, ppo_minibatch_loss
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.rollout import CentralRollouts
from agentflow_core.splits import read_splits
from agentflow_core.tuning import (
    CHOICE_VERSION,
    Sparsity,
    TuneChoice,
    UpdateTiming,
    WorkerTiming,
    apply_choice,
    choose,
    shipped_settings,
)
from agentflow_core.variants import VariantSpec
from tasks.budgets import budget_metrics
from tasks.compose import build_pool
from tasks.context import PhaseContext
from tasks.process_io import load_process

CHOICE_FILE = "choice.json"
WARMUP_STEPS = 2
PROBE_REPEATS = 3


class TimedPolicy(ActorCritic):
    """The policy with its rollout forwards timed (``inference_s``): the probe's split of a worker's loop."""

    inference_s: float = 0.0
    first_call: float | None = None  # when the rollout's first forward began (the pool reset is over)

    def sample(
        self, obs: torch.Tensor, mask: torch.Tensor | None, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`ActorCritic.sample`, timed."""
        started = time.perf_counter()
        if self.first_call is None:
            self.first_call = started
        out = super().sample(obs, mask, generator=generator)
        self.inference_s += time.perf_counter() - started
        return out


def time_workers(
    ctx: PhaseContext,
    variants: Sequence[VariantSpec],
    ks: Sequence[int],
    steps: int,
    seed: int,
    repeats: int = PROBE_REPEATS,
) -> list[WorkerTiming]:
    """Per ``k``: one in-process env worker stepping ``k`` envs, pool-step time and forward time over ``steps`` steps.

    The same :class:`EnvWorker` and pool driver a Ray actor hosts, one torch thread as there. The
    candidates take turns, ``repeats`` rounds, and each keeps its fastest rollout: on a shared machine a
    load burst then slows one round of every candidate instead of all of one, and the slower rounds
    mostly measure someone else's load. The rollout's opening reset is left out (a real rollout
    amortises it over ``n_steps``).
    """
    cfg = ctx.cfg
    one_worker = ctx.with_config(
        cfg.model_copy(update={"pool": cfg.pool.model_copy(update={"backend": "inprocess", "num_workers": 1})})
    )
    threads = torch.get_num_threads()
    pools = {k: build_pool(one_worker, variants, k, seed=seed, standby=False) for k in ks}
    best: dict[int, tuple[float, float]] = {}
    try:
        torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            vocabulary = ctx.vocabulary
            policy = TimedPolicy(vocabulary.obs_dim, vocabulary.n_actions, cfg.train.hidden_sizes)
        rollouts = {k: CentralRollouts(pool) for k, pool in pools.items()}
        for source in rollouts.values():
            source.collect(policy, WARMUP_STEPS, seed, 0)  # envs created and reset once before timing
        for rep in range(repeats):
            for k, source in rollouts.items():
                policy.inference_s, policy.first_call = 0.0, None
                source.collect(policy, steps, seed, rep + 1)
                stepping = time.perf_counter() - (policy.first_call or 0.0)
                if k not in best or stepping < sum(best[k]):
                    best[k] = (stepping - policy.inference_s, policy.inference_s)
    finally:
        torch.set_num_threads(threads)
        for pool in pools.values():
            pool.close()
    return [WorkerTiming(envs=k, steps=steps, env_s=best[k][0], inference_s=best[k][1]) for k in ks]


def time_update_step(ctx: PhaseContext, seed: int, repeats: int = 8) -> UpdateTiming:
    """Fastest time of one PPO gradient step at the shipped minibatch size, on random data of the real shapes."""
    cfg, vocabulary = ctx.cfg, ctx.vocabulary
    mb = cfg.train.minibatch_size
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, cfg.train.hidden_sizes)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.train.learning_rate, eps=1e-5)
    obs = torch.rand((mb, vocabulary.obs_dim), generator=gen)
    masks = torch.ones((mb, vocabulary.n_actions), dtype=torch.bool)
    actions = torch.randint(0, vocabulary.n_actions, (mb,), generator=gen)
    logprobs = torch.full((mb,), -float(np.log(vocabulary.n_actions)))
    advantages, returns = torch.randn(mb, generator=gen), torch.randn(mb, generator=gen)
    coef = LossCoefficients(cfg.train.clip_range, cfg.train.ent_coef, cfg.train.vf_coef, 0.0)
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        loss, _ = ppo_minibatch_loss(policy, obs, masks, actions, logprobs, advantages, returns, coef)
        optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(policy.parameters(), cfg.train.max_grad_norm)
        optimizer.step()
        times.append(time.perf_counter() - started)
    return UpdateTiming(minibatch=mb, step_s=min(times[1:]))  # the fastest: the rest is the machine's other load


def measure_sparsity(ctx: PhaseContext, trajectories: Path, variants: Sequence[VariantSpec]) -> Sparsity:
    """Steps, rewarded steps and goal events in the exploration shards; the longest episode the variants allow."""
    steps = rewarded = goals = 0
    goal = ctx.vocabulary.goal
    for shard in sorted(Path(trajectories).rglob("*.parquet")):
        table = pq.read_table(shard, columns=["env_reward", "tokens"])
        reward = table.column("env_reward").to_numpy(zero_copy_only=False)
        steps += len(reward)
        rewarded += int(np.count_nonzero(reward))
        goals += sum(goal in (tokens or ()) for tokens in table.column("tokens").to_pylist())
    registry = ctx.registry
    longest = max(registry.get(v.base_env_id).scenario(v.params).max_episode_steps for v in variants[:200])
    return Sparsity(steps=steps, rewarded_steps=rewarded, goals=goals, max_episode_steps=int(longest))


def run_tune(
    ctx: PhaseContext,
    catalogue: Path,
    trajectories: Path,
    out_dir: Path,
    metrics_path: Path | None = None,
    replay: Path | None = None,
) -> dict[str, Any]:
    """Probe, choose, write ``<out_dir>/choice.json`` (and the phase metrics); returns the summary.

    ``tune.enabled`` false: no probe; the record says so and train keeps the static settings.
    ``replay``: a recorded choice.json (``agentflow reproduce`` replays the run's own choice rather
    than probing a machine whose load has changed since); it must have been made from these static settings.
    """
    cfg = ctx.cfg
    check_output(out_dir)
    started = time.perf_counter()
    tc = cfg.tune
    out = Path(out_dir) / CHOICE_FILE
    if not tc.enabled:
        write_json(out, {"version": CHOICE_VERSION, "enabled": False, "reason": "tune.enabled is false"})
        summary: dict[str, Any] = {"tune/enabled": 0, "decisions": [], "message": "tune.enabled is false: no probe"}
    else:
        if replay is not None:
            choice = TuneChoice.from_json(json.loads(Path(replay).read_text(encoding="utf-8")))
            if choice.shipped != shipped_settings(cfg):
                raise ValueError(f"{replay} was chosen for other static settings than these params")
        else:
            choice = probe_and_choose(ctx, catalogue, trajectories)
        write_json(out, {**choice.to_json(), "replayed_from": None if replay is None else str(replay)})
        summary = choice_summary(choice)
    summary.update(budget_metrics("tune", time.perf_counter() - started, tc.budget_s))
    if metrics_path is not None:
        write_json(metrics_path, {k: v for k, v in summary.items() if isinstance(v, int | float)})
    return summary


def probe_and_choose(ctx: PhaseContext, catalogue: Path, trajectories: Path) -> TuneChoice:
    """The probe's measurements on this machine, and the choice they lead to."""
    cfg = ctx.cfg
    tc = cfg.tune
    train_variants = read_splits(catalogue)["train"]
    cores = ctx.backend.cores()
    timings = time_workers(ctx, train_variants, sorted(set(tc.envs_per_worker)), tc.probe_steps, cfg.base.seed)
    update = time_update_step(ctx, cfg.base.seed)
    sparsity = measure_sparsity(ctx, trajectories, train_variants)
    return choose(cfg, cores, timings, sparsity, update)


def choice_summary(choice: TuneChoice) -> dict[str, Any]:
    """The phase's metrics (``tune/*``: settings, predicted rates, sparsity) and its decisions as lines."""
    measured = choice.measured
    return {
        "tune/enabled": 1,
        **{f"tune/{k}": v for k, v in choice.settings.items()},
        **{f"tune/{k}": v for k, v in measured["predicted"].items()},
        "tune/steps_between_goals": measured["sparsity"]["steps_between_goals"],
        "tune/steps_between_rewards": measured["sparsity"]["steps_between_rewards"],
        "tune/usable_cores": measured["cores"]["usable"],
        "decisions": [f"{d.knob} {d.shipped} -> {d.value}: {d.reason}" for d in choice.decisions],
        "message": ", ".join(f"{d.knob} {d.shipped} -> {d.value}" for d in choice.decisions),
    }


def tuned_config(cfg: AgentFlowConfig, tuning_dir: Path) -> tuple[AgentFlowConfig, dict[str, Any]]:
    """The config train runs with and a record of why: the choice applied, or the static settings.

    Applied only with ``tune.enabled``, a readable choice, and a choice made from the same static
    settings as ``cfg`` (else it was made for other params and is stale).
    """
    path = Path(tuning_dir) / CHOICE_FILE
    if not cfg.tune.enabled:
        return cfg, {"applied": False, "reason": "tune.enabled is false: the static settings"}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        choice = TuneChoice.from_json(data)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return cfg, {"applied": False, "reason": f"no usable {path} ({type(exc).__name__}): the static settings"}
    if choice.shipped != shipped_settings(cfg):
        return cfg, {"applied": False, "reason": f"{path} was chosen for other static settings: the static settings"}
    tuned = apply_choice(cfg, choice, load_process(cfg).vocabulary)
    return tuned, {"applied": True, "reason": f"{path}", "settings": choice.settings, "shipped": choice.shipped}
