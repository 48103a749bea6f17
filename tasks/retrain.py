"""Retrains that build on the champion: the plan, the appended dataset, the paired promotion, per-cycle reports.

A cycle run with ``retrain=True`` (``agentflow run --retrain``, or the flow parameter from a
deployment or the Prefect UI) differs from a fresh cycle in four places:

* **plan** (:func:`plan_retrain`, first thing after the parent run opens): download the current
  champion (registry alias ``champion`` of ``base.tracking.registered_model``) into
  ``<state_dir>/cycles/<run>/champion``; draw a fresh cycle seed from the OS (not ``base.seed``, not
  a seed already in the dataset); play the champion greedily on a stratified sample of the train
  split; rank the train variants: the ones the champion failed first (most failures first), then
  every other one by how rarely exploration visited it so far (rows per env id in the dataset
  card). The plan is a JSON file (``plan.json``); tasks get its path. The seed is logged as the
  parent run's ``cycle_seed`` param and tag.
* **explore** (:func:`explore_retrain`): ε-greedy around ``explore.behaviour`` (the expert, or with
  ``policy`` the champion), walking the train split round-robin in the plan's order, with the cycle seed; its shards are *appended* to
  ``data/trajectories`` (:mod:`tasks.dataset`), each naming its cycle.
* **train**: PPO starts from the champion's weights with the cycle seed (``run_train``'s
  ``warm_start`` and ``seed``); validation and test episodes stay those of ``base.seed``.
* **promotion** (:func:`paired_decision`): the canary first -- the existing consistency and reward
  gain rule on the stable ``report.champion_slice`` of the test split
  (``tasks.steps.report.run_champion_challenger``); only if it passes, both policies play the same
  held-out episodes (:func:`paired_heldout`) and the challenger is promoted only if it beats the
  champion on them (:mod:`agentflow_core.evaluation.paired`).

Every cycle, retrain or not, keeps its report under ``<state_dir>/reports/<run>/`` (the rendered
report and ``decision.json``) with a ``latest`` link to the newest cycle and a ``champion`` link that
moves only on promotion (:func:`keep_cycle_report`): a failed challenger never replaces the
champion's report.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentflow_core.atomic import write_json
from agentflow_core.config import AgentFlowConfig
from agentflow_core.evaluation.paired import EpisodeOutcome, PairedComparison, compare_paired
from agentflow_core.evaluation.policy_eval import stratified_eval_variants
from agentflow_core.evaluation.records import EpisodeRecord
from agentflow_core.rl.exploration import ExploreProgress
from agentflow_core.semantics import Vocabulary
from agentflow_core.splits import read_splits
from agentflow_core.variants import VariantSpec
from tasks.compose import PoolFactory, build_pool, reward_function
from tasks.context import PhaseContext
from tasks.dataset import append_cycle, dataset_seeds, visit_counts
from tasks.rollout import load_policy, resolve_checkpoint, stress_rollout
from tasks.runtime import state_dir
from tasks.tracking import MlflowTracker

PLAN_FILE = "plan.json"
HELDOUT_EPISODES = 128  # as many as training's final test evaluation plays (tasks.steps.evaluation.FINAL_EVAL_EPISODES)
PRIORITY_SAMPLE = 128  # train variants the champion plays to find what it fails


@dataclass(frozen=True)
class RetrainPlan:
    """What a retrain cycle does anew: its seed, the champion it starts from, the variants it explores first."""

    cycle: str  # the MLflow parent run id
    seed: int
    champion_version: str | None
    champion_checkpoint: str | None
    priority: tuple[str, ...]  # env ids, explored first in this order
    champion_failed: tuple[str, ...]  # the train variants the champion failed in the sample
    sampled: int
    ewc: str | None = None  # the champion's Fisher + weights (agentflow_core.rl.ewc), next to its checkpoint

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``plan.json``)."""
        return asdict(self)

    @classmethod
    def read(cls, path: str | Path) -> RetrainPlan:
        """The plan written by :func:`plan_retrain`."""
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(**{**data, "priority": tuple(data["priority"]), "champion_failed": tuple(data["champion_failed"])})

    def summary(self) -> dict[str, Any]:
        """The small part that goes into the cycle's results and MLflow."""
        return {
            "cycle_seed": self.seed,
            "champion_version": self.champion_version,
            "warm_start": self.champion_checkpoint,
            "champion_failed_train_variants": len(self.champion_failed),
            "champion_sampled_train_variants": self.sampled,
            "priority_variants": len(self.priority),
            "ewc": self.ewc,
        }


