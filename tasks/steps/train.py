"""Phase 2 step: PPO refinement (optionally warm-started by behaviour cloning), resumable.

Called by ``agentflow train`` (and the DVC stage / Prefect task). Reads the variant catalogue
and, for the BC warm start, the exploration trajectories; writes under ``out_dir``:

* ``checkpoints/`` -- atomic checkpoints every ``checkpoint_every_updates`` updates and every
  ``checkpoint_every_minutes`` minutes, plus ``best.json`` (best validation business value where the
  channel prices episodes, else best validation process success: :func:`selection_metric`);
* ``policy.safetensors`` + ``policy.json`` -- the best policy and its card (hash, metrics);
* ``curve.json`` -- per-update training curve and validation evaluations;
* ``validation_curve.csv`` -- validation process/payment success per evaluation (``dvc plots``);
* ``train_summary.json`` -- the summary returned here;
* ``plots/train_curves.png`` -- success rate and reward vs environment steps.

PPO and behaviour cloning see the catalogue's train split only (``agentflow_core.splits``);
stratified evaluations on the validation split pick the best checkpoint and drive convergence;
the test split is played only once, at the end, to report the best checkpoint against the
exploration policy and the scripted expert (payment and process success, per family and per
dimension value, with Wilson intervals).

``resume=True`` continues from ``checkpoints/latest.json`` and produces the same losses and final
parameters as a run that was never interrupted (see ``agentflow_core.rl.ppo`` for why).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch

from agentflow_core.atomic import MIN_FREE_BYTES, check_output, save_tensors, write_json
from agentflow_core.config import AgentFlowConfig, TrainConfig
from agentflow_core.contracts import EnvPool, RolloutSource
from agentflow_core.evaluation.policy_eval import EvalResult, stratified_eval_variants
from agentflow_core.gates import evaluate_gate, train_gate
from agentflow_core.pool.episodes import GREEDY, ActorSpec
from agentflow_core.pool.rollout import SlicedRollouts
from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.checkpoint import (
    BEST,
    LATEST,
    CheckpointManager,
    load_checkpoint,
    load_intact,
    restore_ppo,
)
from agentflow_core.rl.convergence import ConvergenceTracker
from agentflow_core.rl.cql import load_actor
from agentflow_core.rl.ewc import EWCPenalty
from agentflow_core.rl.normalize import PerEnvRewardNormalizer
from agentflow_core.rl.policy import ActorCritic, resolve_device
from agentflow_core.rl.ppo import PPO, MetricsSink, NullSink, TrainingReward
from agentflow_core.rl.reward import RewardFunction
from agentflow_core.rl.trajectories import behaviour_cloning_arrays
from agentflow_core.splits import read_splits
from agentflow_core.tuning import ImpedanceMeter, time_forward
from agentflow_core.variants import VariantSpec
from tasks.budgets import budget_metrics
from tasks.compose import build_rollouts, recovery_summary, reward_function
from tasks.context import PhaseContext
from tasks.steps.auto_shaping import auto_shaped
from tasks.steps.evaluation import FINAL_EVAL_EPISODES
from tasks.steps.offline import offline_start
from tasks.steps.train_outputs import plot_curves, train_metrics, train_summary, write_outputs
from tasks.steps.train_references import copy_offline_bc_actor, reference_actors, save_bc_actor
from tasks.steps.train_state import FinalPolicy, TrainingRun, TrainingState
from tasks.steps.validator import training_validator

# The keys of a PPO update's metrics kept in the training curve (curve.json, the plots).
CURVE_KEYS = (
    "global_step",
    "rollout/success_rate",
    "rollout/episode_return",
    "losses/approx_kl",
    "adaptive/clip_range",
)


def reward_transform(
    cfg: AgentFlowConfig, pool: EnvPool | RolloutSource[Any], reward_fn: RewardFunction
) -> TrainingReward:
    """The reward PPO trains on over ``pool`` (normalised per base env); `agentflow bench learning` uses it too."""
    base_of = {i: v.base_env_id for i, v in enumerate(pool.variants)}
    normalizer = PerEnvRewardNormalizer() if cfg.train.reward.normalize else None
    return TrainingReward(
        reward_fn,
        normalizer,
        key_of=lambda info: base_of.get(info.get("variant_index", -1), str(info.get("env_id"))),
    )


def run_train(
    ctx: PhaseContext,
    catalogue_path: Path,
    trajectories_dir: Path | None,
    out_dir: Path,
    resume: bool,
    sink: MetricsSink | None = None,
    on_update: Callable[[int, int, dict[str, float]], None] | None = None,
    metrics_path: Path | None = None,
    *,
    seed: int | None = None,
    warm_start: Path | None = None,
    rollout_factory: Callable[..., SlicedRollouts] = build_rollouts,
    offline_dir: Path | None = None,
    ewc: Path | None = None,
    tuning: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train (or resume) the policy; returns the summary (also written to ``train_summary.json``).

    Training's rollouts come from ``rollout_factory`` (worker-side rollouts); its validation and test
    evaluations run on the same env workers (:meth:`SlicedRollouts.evaluate`: the weights shipped
    once, each worker plays its share of the (variant, seed) episodes and returns them in one call).

    A retrain passes its cycle ``seed`` and the champion's checkpoint as ``warm_start``. The cycle
    seed drives what the cycle does anew -- network initialisation, behaviour cloning, the training
    pool and PPO's minibatches; ``base.seed`` keeps choosing the validation and test episodes, so
    every cycle is evaluated on the same held-out episodes. ``warm_start`` weights replace the
    fresh initialisation and the behaviour-cloning warm start (its at least 500 gradient steps
    would overwrite what the champion learnt): PPO continues from the champion. ``ewc`` (the
    champion's Fisher and weights, ``agentflow_core.rl.ewc``) adds the EWC penalty toward it to
    PPO's loss when ``train.ewc.enabled``. The discriminator reward validator, when trained
    (``tasks.steps.validator``), down-weights the rewards of suspicious training episodes.

    ``tuning`` records whether ``ctx.cfg`` carries the auto-tuner's choice (``tasks.steps.tune.tuned_config``);
    every update's impedance metrics (``impedance/*``, docs/design.md §7.1) go to the sink and the summary.
    """
    check_output(Path(out_dir), MIN_FREE_BYTES)  # its checkpoints are rotated, not doubled: the floor is the estimate
    ctx, key_states = auto_shaped(ctx, catalogue_path, trajectories_dir)
    if ctx.cfg.train.reward.auto_shaping:
        write_json(Path(out_dir) / "key_states.json", key_states)
    resources = ExitStack()  # pools and the reward-model client, closed however training ends
    with ExitStack() as on_error:
        on_error.push(resources)
        run = open_training(
            ctx, catalogue_path, Path(out_dir), sink, resources, seed, warm_start, rollout_factory, offline_dir, ewc
        )
        on_error.pop_all()
    state = TrainingState()
    t_start = time.perf_counter()
    try:
        start_training(run, state, resume, trajectories_dir, warm_start)
        train_loop(run, state, t_start, on_update)
        state.stop_reason = state.stop_reason or "step_budget"
        # the curves are final now: drawn while the test episodes play (the driver mostly waits on them)
        plot = resources.enter_context(ThreadPoolExecutor(1, thread_name_prefix="agentflow-plot")).submit(
            plot_curves, state.curve, state.evals, run.out_dir / "plots" / "train_curves.png"
        )
        best = final_evaluation(run)
    finally:
        resources.close()
    return finish_training(run, state, best, plot, t_start, metrics_path, warm_start, ewc, tuning)


