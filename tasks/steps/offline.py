"""Phase 1b step: conservative Q-learning on the trajectory dataset, between BC and PPO (docs/design-003.md §5.2).

Called by ``agentflow offline`` (and the DVC stage / Prefect task). Reads the catalogue's split and
the exploration dataset (every cycle's shards); writes under ``out_dir``:

* ``bc_actor.safetensors`` -- the behaviour-cloned actor, exactly the one ``agentflow train`` would
  clone (same seed, same initialisation, same successful train-split episodes);
* ``actor.safetensors`` -- that actor moved toward ``pi_BC · exp(Q/temperature)``: what
  training starts from, and what its decaying KL term holds it near;
* ``q.safetensors`` -- the conservative Q network;
* ``offline_summary.json`` -- losses, held-out TD diagnostics, replay statistics, the validation
  evaluation of both actors, the gate.

Only train-split transitions are learnt from (validation and test variants stay held out, as in BC);
``offline.heldout_share`` of those episodes are kept out of CQL for its TD diagnostics. The gate plays
both actors greedily on the validation episodes ``agentflow train`` evaluates on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentflow_core.atomic import check_output, save_tensors, write_json
from agentflow_core.config import AgentFlowConfig
from agentflow_core.evaluation.paired import paired_by_key
from agentflow_core.evaluation.policy_eval import evaluate_policy, greedy_policy, stratified_eval_variants
from agentflow_core.gates import evaluate_gate, offline_gate
from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.cql import (
    CQLSettings,
    OfflinePrior,
    QNetwork,
    actor_state,
    improve_actor,
    load_actor,
    td_error_on,
    train_cql,
)
from agentflow_core.rl.offline_data import load_transitions
from agentflow_core.rl.policy import ActorCritic, resolve_device
from agentflow_core.rl.trajectories import behaviour_cloning_arrays
from agentflow_core.splits import read_splits
from tasks.budgets import budget_metrics
from tasks.compose import PoolFactory, build_pool
from tasks.context import PhaseContext
from tasks.steps.evaluation import EVAL_NUM_ENVS

ACTOR_FILE = "actor.safetensors"
BC_ACTOR_FILE = "bc_actor.safetensors"
Q_FILE = "q.safetensors"
SUMMARY_FILE = "offline_summary.json"

METRIC_KEYS = (
    "offline_validation_process_success",
    "bc_validation_process_success",
    "offline_vs_bc_validation",
    "offline_vs_bc_validation_low",
    "offline_vs_bc_validation_high",
    "transitions",
    "heldout_transitions",
    "heldout_td_loss",
    "heldout_cql_penalty",
    "heldout_data_action_agreement",
    "final_td_loss",
    "final_cql_penalty",
    "replay_draws_newest_share",
    "improve_kl_before",
    "improve_kl_after",
    "improve_greedy_agreement",
    "bc_samples",
    "wall_s",
)


def cql_settings(cfg: AgentFlowConfig) -> CQLSettings:
    """The offline learner's settings from the ``offline`` section (gamma and widths from ``train``)."""
    o = cfg.offline
    return CQLSettings(
        gradient_steps=o.gradient_steps,
        batch_size=o.batch_size,
        learning_rate=o.learning_rate,
        gamma=cfg.train.gamma,
        alpha=o.alpha,
        target_update_every=o.target_update_every,
        hidden_sizes=tuple(cfg.train.hidden_sizes),
        prioritized=o.replay.prioritized,
        priority_alpha=o.replay.alpha,
        priority_beta=o.replay.beta,
        freshness_decay=o.replay.freshness_decay,
    )


def bc_actor(ctx: PhaseContext, catalogue_path: Path, trajectories_dir: Path, seed: int) -> tuple[ActorCritic, int]:
    """The actor ``agentflow train`` clones: ``manual_seed(seed)``, a fresh network, BC on the train split."""
    cfg = ctx.cfg
    train_variants = read_splits(catalogue_path)["train"]
    vocabulary = ctx.vocabulary
    torch.manual_seed(seed)
    policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, cfg.train.hidden_sizes)
    accepted = {v.content_hash: vocabulary.accepted_outcomes(v.params) for v in train_variants}
    arrays = behaviour_cloning_arrays(Path(trajectories_dir), accepted, vocabulary)
    result = behaviour_cloning(policy, *arrays, seed=seed)
    return policy, result.samples