def cycle_dir(cfg: AgentFlowConfig, cycle: str) -> Path:
    """``<state_dir>/cycles/<run>``: the plan and the champion checkpoint a retrain started from."""
    return state_dir(cfg) / "cycles" / cycle


def draw_cycle_seed(exclude: set[int]) -> int:
    """A fresh 32-bit seed from the OS, none of ``exclude`` (``base.seed`` and the dataset's seeds)."""
    while True:
        seed = secrets.randbelow(2**32)
        if seed not in exclude:
            return seed


def _outcomes(records: Sequence[EpisodeRecord]) -> Counter[str]:
    return Counter(r.env_id for r in records if not r.success)


def priority_order(train: Sequence[VariantSpec], failures: Counter[str], visits: dict[str, int]) -> list[str]:
    """Failed variants first (most failures first), then the rest by how rarely they were visited (catalogue order on ties)."""
    position = {v.env_id: i for i, v in enumerate(train)}
    failed = sorted((e for e in failures if e in position), key=lambda e: (-failures[e], position[e]))
    rest = sorted((v.env_id for v in train if v.env_id not in failures), key=lambda e: (visits.get(e, 0), position[e]))
    return failed + rest


def plan_retrain(
    ctx: PhaseContext, tracker: MlflowTracker, cycle: str, pool_factory: PoolFactory = build_pool
) -> RetrainPlan:
    """Download the champion, draw the cycle seed, rank the train variants; write ``plan.json``."""
    from tasks.model_registry import champion_checkpoint, champion_version

    cfg = ctx.cfg
    paths = ctx.paths
    out = cycle_dir(cfg, cycle)
    seed = draw_cycle_seed({cfg.base.seed, *dataset_seeds(paths.trajectories)})
    name = cfg.base.tracking.registered_model
    downloaded = champion_checkpoint(tracker, name)
    checkpoint: Path | None = None
    train = read_splits(paths.variants)["train"]
    failures: Counter[str] = Counter()
    sample: list[VariantSpec] = []
    if downloaded is not None:
        checkpoint = out / "champion"
        if checkpoint.exists():
            shutil.rmtree(checkpoint)
        shutil.copytree(downloaded, checkpoint)
        sample = stratified_eval_variants(train, PRIORITY_SAMPLE, sorted(cfg.variants.dimensions), seed)
        champion = load_policy(resolve_checkpoint(ctx, checkpoint), ctx.process)
        rollout = stress_rollout(ctx, champion, sample, len(sample), pool_factory=pool_factory, seed=seed)
        failures = _outcomes(rollout.episodes)
    ewc = None
    if checkpoint is not None and cfg.train.ewc.enabled:
        ewc = str(champion_fisher(ctx, checkpoint, paths.trajectories))
    plan = RetrainPlan(
        cycle=cycle,
        seed=seed,
        champion_version=champion_version(tracker, name),
        champion_checkpoint=None if checkpoint is None else str(checkpoint),
        priority=tuple(priority_order(train, failures, visit_counts(paths.trajectories))),
        champion_failed=tuple(sorted(failures)),
        sampled=len(sample),
        ewc=ewc,
    )
    write_json(out / PLAN_FILE, plan.to_dict())
    return plan


