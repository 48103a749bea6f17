"""What a training run holds while it trains: its setup, the loop's state, the best policy's evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentflow_core.config import TrainConfig
from agentflow_core.evaluation.policy_eval import EvalResult, summarise_episodes
from agentflow_core.pool.episodes import ActorSpec
from agentflow_core.pool.rollout import SlicedRollouts
from agentflow_core.rl.checkpoint import Checkpoint, CheckpointManager
from agentflow_core.rl.convergence import ConvergenceTracker
from agentflow_core.rl.ewc import EWCPenalty
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.rl.ppo import PPO, MetricsSink
from agentflow_core.semantics import Vocabulary
from agentflow_core.tuning import ImpedanceMeter
from agentflow_core.variants import VariantSpec
from tasks.context import PhaseContext
from tasks.steps.evaluation import EVAL_NUM_ENVS
from tasks.steps.offline import OfflineStart


@dataclass
class TrainingRun:
    """What one training run works with, built once before its first update (:func:`open_training`)."""

    ctx: PhaseContext
    out_dir: Path
    seed: int
    sink: MetricsSink
    splits: dict[str, list[VariantSpec]]
    validation: list[VariantSpec]
    test: list[VariantSpec]
    policy: ActorCritic
    untrained: ActorCritic
    pool: SlicedRollouts
    ppo: PPO
    penalty: EWCPenalty | None
    validator: Any
    offline: OfflineStart | None
    impedance: ImpedanceMeter
    manager: CheckpointManager

    @property
    def tc(self) -> TrainConfig:
        """The training settings."""
        return self.ctx.cfg.train

    @property
    def vocab(self) -> Vocabulary:
        """The process's vocabulary: the network's widths."""
        return self.ctx.vocabulary

    @property
    def ckpt_root(self) -> Path:
        """Where the checkpoints go."""
        return self.out_dir / "checkpoints"

    def evaluate(
        self, variants: list[VariantSpec], actor: ActorSpec, net: ActorCritic | None, n: int, episodes_seed: int
    ) -> EvalResult:
        """``n`` episodes of ``actor`` over ``variants`` on the training pool's env workers, summarised."""
        envs = min(self.tc.num_envs, EVAL_NUM_ENVS, max(len(variants), 1))
        records = self.pool.evaluate(variants, actor, net, n, episodes_seed, envs)
        return summarise_episodes(records, variants, sorted(self.ctx.cfg.variants.dimensions), vocabulary=self.vocab)


@dataclass
class TrainingState:
    """What the training loop accumulates; all of it but the throughput goes into every checkpoint."""

    tracker: ConvergenceTracker = field(default_factory=ConvergenceTracker)
    curve: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    bc_summary: dict[str, Any] = field(default_factory=lambda: {"used": False})
    # this process's throughput per update, its steps over the time since the previous update ended
    # (the rollout, the update and what the loop does with it: evaluations, checkpoints, logging);
    # timing, so not in checkpoints
    update_sps: list[float] = field(default_factory=list)
    stop_reason: str | None = None  # converged | step_budget | time_budget, whichever came first

    def extra(self) -> dict[str, Any]:
        """The checkpoint's ``extra``: what a resumed run restores."""
        return {
            "tracker": self.tracker.state_dict(),
            "curve": self.curve,
            "evals": self.evals,
            "bc": self.bc_summary,
            "stop_reason": self.stop_reason,
        }


@dataclass(frozen=True)
class FinalPolicy:
    """The best checkpoint and its test-split evaluations against the exploration policy and the expert."""

    checkpoint: Checkpoint
    policy: ActorCritic
    final: dict[str, EvalResult]
    recovery: dict[str, Any]
