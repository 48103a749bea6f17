"""Coverage-driven ε-greedy exploration over an env pool, recorded as trajectory shards.

Each pool step the behaviour policy takes ``policy_fn(obs, masks)`` (the untrained PPO policy's
greedy action or the scripted expert) and, independently per env with probability ε, replaces
it with an action drawn uniformly among the legal ones. ε follows the state coverage ratio
(:func:`agentflow_core.rl.coverage.epsilon_for`): high while coverage is poor, low once the
vocabulary and the expert's transitions are covered. An optional reference run of a second
policy (the scripted expert) first fills the coverage tracker's reference edges.

Remediation (the Phase 1 gate, docs/design.md §2.2): when the ratio is still below
``cfg.min_state_coverage`` after ``cfg.total_steps``, exploration goes on with ε raised to
``cfg.remediation.epsilon`` until the ratio reaches the gate or ``cfg.remediation.max_steps`` more
steps are spent, whichever comes first. Long, mostly random episodes are what reach the timer
states (an expired session or order) that the expert's short episodes never live to see.

The loop writes one trajectory row per env step to an injected writer and reports progress
through an injected callback; it never prints. Exit metric: ``state_coverage_ratio``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from agentflow_core.config import ExploreConfig
from agentflow_core.contracts import EnvPool, PolicyFn, PoolBatch
from agentflow_core.rl.coverage import CoverageTracker, epsilon_for
from agentflow_core.rl.reward import RewardComponents, RewardFunction
from agentflow_core.semantics import Vocabulary


class RowSink(Protocol):
    """Where trajectory rows go (:class:`agentflow_core.rl.trajectories.TrajectoryWriter`)."""

    def append(self, row: dict[str, Any]) -> None:
        """Store one trajectory row (a step of one env)."""


@dataclass(frozen=True)
class ExploreProgress:
    """A progress snapshot handed to ``on_progress``."""

    steps: int
    total_steps: int
    episodes: int
    goal_episodes: int
    state_coverage_ratio: float
    token_coverage: float
    edge_coverage: float
    epsilon: float


@dataclass(frozen=True)
class ExploreResult:
    """What an exploration run achieved; ``state_coverage_ratio`` is the exit metric."""

    steps: int
    episodes: int
    goal_episodes: int
    state_coverage_ratio: float
    token_coverage: float
    edge_coverage: float
    final_epsilon: float
    mean_epsilon: float
    explored_fraction: float
    reference_steps: int
    remediation_steps: int
    coverage_graph: dict[str, Any] = field(repr=False)
    failure_reasons: dict[str, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Flat numeric metrics for tracking."""
        return {
            "state_coverage_ratio": self.state_coverage_ratio,
            "token_coverage": self.token_coverage,
            "edge_coverage": self.edge_coverage,
            "explore_steps": float(self.steps),
            "explore_episodes": float(self.episodes),
            "goal_episodes": float(self.goal_episodes),
            "final_epsilon": self.final_epsilon,
            "mean_epsilon": self.mean_epsilon,
            "explored_fraction": self.explored_fraction,
            "remediation_steps": float(self.remediation_steps),
        }