def champion_fisher(ctx: PhaseContext, checkpoint: Path, trajectories: Path) -> Path:
    """EWC at the start of a retrain: the champion's diagonal Fisher on its data, written next to its checkpoint.

    Its data: ``train.ewc.samples`` states drawn (seeded by ``base.seed``) from the trajectory
    dataset as it stands before this cycle appends to it -- the states of the cycles the champion
    was trained on.
    """
    from agentflow_core.rl.checkpoint import load_checkpoint
    from agentflow_core.rl.ewc import FISHER_FILE, champion_penalty
    from agentflow_core.rl.policy import ActorCritic

    cfg = ctx.cfg
    vocabulary = ctx.vocabulary
    obs, masks = dataset_states(trajectories, cfg.train.ewc.samples, cfg.base.seed, vocabulary)
    policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, cfg.train.hidden_sizes)
    checkpoint_path = Path(resolve_checkpoint(ctx, checkpoint))
    policy.load_state_dict(load_checkpoint(checkpoint_path, cfg.train.hidden_sizes, vocabulary=vocabulary).model)
    path = checkpoint.parent / FISHER_FILE
    champion_penalty(policy, obs, masks, cfg.train.ewc.lam).save(path)
    return path


def dataset_states(trajectories: Path, n: int, seed: int, vocabulary: Vocabulary) -> tuple[Any, Any]:
    """``(obs, action_mask)`` of ``n`` rows of the dataset drawn without replacement (all rows if fewer)."""
    import numpy as np

    from agentflow_core.rl.trajectories import read_steps

    obs_dim, n_actions = vocabulary.obs_dim, vocabulary.n_actions
    if not (Path(trajectories) / "_meta.json").exists():
        return np.zeros((0, obs_dim), np.float32), np.zeros((0, n_actions), bool)
    table = read_steps(Path(trajectories), vocabulary=vocabulary)
    obs = np.asarray(table.column("obs").combine_chunks().flatten(), dtype=np.float32).reshape(-1, obs_dim)
    masks = np.asarray(
        table.column("action_mask").combine_chunks().flatten().to_numpy(zero_copy_only=False), dtype=bool
    ).reshape(-1, n_actions)
    if len(obs) > n:
        idx = np.sort(np.random.default_rng(seed).choice(len(obs), n, replace=False))
        obs, masks = obs[idx], masks[idx]
    return obs, masks


def explore_retrain(
    ctx: PhaseContext,
    plan: RetrainPlan,
    metrics_path: Path | None = None,
    on_progress: Callable[[ExploreProgress], None] | None = None,
    pool_factory: PoolFactory = build_pool,
) -> dict[str, Any]:
    """Explore in the plan's order with the cycle seed (around the champion when ``explore.behaviour`` is ``policy``);
    append the shards to the dataset."""
    from tasks.steps.explore import run_explore

    cfg = ctx.cfg
    paths = ctx.paths
    fresh = cycle_dir(cfg, plan.cycle) / "trajectories"
    summary = run_explore(
        ctx,
        paths.variants,
        fresh,
        metrics_path,
        on_progress,
        pool_factory,
        seed=plan.seed,
        priority=plan.priority,
        warm_start=None if plan.champion_checkpoint is None else Path(plan.champion_checkpoint),
        card={"cycle": plan.cycle, "cycle_seed": plan.seed, "champion_version": plan.champion_version},
    )
    card = append_cycle(paths.trajectories, fresh, plan.cycle, plan.seed)
    shutil.rmtree(fresh)
    return {
        **summary,
        "cycle_rows": summary["rows"],
        "rows": card["rows"],
        "shards": len(card["shards"]),
        "dataset_cycles": len(card["cycles"]),
    }


def _heldout(ctx: PhaseContext) -> list[VariantSpec]:
    cfg = ctx.cfg
    splits = read_splits(ctx.paths.variants)
    n = max(cfg.train.eval_episodes, HELDOUT_EPISODES)
    return stratified_eval_variants(splits["test"], n, sorted(cfg.variants.dimensions), cfg.base.seed)