def open_training(
    ctx: PhaseContext,
    catalogue_path: Path,
    out_dir: Path,
    sink: MetricsSink | None,
    resources: ExitStack,
    seed: int | None,
    warm_start: Path | None,
    rollout_factory: Callable[..., SlicedRollouts],
    offline_dir: Path | None,
    ewc: Path | None,
) -> TrainingRun:
    """The run's splits, networks, rollout source, reward and PPO, in the order the seed draws them.

    The pool and the reward-model client are registered on ``resources``.
    """
    cfg = ctx.cfg
    tc, seed = cfg.train, cfg.base.seed if seed is None else seed
    splits = read_splits(catalogue_path)
    validation, test = held_out(cfg, splits)
    device = resolve_device(cfg.base.device)
    policy, untrained = initial_networks(ctx, seed, device, warm_start)
    pool = rollout_factory(ctx, splits["train"], tc.num_envs, seed=seed, eval_variants=[*validation, *test])
    resources.callback(pool.close)
    sink = sink or NullSink()
    ppo, penalty, validator = learner(ctx, policy, pool, seed, device, sink, resources, ewc)
    offline = offline_start(ctx, offline_dir, warm_start)
    if offline is not None and tc.bc_warm_start:  # PPO starts from the offline actor: kept near it at first
        ppo.policy_penalty = offline.prior
    impedance = impedance_meter(pool, tc, policy)
    manager = CheckpointManager(
        out_dir / "checkpoints", tc.checkpoint_every_updates, tc.checkpoint_every_minutes, vocabulary=ctx.vocabulary
    )
    return TrainingRun(
        ctx,
        out_dir,
        seed,
        sink,
        splits,
        validation,
        test,
        policy,
        untrained,
        pool,
        ppo,
        penalty,
        validator,
        offline,
        impedance,
        manager,
    )