def sample_legal(masks: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One uniformly random legal action per row (argmax of uniform noise on legal entries)."""
    noise = rng.random(masks.shape)
    noise[~masks] = -1.0
    return noise.argmax(axis=1).astype(np.int64)


def epsilon_greedy(
    greedy: np.ndarray, masks: np.ndarray, epsilon: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Replace each greedy action by a random legal one with probability ε; returns (actions, explored)."""
    explored = rng.random(len(greedy)) < epsilon
    actions = np.where(explored, sample_legal(masks, rng), np.asarray(greedy, dtype=np.int64))
    return actions, explored


_VERSION = re.compile(r"_v(\d+)(?:_|$)")


def env_version_of(info: dict[str, Any]) -> str:
    """``info['env_version']`` if the pool reports it, else the ``_v<N>`` of the env_id."""
    if info.get("env_version") is not None:
        return str(info["env_version"])
    match = _VERSION.search(str(info.get("env_id", "")))
    return match.group(1) if match else ""


def _next_obs(batch: PoolBatch) -> tuple[np.ndarray, np.ndarray]:
    done = np.asarray(batch.terminated, dtype=bool) | np.asarray(batch.truncated, dtype=bool)
    return np.where(done[:, None], batch.final_obs, batch.obs), done


def reference_run(pool: EnvPool, policy_fn: PolicyFn, tracker: CoverageTracker, pool_steps: int, seed: int) -> int:
    """Run ``policy_fn`` greedily for ``pool_steps`` pool steps; its edges become coverage references."""
    batch = pool.reset(seed)
    for _ in range(pool_steps):
        prev = batch.obs
        batch = pool.step(np.asarray(policy_fn(batch.obs, batch.action_mask), dtype=np.int64))
        nxt, _ = _next_obs(batch)
        tracker.add_reference(nxt, prev)
    return pool_steps * pool.num_envs


def explore(
    pool: EnvPool,
    policy_fn: PolicyFn,
    cfg: ExploreConfig,
    rng: np.random.Generator,
    writer: RowSink,
    *,
    seed: int = 0,
    tracker: CoverageTracker | None = None,
    reward_fn: RewardFunction | None = None,
    policy_hash: str = "",
    reference_fn: PolicyFn | None = None,
    reference_pool_steps: int = 0,
    on_progress: Callable[[ExploreProgress], None] | None = None,
    progress_every: int = 10,
    restart_schedule: bool = False,
) -> ExploreResult:
    """Explore for ``cfg.total_steps`` env steps with coverage-driven ε, then remediate; rows go to ``writer``.

    ``restart_schedule`` puts the pool's scheduler back where it was before the reference run, so
    the recorded exploration starts at the scheduler's first variants (a retrain's priority order).
    """
    tracker = tracker or CoverageTracker(vocabulary=pool.vocabulary)
    vocabulary = tracker.vocabulary  # the process the pool's envs speak (the tracker is built over it)
    goal_index = vocabulary.token_index()[vocabulary.goal]
    snapshot = pool.scheduler.state_dict() if restart_schedule else None
    reference_steps = (
        reference_run(pool, reference_fn, tracker, reference_pool_steps, seed + 1)
        if reference_fn and reference_pool_steps
        else 0
    )
    if snapshot is not None:
        pool.scheduler.load_state_dict(snapshot)
    n = pool.num_envs
    batch = pool.reset(seed)
    tracker.observe(batch.obs)
    if reward_fn is not None:
        reward_fn.reset(batch.obs)
    episode_index = np.zeros(n, dtype=np.int64)
    steps = episodes = goal = explored_total = pool_steps = 0
    epsilon_sum = 0.0
    failures: dict[str, int] = {}
    epsilon = epsilon_for(tracker.ratio, cfg)
    budget = cfg.total_steps + cfg.remediation.max_steps
    while steps < cfg.total_steps or (steps < budget and tracker.ratio < cfg.min_state_coverage):
        remediating = steps >= cfg.total_steps
        epsilon = cfg.remediation.epsilon if remediating else epsilon_for(tracker.ratio, cfg)
        obs, masks = batch.obs, batch.action_mask
        actions, explored = epsilon_greedy(policy_fn(obs, masks), masks, epsilon, rng)
        batch = pool.step(actions)
        nxt, done = _next_obs(batch)
        stepped = slice(None) if batch.pending is None else ~batch.pending
        tracker.update(nxt[stepped], obs[stepped])
        tracker.observe(batch.obs[done])
        components = reward_fn.step(batch) if reward_fn is not None else None
        now = time.time()
        for i in range(n):
            if batch.pending is not None and batch.pending[i]:  # no step happened in this slot
                continue
            row = _row(
                batch,
                i,
                obs[i],
                masks[i],
                int(batch.infos[i].get("action", actions[i])),  # a step that was pending: its own action
                bool(explored[i]),
                nxt[i],
                components,
                f"{seed}-{i}-{episode_index[i]}",
                seed,
                policy_hash,
                now,
                vocabulary,
            )
            writer.append(row)
            if row["failure_reason"]:
                failures[row["failure_reason"]] = failures.get(row["failure_reason"], 0) + 1
        episodes += int(done.sum())
        goal += int((done & np.asarray(batch.terminated, dtype=bool) & (nxt[:, goal_index] > 0.5)).sum())
        episode_index += done
        steps += n
        pool_steps += 1
        explored_total += int(explored.sum())
        epsilon_sum += epsilon * n
        if on_progress is not None and (pool_steps % progress_every == 0 or steps - n < cfg.total_steps <= steps):
            on_progress(
                ExploreProgress(
                    steps,
                    budget if remediating else cfg.total_steps,
                    episodes,
                    goal,
                    tracker.ratio,
                    tracker.token_coverage,
                    tracker.edge_coverage,
                    epsilon,
                )
            )
    return ExploreResult(
        steps=steps,
        episodes=episodes,
        goal_episodes=goal,
        state_coverage_ratio=tracker.ratio,
        token_coverage=tracker.token_coverage,
        edge_coverage=tracker.edge_coverage,
        final_epsilon=epsilon,
        mean_epsilon=epsilon_sum / max(steps, 1),
        explored_fraction=explored_total / max(steps, 1),
        reference_steps=reference_steps,
        remediation_steps=max(steps - cfg.total_steps, 0),
        coverage_graph=tracker.graph(),
        failure_reasons=failures,
    )


def _row(
    batch: Any,
    i: int,
    obs: np.ndarray,
    mask: np.ndarray,
    action: int,
    explored: bool,
    nxt: np.ndarray,
    components: RewardComponents | None,
    episode_id: str,
    seed: int,
    policy_hash: str,
    now: float,
    vocabulary: Vocabulary,
) -> dict[str, Any]:
    info = batch.infos[i]
    env_reward = float(batch.reward[i])
    base, shaping = (float(components.base[i]), float(components.shaping[i])) if components else (env_reward, 0.0)
    return {
        "episode_id": episode_id,
        "env_id": str(info.get("env_id", "")),
        "variant_hash": str(info.get("variant_hash", "")),
        "env_version": env_version_of(info),
        "policy_hash": policy_hash,
        "seed": int(info.get("seed", seed)),
        "timestamp": now,
        "step_id": int(info.get("step_id", 0)),
        "obs": obs,
        "action_mask": mask,
        "action": action,
        "explored": explored,
        "tokens": [vocabulary.tokens[k] for k in np.flatnonzero(nxt[: vocabulary.n_tokens] > 0.5)],
        "reward": base + shaping,
        "env_reward": env_reward,
        "base_reward": base,
        "shaping_reward": shaping,
        "terminated": bool(batch.terminated[i]),
        "truncated": bool(batch.truncated[i]),
        "failure_reason": info.get("failure_reason"),
        "risk": float(info.get("risk", 0.0)),
    }
