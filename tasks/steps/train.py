"""Phase 2 step: PPO refinement (optionally warm-started by behaviour cloning), resumable.

Called by ``agentflow train`` (and the DVC stage / Prefect task). Reads the variant catalogue
and, for the BC warm start, the exploration trajectories; writes under ``out_dir``:

* ``checkpoints/`` -- atomic checkpoints every ``checkpoint_every_updates`` updates and every
  ``checkpoint_every_minutes`` minutes, plus ``best.json`` (best validation process success);
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

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from agentflow_core.atomic import MIN_FREE_BYTES, atomic_file, check_output, save_tensors, write_json, write_text
from agentflow_core.config import AgentFlowConfig, TrainConfig
from agentflow_core.contracts import EnvPool
from agentflow_core.evaluation.policy_eval import EvalResult, stratified_eval_variants, summarise_episodes
from agentflow_core.gates import evaluate_gate, train_gate
from agentflow_core.pool.episodes import EPSILON_GREEDY, EXPERT, GREEDY, ActorSpec
from agentflow_core.pool.rollout import SlicedRollouts
from agentflow_core.rl.bc import behaviour_cloning
from agentflow_core.rl.checkpoint import BEST, LATEST, CheckpointManager, load_checkpoint, load_intact, restore_ppo
from agentflow_core.rl.convergence import ConvergenceTracker
from agentflow_core.rl.cql import OfflinePrior, load_actor
from agentflow_core.rl.ewc import EWCPenalty
from agentflow_core.rl.normalize import PerEnvRewardNormalizer
from agentflow_core.rl.policy import ActorCritic, policy_hash, resolve_device
from agentflow_core.rl.ppo import PPO, MetricsSink, NullSink, TrainingReward
from agentflow_core.rl.reward import RewardFunction
from agentflow_core.rl.trajectories import behaviour_cloning_arrays
from agentflow_core.splits import read_splits
from agentflow_core.tuning import ImpedanceMeter, time_forward
from agentflow_core.variants import VariantSpec
from tasks.budgets import budget_metrics
from tasks.compose import build_rollouts, recovery_summary, reward_function
from tasks.process_io import load_process
from tasks.steps.validator import training_validator

EXPLORATION_EPSILON = 0.95
EVAL_NUM_ENVS = 16
FINAL_EVAL_EPISODES = 128


def reward_transform(cfg: AgentFlowConfig, pool: EnvPool | SlicedRollouts, reward_fn: RewardFunction) -> TrainingReward:
    """The reward PPO trains on over ``pool`` (normalised per base env); `agentflow bench learning` uses it too."""
    base_of = {i: v.base_env_id for i, v in enumerate(pool.variants)}
    normalizer = PerEnvRewardNormalizer() if cfg.train.reward.normalize else None
    return TrainingReward(
        reward_fn,
        normalizer,
        key_of=lambda info: base_of.get(info.get("variant_index", -1), str(info.get("env_id"))),
    )


@dataclass(frozen=True)
class OfflineStart:
    """The offline stage's actor (PPO's initial actor weights) and the decaying KL prior toward it."""

    path: Path
    actor: dict[str, torch.Tensor]
    prior: OfflinePrior
    settings: dict[str, float]


def offline_start(cfg: AgentFlowConfig, offline_dir: Path | None, warm_start: Path | None) -> OfflineStart | None:
    """The offline actor when the stage is on and wrote one (``offline_dir``, default ``<data_dir>/offline``).

    A retrain's champion warm start replaces it (the champion already learnt online); without an
    actor file (the stage switched off, not run, or its gate failed) training starts from BC alone.
    A damaged file counts as absent, with a warning line.
    """
    from safetensors.torch import load_file

    from tasks.paths import DataPaths
    from tasks.steps.offline import ACTOR_FILE

    path = Path(offline_dir or DataPaths.of(cfg).offline) / ACTOR_FILE
    if not cfg.offline.enabled or warm_start is not None or not path.is_file():
        return None
    reference = ActorCritic(hidden_sizes=cfg.train.hidden_sizes)
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


def _plot_curves(curve: list[dict[str, float]], evals: list[dict[str, float]], path: Path) -> None:
    """The training curves as a PNG (a bare ``Figure``, no pyplot: drawn on a helper thread)."""
    from matplotlib.figure import Figure

    path.parent.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(11, 4))
    ax_s, ax_r = fig.subplots(1, 2)
    steps = [c["global_step"] for c in curve]
    ax_s.plot(steps, [c.get("rollout/success_rate", np.nan) for c in curve], label="training rollouts")
    ax_r.plot(steps, [c.get("rollout/episode_return", np.nan) for c in curve], label="training rollouts")
    if evals:
        ax_s.plot(
            [e["global_step"] for e in evals],
            [e["validation/process_success_rate"] for e in evals],
            "o-",
            label="validation process success (greedy)",
        )
        ax_r.plot(
            [e["global_step"] for e in evals], [e["validation/mean_return"] for e in evals], "o-", label="validation"
        )
    ax_s.set(xlabel="environment steps", ylabel="success rate", title="success rate")
    ax_r.set(xlabel="environment steps", ylabel="episode return (env reward)", title="reward")
    for ax in (ax_s, ax_r):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    with atomic_file(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)


def run_train(
    cfg: AgentFlowConfig,
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

    ``tuning`` records whether ``cfg`` carries the auto-tuner's choice (``tasks.steps.tune.tuned_config``);
    every update's impedance metrics (``impedance/*``, docs/design.md §7.1) go to the sink and the summary.
    """
    tc, seed, eval_seed = cfg.train, cfg.base.seed if seed is None else seed, cfg.base.seed
    out_dir = Path(out_dir)
    check_output(out_dir, MIN_FREE_BYTES)  # its checkpoints are rotated, not doubled: the floor is the estimate
    ckpt_root = out_dir / "checkpoints"
    sink = sink or NullSink()
    splits = read_splits(catalogue_path)
    train_variants = splits["train"]
    dimensions = sorted(cfg.variants.dimensions)
    validation = stratified_eval_variants(splits["validation"], tc.eval_episodes, dimensions, eval_seed)
    n_final = max(tc.eval_episodes, FINAL_EVAL_EPISODES)
    test = stratified_eval_variants(splits["test"], n_final, dimensions, eval_seed)
    device = resolve_device(cfg.base.device)
    torch.manual_seed(seed)
    process = load_process(cfg)
    vocab = process.vocabulary
    policy = ActorCritic(vocab.obs_dim, vocab.n_actions, tc.hidden_sizes).to(device)
    if warm_start is not None:
        policy.load_state_dict(load_checkpoint(Path(warm_start), tc.hidden_sizes, vocab).model)
    untrained = ActorCritic(vocab.obs_dim, vocab.n_actions, tc.hidden_sizes)
    untrained.load_state_dict({k: v.cpu() for k, v in policy.state_dict().items()})
    resources = ExitStack()  # pools and the reward-model client, closed however training ends
    pool = rollout_factory(cfg, train_variants, tc.num_envs, seed=seed, eval_variants=[*validation, *test])
    resources.callback(pool.close)
    eval_envs = min(tc.num_envs, EVAL_NUM_ENVS)

    def evaluate(
        variants: list[VariantSpec], actor: ActorSpec, net: ActorCritic | None, n: int, episodes_seed: int
    ) -> EvalResult:
        records = pool.evaluate(variants, actor, net, n, episodes_seed, min(eval_envs, max(len(variants), 1)))
        return summarise_episodes(records, variants, dimensions, vocab)

    greedy = ActorSpec(GREEDY, tuple(tc.hidden_sizes))
    reward = reward_transform(cfg, pool, resources.enter_context(reward_function(cfg, pool.num_envs)))
    penalty = EWCPenalty.load(Path(ewc), tc.ewc.lam) if ewc is not None and tc.ewc.enabled else None
    validator = training_validator(cfg)
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
    offline = offline_start(cfg, offline_dir, warm_start)
    if offline is not None:
        ppo.policy_penalty = offline.prior
    impedance = impedance_meter(pool, tc, policy)
    manager = CheckpointManager(ckpt_root, tc.checkpoint_every_updates, tc.checkpoint_every_minutes, vocabulary=vocab)
    tracker = ConvergenceTracker()
    curve: list[dict[str, float]] = []
    evals: list[dict[str, float]] = []
    bc_summary: dict[str, Any] = {"used": False}
    # this process's throughput per update, its steps over the time since the previous update ended
    # (the rollout, the update and what the loop does with it: evaluations, checkpoints, logging);
    # timing, so not in checkpoints
    update_sps: list[float] = []
    t_start = time.perf_counter()
    stop_reason: str | None = None  # converged | step_budget | time_budget, whichever came first
    try:
        ckpt = load_intact(ckpt_root, LATEST, tc.hidden_sizes, vocab) if resume else None
        if ckpt is not None:
            restore_ppo(ppo, ckpt)
            extra = ckpt.state["extra"]
            tracker.load_state_dict(extra["tracker"])
            curve, evals, bc_summary = extra["curve"], extra["evals"], extra["bc"]
            # a converged run stays stopped; one cut by its step or time budget goes on to the new budget
            if extra.get("stop_reason") == "converged" and tc.gate.stop_on_convergence:
                stop_reason = "converged"
            untrained.load_state_dict(load_checkpoint_untrained(ckpt_root))
        else:
            if warm_start is not None:
                bc_summary = {"used": False, "reason": f"warm start from {warm_start}"}
            elif offline is not None:
                load_actor(policy, offline.actor)
                bc_summary = {"used": True, "source": "offline", "actor": str(offline.path)}
            elif tc.bc_warm_start and trajectories_dir is not None and Path(trajectories_dir).exists():
                accepted = {v.content_hash: vocab.accepted_outcomes(v.params) for v in train_variants}
                obs, actions, masks = behaviour_cloning_arrays(Path(trajectories_dir), accepted, vocab)
                result = behaviour_cloning(policy, obs, actions, masks, seed=seed)
                bc_summary = {
                    "used": result.samples > 0,
                    "samples": result.samples,
                    "accuracy": result.accuracy,
                    "final_loss": result.losses[-1] if result.losses else None,
                }
            ckpt_root.mkdir(parents=True, exist_ok=True)
            save_tensors(
                {k: v.contiguous() for k, v in untrained.state_dict().items()}, ckpt_root / "untrained.safetensors"
            )
        num_updates = tc.num_updates
        next_rollout_runs = _next_rollout_runs(tc, t_start)
        t_update = time.perf_counter()
        while ppo.update < num_updates and stop_reason is None:
            metrics = ppo.train_iteration(prefetch_next=next_rollout_runs)
            sink.record(ppo.global_step, impedance.observe(metrics))
            curve.append(
                {
                    k: metrics[k]
                    for k in (
                        "global_step",
                        "rollout/success_rate",
                        "rollout/episode_return",
                        "losses/approx_kl",
                        "adaptive/clip_range",
                    )
                    if k in metrics
                }
            )
            over_time = time.perf_counter() - t_start >= tc.budget_s
            is_last = ppo.update == num_updates or over_time
            new_best = evaluated = False
            if ppo.update % tc.eval_every_updates == 0 or is_last:
                result_eval = evaluate(validation, greedy, ppo.policy, tc.eval_episodes, eval_seed + 7)
                eval_metrics = result_eval.metrics("validation/")
                evals.append({"global_step": float(ppo.global_step), "update": float(ppo.update), **eval_metrics})
                new_best = tracker.add(ppo.update, result_eval.process_success_rate, result_eval.mean_return)
                sink.record(ppo.global_step, {**eval_metrics, "policy_convergence_flag": float(tracker.converged)})
                evaluated = True
            stop_reason = _stop_reason(tc, tracker, ppo.global_step, evaluated, over_time, ppo.update == num_updates)
            if manager.due(ppo.update) or new_best or stop_reason is not None:
                extra = {
                    "tracker": tracker.state_dict(),
                    "curve": curve,
                    "evals": evals,
                    "bc": bc_summary,
                    "stop_reason": stop_reason,
                }
                sink.flush()  # the metrics up to here in the store: a resumed run restarts after this checkpoint
                path = manager.save(ppo, best_metric=tracker.best_metric if evals else None, extra=extra)
                if new_best:
                    manager.mark_best(path)
            if on_update is not None:
                on_update(ppo.update, num_updates, metrics)
            update_sps.append(ppo.batch_size / max(time.perf_counter() - t_update, 1e-9))
            t_update = time.perf_counter()
        stop_reason = stop_reason or "step_budget"
        # the curves are final now: drawn while the test episodes play (the driver mostly waits on them)
        plot = resources.enter_context(ThreadPoolExecutor(1, thread_name_prefix="agentflow-plot")).submit(
            _plot_curves, curve, evals, out_dir / "plots" / "train_curves.png"
        )
        best_ckpt = load_intact(ckpt_root, BEST, tc.hidden_sizes, vocab)
        assert best_ckpt is not None
        best = best_ckpt.path
        best_policy = ActorCritic(vocab.obs_dim, vocab.n_actions, tc.hidden_sizes)
        best_policy.load_state_dict(best_ckpt.model)
        explorer = ActorSpec(EPSILON_GREEDY, tuple(tc.hidden_sizes), EXPLORATION_EPSILON)
        experts = tuple((family, process.expert(family)) for family in sorted({v.family for v in test}))
        final = {
            name: evaluate(test, actor, net, n_final, eval_seed + 11)
            for name, actor, net in (
                ("trained", greedy, best_policy),
                ("exploration", explorer, untrained),
                ("expert", ActorSpec(EXPERT, experts=experts), None),
            )
        }
        recovery = recovery_summary(pool)
    finally:
        resources.close()
    save_tensors({k: v.contiguous() for k, v in best_ckpt.model.items()}, out_dir / "policy.safetensors")
    summary: dict[str, Any] = {
        "policy_hash": policy_hash(best_policy),
        "best_checkpoint": best.name,
        "updates": ppo.update,
        "global_step": ppo.global_step,
        "train_variants": len(train_variants),
        "validation_variants": len(splits["validation"]),
        "test_variants": len(splits["test"]),
        "validation_process_success": tracker.best_metric,
        **_test_summary(final),
        "policy_convergence_flag": tracker.converged,
        "stop_reason": stop_reason,
        "stopped_on_convergence": stop_reason == "converged",
        "evaluations": len(evals),
        "bc": bc_summary,
        "pool": recovery,
        "worker_restarts": recovery["worker_restarts"],
        "steps_lost": recovery["steps_lost"],
        "worker_recovery_s": max((r["recovery_s"] for r in recovery["recoveries"]), default=0.0),
        "seed": seed,
        "offline": None if offline is None else {"actor": str(offline.path), **offline.settings},
        "warm_start": None
        if warm_start is None
        else {"checkpoint": str(warm_start), "policy_hash": policy_hash(untrained)},
        "wall_s": time.perf_counter() - t_start,
        "update_sps": update_sps,
        "ewc": {"used": False} if penalty is None else {"used": True, "file": str(ewc), **penalty.summary()},
        "reward_validator": validator is not None,
        "impedance": impedance.summary(),
        "tuning": tuning or {"applied": False, "reason": "run without the auto-tuner"},
    }
    gate = train_gate(cfg)
    verdict = evaluate_gate(gate, {k: v for k, v in summary.items() if isinstance(v, int | float)})
    summary.update(
        passed=verdict.passed,
        gate=verdict.message,
        message=f"{verdict.message}; stopped on {stop_reason} after {ppo.global_step} steps ({ppo.update} updates)",
        **budget_metrics("train", summary["wall_s"], tc.budget_s, ppo.global_step, gate.budget_steps),
    )
    write_json(
        out_dir / "policy.json",
        {
            "policy_hash": summary["policy_hash"],
            "hidden_sizes": list(tc.hidden_sizes),
            "vocab_version": vocab.version,
            "test_process_success": summary["test_process_success"],
            "test_payment_success": summary["test_payment_success"],
            "checkpoint": best.name,
        },
    )
    write_json(out_dir / "curve.json", {"curve": curve, "evals": evals})
    write_json(out_dir / "train_summary.json", summary)
    write_curve_csv(evals, out_dir / "validation_curve.csv")
    plot.result()
    if metrics_path is not None:
        write_json(metrics_path, train_metrics(summary))
    return summary