def learner(
    ctx: PhaseContext,
    policy: ActorCritic,
    pool: SlicedRollouts,
    seed: int,
    device: torch.device | str,
    sink: MetricsSink,
    resources: ExitStack,
    ewc: Path | None,
) -> tuple[PPO, EWCPenalty | None, Any]:
    """PPO over ``pool`` with the configured reward, the EWC penalty toward the champion and the reward validator."""
    tc = ctx.cfg.train
    reward = reward_transform(ctx.cfg, pool, resources.enter_context(reward_function(ctx, pool.num_envs)))
    penalty = EWCPenalty.load(Path(ewc), tc.ewc.lam) if ewc is not None and tc.ewc.enabled else None
    validator = training_validator(ctx)
    ppo = PPO(
        policy,
        pool,
        tc,
        seed=seed,
        sink=sink,
        reward_transform=reward,
        device=device,
        regularizer=penalty,
        reward_validator=validator,
    )
    return ppo, penalty, validator


def held_out(cfg: AgentFlowConfig, splits: dict[str, list[VariantSpec]]) -> tuple[list[VariantSpec], list[VariantSpec]]:
    """The validation and test episodes' variants, stratified; ``base.seed`` chooses them, whatever the cycle seed."""
    tc, dimensions, eval_seed = cfg.train, sorted(cfg.variants.dimensions), cfg.base.seed
    validation = stratified_eval_variants(splits["validation"], tc.eval_episodes, dimensions, eval_seed)
    n_final = max(tc.eval_episodes, FINAL_EVAL_EPISODES)
    return validation, stratified_eval_variants(splits["test"], n_final, dimensions, eval_seed)


def initial_networks(
    ctx: PhaseContext, seed: int, device: torch.device | str, warm_start: Path | None
) -> tuple[ActorCritic, ActorCritic]:
    """PPO's network (seeded, or the champion's weights) and a CPU copy of it as it starts, the exploration baseline."""
    tc, vocab = ctx.cfg.train, ctx.vocabulary
    torch.manual_seed(seed)
    policy = ActorCritic(vocab.obs_dim, vocab.n_actions, tc.hidden_sizes).to(device)
    if warm_start is not None:
        policy.load_state_dict(load_checkpoint(Path(warm_start), tc.hidden_sizes, vocabulary=vocab).model)
    untrained = ActorCritic(vocab.obs_dim, vocab.n_actions, tc.hidden_sizes)
    untrained.load_state_dict({k: v.cpu() for k, v in policy.state_dict().items()})
    return policy, untrained