def offline_actor(
    ctx: PhaseContext, catalogue_path: Path, trajectories_dir: Path, seed: int
) -> tuple[ActorCritic, ActorCritic, QNetwork, dict[str, Any]]:
    """``(bc actor, bc+cql actor, Q, figures)``: BC, then CQL on the train split's transitions, then the actor step."""
    cfg = ctx.cfg
    o, device = cfg.offline, resolve_device(cfg.base.device)
    clock = [time.perf_counter()]

    def lap() -> float:
        clock.append(time.perf_counter())
        return clock[-1] - clock[-2]

    bc, bc_samples = bc_actor(ctx, catalogue_path, trajectories_dir, seed)
    bc_s = lap()
    train_hashes = {v.content_hash for v in read_splits(catalogue_path)["train"]}
    vocabulary = ctx.vocabulary
    data = load_transitions(Path(trajectories_dir), vocabulary, train_hashes)
    fit, heldout = data.split(o.heldout_share, np.random.default_rng(seed))
    settings = cql_settings(cfg)
    data_s = lap()
    result = train_cql(fit, settings, seed=seed, device=device)
    cql_s = lap()
    diagnostics = td_error_on(result.q, heldout, settings.gamma, settings.alpha) if len(heldout) else {}
    actor = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, cfg.train.hidden_sizes)
    actor.load_state_dict(bc.state_dict())
    improved = improve_actor(
        actor, result.q, data.obs, data.mask, temperature=o.temperature, steps=o.improve_steps, seed=seed
    )
    improve_s = lap()
    figures = {
        "bc_samples": bc_samples,
        "transitions": len(fit),
        "heldout_transitions": len(heldout),
        "heldout_td_loss": diagnostics.get("td_loss", float("nan")),
        "heldout_cql_penalty": diagnostics.get("cql_penalty", float("nan")),
        "heldout_data_action_agreement": diagnostics.get("data_action_agreement", float("nan")),
        "final_td_loss": result.td_loss[-1],
        "final_cql_penalty": result.cql_penalty[-1],
        "td_loss_curve": result.td_loss,
        "cql_penalty_curve": result.cql_penalty,
        "replay_draws_newest_share": result.replay_draws_newest_share,
        "improve_kl_before": improved.kl_before,
        "improve_kl_after": improved.kl_after,
        "improve_greedy_agreement": improved.greedy_agreement,
        "cycles": int(np.ceil(data.age.max())) if len(data) else 0,
        "time_s": {"bc": bc_s, "transitions": data_s, "cql": cql_s, "improve": improve_s},
    }
    return bc, actor, result.q, figures