METRIC_KEYS = (
    "test_process_success",
    "test_payment_success",
    "test_return",
    "test_process_success_vs_exploration",
    "test_process_success_vs_expert",
    "test_payment_success_vs_exploration",
    "test_payment_success_vs_expert",
    "validation_process_success",
    "policy_convergence_flag",
    "stopped_on_convergence",
    "global_step",
    "updates",
)


def _test_summary(final: dict[str, EvalResult]) -> dict[str, Any]:
    """The test split's numbers: trained policy vs exploration and expert, both success measures."""
    trained, exploration, expert = final["trained"], final["exploration"], final["expert"]
    return {
        "test_process_success": trained.process_success_rate,
        "test_payment_success": trained.success_rate,
        "test_return": trained.mean_return,
        "test_process_success_exploration": exploration.process_success_rate,
        "test_process_success_expert": expert.process_success_rate,
        "test_payment_success_exploration": exploration.success_rate,
        "test_payment_success_expert": expert.success_rate,
        "test_process_success_vs_exploration": _ratio(trained.process_success_rate, exploration.process_success_rate),
        "test_process_success_vs_expert": _ratio(trained.process_success_rate, expert.process_success_rate),
        "test_payment_success_vs_exploration": _ratio(trained.success_rate, exploration.success_rate),
        "test_payment_success_vs_expert": _ratio(trained.success_rate, expert.success_rate),
        "test_process_success_by_family": trained.process_success_by_family,
        "test_payment_success_by_family": trained.success_by_family,
        "test": trained.to_dict(),
        "test_expert": expert.to_dict(),
        "test_metrics": trained.metrics("test/"),
    }