def start_training(
    run: TrainingRun, state: TrainingState, resume: bool, trajectories_dir: Path | None, warm_start: Path | None
) -> None:
    """Resume from the latest checkpoint, or start: from the champion, the offline actor or behaviour cloning."""
    tc, vocab, ckpt_root = run.tc, run.vocab, run.ckpt_root
    ckpt = load_intact(ckpt_root, LATEST, tc.hidden_sizes, vocabulary=vocab) if resume else None
    if ckpt is not None:
        restore_ppo(run.ppo, ckpt)
        extra = ckpt.state["extra"]
        state.tracker.load_state_dict(extra["tracker"])
        state.curve, state.evals, state.bc_summary = extra["curve"], extra["evals"], extra["bc"]
        # a converged run stays stopped; one cut by its step or time budget goes on to the new budget
        if extra.get("stop_reason") == "converged" and tc.gate.stop_on_convergence:
            state.stop_reason = "converged"
        run.untrained.load_state_dict(load_checkpoint_untrained(ckpt_root))
        return
    if warm_start is not None:
        state.bc_summary = {"used": False, "reason": f"warm start from {warm_start}"}
    elif run.offline is not None and not tc.bc_warm_start:  # the offline stage's actors are references only
        state.bc_summary = {"used": False, "reason": "train.bc_warm_start is false: PPO starts from a fresh network"}
        copy_offline_bc_actor(ckpt_root, run.offline.path)
    elif run.offline is not None:
        load_actor(run.policy, run.offline.actor)
        state.bc_summary = {"used": True, "source": "offline", "actor": str(run.offline.path)}
        copy_offline_bc_actor(ckpt_root, run.offline.path)
    elif tc.bc_warm_start and trajectories_dir is not None and Path(trajectories_dir).exists():
        accepted = {v.content_hash: vocab.accepted_outcomes(v.params) for v in run.splits["train"]}
        obs, actions, masks = behaviour_cloning_arrays(Path(trajectories_dir), accepted, vocab)
        result = behaviour_cloning(run.policy, obs, actions, masks, seed=run.seed)
        if result.samples > 0:
            save_bc_actor(ckpt_root, run.policy)
        state.bc_summary = {
            "used": result.samples > 0,
            "samples": result.samples,
            "accuracy": result.accuracy,
            "final_loss": result.losses[-1] if result.losses else None,
        }
    ckpt_root.mkdir(parents=True, exist_ok=True)
    untrained = {k: v.contiguous() for k, v in run.untrained.state_dict().items()}
    save_tensors(untrained, ckpt_root / "untrained.safetensors")


def train_loop(
    run: TrainingRun,
    state: TrainingState,
    t_start: float,
    on_update: Callable[[int, int, dict[str, float]], None] | None,
) -> None:
    """PPO updates until convergence, the step budget or the time budget; validation and checkpoints on the way."""
    tc, ppo, sink = run.tc, run.ppo, run.sink
    num_updates = tc.num_updates
    next_rollout_runs = _next_rollout_runs(tc, t_start)
    greedy = ActorSpec(GREEDY, tuple(tc.hidden_sizes))
    eval_seed = run.ctx.cfg.base.seed
    t_update = time.perf_counter()
    while ppo.update < num_updates and state.stop_reason is None:
        metrics = ppo.train_iteration(prefetch_next=next_rollout_runs)
        sink.record(ppo.global_step, run.impedance.observe(metrics))
        state.curve.append({k: metrics[k] for k in CURVE_KEYS if k in metrics})
        over_time = time.perf_counter() - t_start >= tc.budget_s
        is_last = ppo.update == num_updates or over_time
        new_best = evaluated = False
        if ppo.update % tc.eval_every_updates == 0 or is_last:
            result_eval = run.evaluate(run.validation, greedy, ppo.policy, tc.eval_episodes, eval_seed + 7)
            eval_metrics = result_eval.metrics("validation/")
            state.evals.append({"global_step": float(ppo.global_step), "update": float(ppo.update), **eval_metrics})
            new_best = state.tracker.add(ppo.update, *selection_metric(result_eval))
            sink.record(ppo.global_step, {**eval_metrics, "policy_convergence_flag": float(state.tracker.converged)})
            evaluated = True
        last = ppo.update == num_updates
        state.stop_reason = _stop_reason(tc, state.tracker, ppo.global_step, evaluated, over_time, last)
        if run.manager.due(ppo.update) or new_best or state.stop_reason is not None:
            sink.flush()  # the metrics up to here in the store: a resumed run restarts after this checkpoint
            best_metric = state.tracker.best_metric if state.evals else None
            path = run.manager.save(ppo, best_metric=best_metric, extra=state.extra())
            if new_best:
                run.manager.mark_best(path)
        if on_update is not None:
            on_update(ppo.update, num_updates, metrics)
        state.update_sps.append(ppo.batch_size / max(time.perf_counter() - t_update, 1e-9))
        t_update = time.perf_counter()


def selection_metric(result: EvalResult) -> tuple[float, float]:
    """What picks the best checkpoint and drives convergence: validation business value (ties: process success)
    where the channel prices its episodes, else process success (ties: mean return)."""
    if result.value is not None:
        return result.value.overall, result.process_success_rate
    return result.process_success_rate, result.mean_return