def run_offline(
    ctx: PhaseContext,
    catalogue_path: Path,
    trajectories_dir: Path,
    out_dir: Path,
    metrics_path: Path | None = None,
    pool_factory: PoolFactory = build_pool,
    *,
    seed: int | None = None,
) -> dict[str, Any]:
    """Run the offline stage (or record that it is switched off); returns the summary."""
    cfg = ctx.cfg
    started = time.perf_counter()
    out_dir = Path(out_dir)
    check_output(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in (ACTOR_FILE, BC_ACTOR_FILE, Q_FILE):
        (out_dir / name).unlink(missing_ok=True)  # a switched-off or failed stage leaves no actor for train
    o, seed = cfg.offline, cfg.base.seed if seed is None else seed
    if not o.enabled:
        summary: dict[str, Any] = {"enabled": False, "passed": True, "gate": "offline stage switched off"}
        summary["message"] = "offline.enabled is false: training starts from behaviour cloning alone"
        write_json(out_dir / SUMMARY_FILE, summary)
        if metrics_path is not None:
            write_json(metrics_path, {"enabled": 0.0})
        return summary
    bc, actor, q, figures = offline_actor(ctx, catalogue_path, trajectories_dir, seed)
    splits = read_splits(catalogue_path)
    dimensions = sorted(cfg.variants.dimensions)
    validation = stratified_eval_variants(splits["validation"], o.eval_episodes, dimensions, cfg.base.seed)
    pool = pool_factory(
        ctx,
        validation,
        min(cfg.train.num_envs, EVAL_NUM_ENVS),
        seed=cfg.base.seed + 1,
        scheduler="round_robin",
        standby=False,
    )
    eval_started = time.perf_counter()
    try:
        evals = {
            name: evaluate_policy(
                pool, greedy_policy(net), o.eval_episodes, seed=cfg.base.seed + 7, dimensions=dimensions
            )
            for name, net in (("bc", bc), ("offline", actor))
        }
    finally:
        pool.close()
    figures["time_s"]["validation_eval"] = time.perf_counter() - eval_started
    # the paired per-episode difference (same variants, k-th episode each) with its 95% bounds: the gate reads
    # the upper bound, so only a regression the sample shows beyond the margin stops the stage
    offline_rows, bc_rows = ([(o.key, float(o.success)) for o in evals[name].outcomes] for name in ("offline", "bc"))
    paired = paired_by_key(offline_rows, bc_rows)
    summary = {
        "enabled": True,
        **figures,
        "offline_validation_process_success": evals["offline"].process_success_rate,
        "bc_validation_process_success": evals["bc"].process_success_rate,
        "offline_vs_bc_validation": paired.mean,
        "offline_vs_bc_validation_low": paired.low,
        "offline_vs_bc_validation_high": paired.high,
        "offline_vs_bc_pairs": paired.pairs,
        "offline_validation_by_family": evals["offline"].process_success_by_family,
        "bc_validation_by_family": evals["bc"].process_success_by_family,
        "seed": seed,
    }
    verdict = evaluate_gate(offline_gate(cfg), summary)
    if verdict.passed:
        save_tensors(actor_state(actor), out_dir / ACTOR_FILE)
    save_tensors(actor_state(bc), out_dir / BC_ACTOR_FILE)
    save_tensors({k: v.detach().cpu().contiguous() for k, v in q.state_dict().items()}, out_dir / Q_FILE)
    summary["wall_s"] = time.perf_counter() - started
    summary.update(
        passed=verdict.passed,
        gate=verdict.message,
        message=(
            f"{verdict.message}: validation process success BC+CQL {summary['offline_validation_process_success']:.3f} "
            f"vs BC {summary['bc_validation_process_success']:.3f} on {o.eval_episodes} episodes (paired difference "
            f"{paired.mean:+.3f}, 95% [{paired.low:+.3f}, {paired.high:+.3f}]); "
            f"{summary['transitions']} transitions, held-out TD loss {summary['heldout_td_loss']:.4g}"
        ),
        **budget_metrics("offline", summary["wall_s"], o.budget_s),
    )
    write_json(out_dir / SUMMARY_FILE, summary)
    if metrics_path is not None:
        write_json(metrics_path, offline_metrics(summary))
    return summary


def offline_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """``data/metrics/offline.json``: the headline numbers and the budget."""
    budget = {k: float(v) for k, v in summary.items() if k.startswith("budget/")}
    return {"enabled": 1.0, **{k: float(summary[k]) for k in METRIC_KEYS}} | budget


@dataclass(frozen=True)
class OfflineStart:
    """The offline stage's actor (PPO's initial actor weights) and the decaying KL prior toward it."""

    path: Path
    actor: dict[str, torch.Tensor]
    prior: OfflinePrior
    settings: dict[str, float]


def offline_start(ctx: PhaseContext, offline_dir: Path | None, warm_start: Path | None) -> OfflineStart | None:
    """The offline actor when the stage is on and wrote one (``offline_dir``, default ``<data_dir>/offline``).

    A retrain's champion warm start replaces it (the champion already learnt online); without an
    actor file (the stage switched off, not run, or its gate failed) training starts from BC alone.
    A damaged file counts as absent, with a warning line.
    """
    from safetensors.torch import load_file

    cfg = ctx.cfg
    path = Path(offline_dir or ctx.paths.offline) / ACTOR_FILE
    if not cfg.offline.enabled or warm_start is not None or not path.is_file():
        return None
    reference = ActorCritic(ctx.vocabulary.obs_dim, ctx.vocabulary.n_actions, cfg.train.hidden_sizes)
    try:
        actor = load_file(str(path))
        load_actor(reference, actor)
    except Exception as exc:  # SafetensorError on damaged bytes, KeyError/RuntimeError on wrong tensors
        logging.getLogger("agentflow.train").warning(
            "offline actor %s is damaged (%s: %s): treated as absent, training starts from BC alone; "
            "the cycle's offline phase recomputes it (its output no longer matches its cache record)",
            path,
            type(exc).__name__,
            str(exc)[:160],
        )
        return None
    o = cfg.offline
    prior = OfflinePrior(reference, o.kl_coef, o.kl_decay_updates)
    return OfflineStart(path, actor, prior, {"kl_coef": o.kl_coef, "kl_decay_updates": o.kl_decay_updates})