def heldout_outcomes(
    ctx: PhaseContext, checkpoint: str | Path, pool_factory: PoolFactory = build_pool
) -> list[EpisodeOutcome]:
    """One policy's outcomes on the held-out episodes (test split, ``base.seed``), identical for every policy.

    One pool slot walks the variants round-robin and draws each reset seed from the pool's
    generator seeded with ``base.seed``: the k-th episode is the same (variant, seed) whatever the
    policy does, which is what makes the comparison paired.
    """
    from agentflow_core.evaluation.stress import RiskRule, run_stress_episodes

    cfg = ctx.cfg
    variants = _heldout(ctx)
    n = max(cfg.train.eval_episodes, HELDOUT_EPISODES)
    policy = load_policy(resolve_checkpoint(ctx, checkpoint), ctx.process)
    pool = pool_factory(ctx, variants, 1, seed=cfg.base.seed + 13, scheduler="round_robin", standby=False)
    try:
        with reward_function(ctx, pool.num_envs) as reward_fn:
            rollout = run_stress_episodes(
                pool,
                policy.act,
                variants,
                n,
                seed=cfg.base.seed + 13,
                reward_fn=reward_fn,
                risk=RiskRule(cfg.stress.risk_threshold, cfg.stress.risk_penalty),
            )
    finally:
        pool.close()
    return [
        EpisodeOutcome(f"{k}:{e.env_id}", bool(e.success), float(e.evaluated_return))
        for k, e in enumerate(rollout.episodes)
    ]


def paired_heldout(
    ctx: PhaseContext, challenger: str | Path, champion: str | Path, pool_factory: PoolFactory = build_pool
) -> PairedComparison:
    """Challenger vs champion on the identical held-out episodes."""
    return compare_paired(
        heldout_outcomes(ctx, challenger, pool_factory), heldout_outcomes(ctx, champion, pool_factory)
    )


def paired_decision(
    ctx: PhaseContext, challenger: str | Path, champion: str | Path, canary: dict[str, Any]
) -> dict[str, Any]:
    """The canary decision, then (only if it passed) the paired held-out comparison, as one decision."""
    cfg = ctx.cfg
    if not canary["promote"]:
        return {**canary, "reason": f"canary failed on the {cfg.report.champion_slice:.0%} slice: {canary['reason']}"}
    paired = paired_heldout(ctx, challenger, champion)
    detail = (
        f"held-out paired on {paired.episodes} identical episodes: process success {paired.challenger_success:.3f} "
        f"vs champion {paired.champion_success:.3f} ({paired.wins} wins, {paired.losses} losses), "
        f"mean return diff {paired.mean_return_diff:+.3f} (95% lower bounds: success {paired.success_diff_low:+.3f}, "
        f"return {paired.mean_return_diff_low:+.3f}; one must be > 0), sign test p={paired.sign_test_p:.3f}"
    )
    verdict = "promote" if paired.beats else "keep the champion (the challenger does not beat it on held-out episodes)"
    return {
        **canary,
        "promote": paired.beats,
        "reason": f"{verdict}: canary passed; {detail}",
        "paired": paired.to_dict(),
    }


def _point(root: Path, name: str, target: str) -> None:
    link = root / name
    tmp = root / f".{name}.tmp"
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)


def reports_root(cfg: AgentFlowConfig) -> Path:
    """``<state_dir>/reports``: one folder per cycle plus the ``latest`` and ``champion`` links."""
    return state_dir(cfg) / "reports"


def keep_cycle_report(ctx: PhaseContext, cycle: str, decision: dict[str, Any]) -> Path:
    """Copy this cycle's rendered report to ``reports/<cycle>/`` with its decision; move ``latest`` (and ``champion`` if promoted)."""
    cfg = ctx.cfg
    root = reports_root(cfg)
    out = root / cycle
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(ctx.paths.reports, out)
    write_json(out / "decision.json", decision)
    _point(root, "latest", cycle)
    if decision.get("promote"):
        _point(root, "champion", cycle)
    return out