def train_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """``data/metrics/train.json`` (and the MLflow run's summary): headline numbers, then the test split's
    payment and process success per family and dimension value with their 95% Wilson bounds."""
    budget = {k: float(v) for k, v in summary.items() if k.startswith("budget/")}
    impedance = {k: float(v) for k, v in summary.get("impedance", {}).items()}
    return {k: float(summary[k]) for k in METRIC_KEYS} | summary["test_metrics"] | budget | impedance


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


def write_curve_csv(evals: list[dict[str, float]], path: Path) -> None:
    """Validation success/return per evaluation, the training curve ``dvc plots show`` draws."""
    lines = ["step,validation_process_success,validation_payment_success,validation_return"]
    lines += [
        f"{int(e['global_step'])},{e['validation/process_success_rate']:.6f},"
        f"{e['validation/success_rate']:.6f},{e['validation/mean_return']:.6f}"
        for e in evals
    ]
    write_text(path, "\n".join(lines) + "\n")


def load_checkpoint_untrained(ckpt_root: Path) -> dict[str, torch.Tensor]:
    """The initial (pre-BC, pre-PPO) weights: the exploration baseline is epsilon-greedy around them."""
    from safetensors.torch import load_file

    from agentflow_core.rl.checkpoint import CheckpointError

    try:
        return load_file(str(ckpt_root / "untrained.safetensors"))
    except Exception as exc:  # safetensors raises its own SafetensorError on damaged bytes
        raise CheckpointError(ckpt_root / "untrained.safetensors", f"{type(exc).__name__}: {exc}") from None


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")