def final_evaluation(run: TrainingRun) -> FinalPolicy:
    """The best checkpoint and the reference policies (:mod:`tasks.steps.train_references`) on the test split."""
    tc, vocab = run.tc, run.vocab
    best_ckpt = load_intact(run.ckpt_root, BEST, tc.hidden_sizes, vocabulary=vocab)
    assert best_ckpt is not None
    best_policy = ActorCritic(vocab.obs_dim, vocab.n_actions, tc.hidden_sizes)
    best_policy.load_state_dict(best_ckpt.model)
    greedy = ActorSpec(GREEDY, tuple(tc.hidden_sizes))
    n_final, eval_seed = max(tc.eval_episodes, FINAL_EVAL_EPISODES), run.ctx.cfg.base.seed
    # every policy plays the same episodes (variant, episode number, reset seed): the comparisons are paired
    final = {
        name: run.evaluate(run.test, actor, net, n_final, eval_seed + 11)
        for name, actor, net in (("trained", greedy, best_policy), *reference_actors(run))
    }
    return FinalPolicy(best_ckpt, best_policy, final, recovery_summary(run.pool))


def finish_training(
    run: TrainingRun,
    state: TrainingState,
    best: FinalPolicy,
    plot: Future[None],
    t_start: float,
    metrics_path: Path | None,
    warm_start: Path | None,
    ewc: Path | None,
    tuning: dict[str, Any] | None,
) -> dict[str, Any]:
    """Write the best policy, the summary (with the train gate's verdict), the card, curves and metrics."""
    tc, out_dir = run.tc, run.out_dir
    save_tensors({k: v.contiguous() for k, v in best.checkpoint.model.items()}, out_dir / "policy.safetensors")
    summary = train_summary(run, state, best, time.perf_counter() - t_start, warm_start, ewc, tuning)
    gate = train_gate(run.ctx.cfg)
    verdict = evaluate_gate(gate, {k: v for k, v in summary.items() if isinstance(v, int | float)})
    ppo = run.ppo
    summary.update(
        passed=verdict.passed,
        gate=verdict.message,
        message=f"{verdict.message}; stopped on {state.stop_reason} after {ppo.global_step} steps ({ppo.update} updates)",
        **budget_metrics("train", summary["wall_s"], tc.budget_s, ppo.global_step, gate.budget_steps),
    )
    card = {
        "policy_hash": summary["policy_hash"],
        "hidden_sizes": list(tc.hidden_sizes),
        "vocab_version": run.vocab.version,
        "test_process_success": summary["test_process_success"],
        "test_goal_success": summary["test_goal_success"],
        "checkpoint": best.checkpoint.path.name,
    }
    write_outputs(out_dir, summary, card, state.curve, state.evals)
    plot.result()
    if metrics_path is not None:
        write_json(metrics_path, train_metrics(summary))
    return summary


def impedance_meter(pool: EnvPool | SlicedRollouts, tc: TrainConfig, policy: ActorCritic) -> ImpedanceMeter:
    """The cycle's impedance meter: the training pool's layout and one forward at its per-worker batch, timed."""
    workers = len(pool.slots) if isinstance(pool, SlicedRollouts) else 1
    k = max(pool.num_envs // workers, 1)
    return ImpedanceMeter(pool.num_envs, tc.n_steps, workers, time_forward(policy, k))


def _next_rollout_runs(tc: TrainConfig, t_start: float) -> Callable[[int], bool]:
    """Whether the rollout after ``update`` surely runs (PPO sends it ahead): no evaluation follows the
    update (it may stop training on convergence), and neither the step nor the time budget ends with it."""

    def runs(update: int) -> bool:
        return (
            update % tc.eval_every_updates != 0
            and update < tc.num_updates
            and time.perf_counter() - t_start < tc.budget_s
        )

    return runs


def _stop_reason(
    tc: TrainConfig, tracker: ConvergenceTracker, global_step: int, evaluated: bool, over_time: bool, last: bool
) -> str | None:
    """Why training stops after this update, or None: convergence, then the time budget, then the step budget."""
    if evaluated and tc.gate.stop_on_convergence and tracker.converged and global_step >= tc.gate.min_steps:
        return "converged"
    if over_time:
        return "time_budget"
    return "step_budget" if last else None


def load_checkpoint_untrained(ckpt_root: Path) -> dict[str, torch.Tensor]:
    """The initial (pre-BC, pre-PPO) weights: the exploration baseline is epsilon-greedy around them."""
    from safetensors.torch import load_file

    from agentflow_core.rl.checkpoint import CheckpointError

    try:
        return load_file(str(ckpt_root / "untrained.safetensors"))
    except Exception as exc:  # safetensors raises its own SafetensorError on damaged bytes
        raise CheckpointError(ckpt_root / "untrained.safetensors", f"{type(exc).__name__}: {exc}") from None
