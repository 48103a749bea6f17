"""Config of the learning phases: exploration, the reward, PPO training, the offline stage, the auto-tuner."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from agentflow_core.config.base import (
    MAX_COUNT,
    MAX_ENVS,
    MAX_LAYERS,
    MAX_STEPS,
    MAX_WIDTH,
    BudgetS,
    Count,
    EnvCount,
    Fraction,
    PositiveInt,
    StepCount,
    TimeoutS,
    _Section,
    _vocabulary,
)


class CoverageRemediation(_Section):
    """What exploration does while ``state_coverage_ratio`` is below the gate after ``total_steps``."""

    max_steps: Annotated[
        int, Field(ge=0, le=MAX_STEPS, description="Extra env steps allowed for remediation (0: none).")
    ] = 20_000
    epsilon: Fraction = Field(1.0, description="Exploration rate during remediation (raised, not scheduled).")


class ExploreConfig(_Section):
    """`explore` (Phase 1): coverage-driven exploration that writes the trajectory dataset."""

    behaviour: Literal["policy", "expert"] = Field(
        "expert",
        description=(
            "What ε-greedy explores around: the scripted expert (the existing rule-based process: its "
            "goal-reaching episodes make a useful behaviour-cloning warm start) or the current policy "
            "(the network PPO starts from)."
        ),
    )
    total_steps: StepCount = 20_000
    num_envs: EnvCount = 32
    coverage_low: Fraction = 0.8
    coverage_high: Fraction = 0.9
    epsilon_high: Fraction = 0.95
    epsilon_mid: Fraction = 0.3
    epsilon_low: Fraction = 0.1
    shard_rows: Count = 50_000
    reference_pool_steps: Annotated[
        int,
        Field(
            ge=0,
            le=MAX_COUNT,
            description="Pool steps of the scripted expert whose transitions are the edge-coverage reference.",
        ),
    ] = 60
    min_state_coverage: Fraction = Field(0.92, description="Phase 1 gate (docs/design.md §2.2: the article's 92%).")
    remediation: CoverageRemediation = CoverageRemediation()
    budget_s: BudgetS = 300.0

    @model_validator(mode="after")
    def _order(self) -> ExploreConfig:
        if not self.coverage_low < self.coverage_high:
            raise ValueError(f"coverage_low ({self.coverage_low}) must be below coverage_high ({self.coverage_high})")
        if not self.epsilon_low <= self.epsilon_mid <= self.epsilon_high:
            raise ValueError(
                f"expected epsilon_low ({self.epsilon_low}) <= epsilon_mid ({self.epsilon_mid}) <= epsilon_high ({self.epsilon_high})"
            )
        return self


class ShapingTerm(_Section):
    """One auxiliary reward: ``weight * reward`` paid the first time ``condition`` holds in an episode."""

    condition: str = Field(description="Safe expression over token and feature names (agentflow_core.safe_expr).")
    reward: float
    weight: float = 1.0

    @field_validator("condition")
    @classmethod
    def _compiles(cls, value: str, info: ValidationInfo) -> str:
        # Imported here: the rl package may pull in torch, and a bad condition must fail at config load.
        from agentflow_core.safe_expr import UnsafeExpressionError, compile_condition

        vocabulary = _vocabulary(info)
        try:
            compile_condition(value, (*vocabulary.tokens, *vocabulary.features))
        except UnsafeExpressionError as exc:
            raise ValueError(f"shaping condition {value!r} rejected: {exc.reason}") from None
        return value


class RewardConfig(_Section):
    """How the training reward is computed (agentflow_core.rl.reward documents the semantics)."""

    mode: Literal["scalar", "token_table", "model"] = "token_table"
    token_rewards: dict[str, float] = {"PAYMENT_SUCCESS": 10.0}
    # the env's business reward (escalation, cancellation, step costs) added to a token/model base
    env_reward_weight: Annotated[float, Field(ge=0.0, le=1e3)] = 0.0
    # SafetyWrapper-style risk term in training: each step with risk > risk_threshold costs risk_penalty
    risk_penalty: Annotated[float, Field(ge=0.0, le=1e3)] = 0.0
    risk_threshold: Annotated[float, Field(ge=0.0, le=1.0)] = 0.3
    shaping: list[ShapingTerm] = []
    auto_shaping: bool = Field(
        False,
        description="Add shaping terms for the key states mined from the exploration data (agentflow_core.rl.key_states).",
    )
    auto_shaping_weight: Annotated[float, Field(gt=0.0, le=10.0)] = Field(
        0.2, description="A mined term pays weight x lift x the mean return of the episodes that reached their outcome."
    )
    model_url: str | None = None
    model_timeout_s: TimeoutS = 0.5
    normalize: bool = True

    @field_validator("token_rewards")
    @classmethod
    def _known_tokens(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        vocabulary = _vocabulary(info)
        unknown = sorted(set(value) - set(vocabulary.tokens))
        if unknown:
            where = "semantics.TOKENS" if info.context is None else f"the process's tokens {list(vocabulary.tokens)}"
            raise ValueError(f"token_rewards: unknown token(s) {unknown}; expected names from {where}")
        return value

    @model_validator(mode="after")
    def _model_url(self) -> RewardConfig:
        if self.mode == "model" and not self.model_url:
            raise ValueError("reward mode 'model' needs model_url (the reward-model service's base URL)")
        return self


class TrainGate(_Section):
    """Phase 2's stop rule and exit gate."""

    stop_on_convergence: bool = Field(
        True, description="Stop at the first evaluation where policy_convergence_flag holds (else at total_steps)."
    )
    min_steps: Annotated[
        int, Field(ge=0, le=MAX_STEPS, description="No convergence stop before this many env steps.")
    ] = 0
    require_convergence: bool = Field(False, description="Fail the gate when the budget ends before convergence.")
    min_validation_process_success: Fraction = Field(
        0.5, description="The best checkpoint's validation process success must reach this."
    )


class EWCConfig(_Section):
    """`train.ewc`: elastic weight consolidation in retrains (Kirkpatrick et al. 2017, docs/design-003.md §5.2).

    A retrain adds ``lam / 2 * sum_i F_i (theta_i - theta*_i)^2`` to PPO's loss: ``theta*`` the
    champion's weights, ``F`` the diagonal Fisher information of the champion's policy on its data
    (``agentflow_core.rl.ewc``). A fresh cycle has no champion and trains without it.
    """

    enabled: bool = True
    lam: Annotated[float, Field(ge=0.0, le=1e9)] = Field(
        100.0, description="EWC strength lambda (the penalty is lam/2 * sum F (theta - theta*)^2)."
    )
    samples: Annotated[int, Field(gt=0, le=1_000_000)] = Field(
        4096, description="States of the champion's data the Fisher information is averaged over."
    )


class TrainConfig(_Section):
    """PPO (CleanRL names). The learner's batch is one rollout, ``num_envs`` x ``n_steps`` transitions
    (CleanRL derives it the same way), cut into minibatches of ``minibatch_size``. Episode length is
    the envs' own (``max_episode_steps`` of each variant's scenario), not a training setting."""

    total_steps: StepCount = 200_000
    num_envs: EnvCount = 32
    n_steps: Annotated[int, Field(gt=0, le=100_000)] = 64
    learning_rate: Annotated[float, Field(gt=0.0, lt=1.0)] = 3e-4
    gamma: Annotated[float, Field(gt=0.0, le=1.0)] = 0.99
    gae_lambda: Annotated[float, Field(ge=0.0, le=1.0)] = 0.95
    clip_range: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.08
    ent_coef: Annotated[float, Field(ge=0.0)] = 0.01
    vf_coef: Annotated[float, Field(ge=0.0)] = 0.5
    max_grad_norm: Annotated[float, Field(gt=0.0)] = 0.5
    n_epochs: Annotated[int, Field(gt=0, le=1000)] = 10
    minibatch_size: Count = 512
    target_kl: Annotated[float, Field(gt=0.0)] = 0.015
    kl_check_every: PositiveInt = 5  # PPO updates between adaptive clip/KL checks
    hidden_sizes: Annotated[
        list[Annotated[int, Field(gt=0, le=MAX_WIDTH)]], Field(min_length=1, max_length=MAX_LAYERS)
    ] = [64, 64]
    checkpoint_every_updates: PositiveInt = 10
    checkpoint_every_minutes: Annotated[float, Field(gt=0.0, le=7 * 24 * 60.0)] = 120.0
    eval_every_updates: PositiveInt = 10
    eval_episodes: Count = 64
    bc_warm_start: bool = Field(
        True,
        description="PPO starts from the rules' logs: the offline stage's BC+CQL actor (with its KL term) where "
        "the stage ran, else behaviour cloning; false: from a fresh network, the offline actors still played on "
        "the test split as references.",
    )
    reward: RewardConfig = RewardConfig()
    gate: TrainGate = TrainGate()
    budget_s: BudgetS = 1800.0
    ewc: EWCConfig = EWCConfig()

    @model_validator(mode="after")
    def _batches(self) -> TrainConfig:
        batch = self.num_envs * self.n_steps
        if self.minibatch_size > batch or batch % self.minibatch_size:
            raise ValueError(
                f"minibatch_size ({self.minibatch_size}) must divide the rollout batch num_envs x n_steps ({batch})"
            )
        return self

    @property
    def num_updates(self) -> int:
        """Rollout/update iterations needed to reach ``total_steps`` (rounded up)."""
        return -(-self.total_steps // (self.num_envs * self.n_steps))


class OfflineReplay(_Section):
    """Prioritized replay of the offline stage (docs/design-003.md §4.1): ``p = (|td| + eps)^alpha * decay^age``."""

    prioritized: bool = Field(True, description="False: uniform draws (no IS weights).")
    alpha: Annotated[float, Field(ge=0.0, le=1.0, description="Priority exponent (0: uniform in TD error).")] = 0.6
    beta: Annotated[float, Field(ge=0.0, le=1.0, description="Importance-sampling exponent (1: full correction).")] = (
        0.4
    )
    freshness_decay: Annotated[
        float, Field(gt=0.0, le=1.0, description="Priority factor per cycle of age (1: no freshness preference).")
    ] = 0.5


class OfflineGate(_Section):
    """The offline stage's exit gate, on the validation split (greedy episodes in the envs)."""

    min_validation_process_success: Fraction = Field(
        0.5, description="The BC+CQL actor's validation process success must reach this."
    )
    max_regression_vs_bc: Fraction = Field(
        0.05, description="...and fall at most this far below the BC actor's on the same episodes."
    )


class OfflineConfig(_Section):
    """`offline` (Phase 1b): discrete CQL on the trajectory dataset between BC and PPO (docs/design-003.md §5.2).

    BC clones the successful episodes, CQL fits a conservative Q on every train-split transition,
    the actor moves toward ``pi_BC · exp(Q/temperature)``, and PPO starts from that actor with a
    ``KL(pi || pi_offline)`` term whose weight decays from ``kl_coef`` to 0 over ``kl_decay_updates``.
    """

    enabled: bool = True
    gradient_steps: Annotated[int, Field(gt=0, le=MAX_COUNT)] = 1500
    batch_size: Annotated[int, Field(gt=0, le=65_536)] = 256
    learning_rate: Annotated[float, Field(gt=0.0, lt=1.0)] = 1e-3
    alpha: Annotated[float, Field(ge=0.0, le=100.0, description="Weight of the CQL penalty (0: plain DQN).")] = 1.0
    target_update_every: Annotated[int, Field(gt=0, le=MAX_COUNT)] = 100
    heldout_share: Annotated[float, Field(ge=0.0, lt=1.0, description="Episodes held out for TD diagnostics.")] = 0.1
    temperature: Annotated[
        float, Field(gt=0.0, le=100.0, description="Improved actor ∝ pi_BC · exp(Q / temperature).")
    ] = 0.1
    improve_steps: Annotated[int, Field(ge=0, le=MAX_COUNT, description="Actor steps toward pi_BC · exp(Q / T).")] = 300
    kl_coef: Annotated[float, Field(ge=0.0, le=100.0, description="PPO's KL(pi || pi_offline) weight at update 0.")] = (
        0.1
    )
    kl_decay_updates: Annotated[int, Field(gt=0, le=MAX_COUNT, description="Updates until that weight is 0.")] = 20
    eval_episodes: Count = 64
    replay: OfflineReplay = OfflineReplay()
    gate: OfflineGate = OfflineGate()
    budget_s: BudgetS = 120.0


class TuneConfig(_Section):
    """`tune`: the impedance-matching auto-tuner before train (docs/design.md §7.1; agentflow_core.tuning)."""

    enabled: bool = Field(
        False,
        description="Run the probe and train with its choice (data/tuning/choice.json); off: the static settings.",
    )
    env_inference_ratio: Annotated[float, Field(gt=0.0, le=100.0)] = 1.2
    production_consumption_ratio: Annotated[float, Field(gt=0.0, le=100.0)] = 1.5
    envs_per_worker: Annotated[
        list[Annotated[int, Field(gt=0, le=MAX_ENVS)]],
        Field(min_length=1, max_length=8, description="Envs-per-worker candidates the probe times."),
    ] = [16, 32, 64, 128]
    probe_steps: Annotated[
        int, Field(gt=0, le=1000, description="Pool steps timed per candidate (fastest of 3 interleaved rollouts).")
    ] = 16
    max_workers: Annotated[int, Field(gt=0, le=1024)] = 64
    max_num_envs: EnvCount = 256
    goals_per_update: Annotated[int, Field(gt=0, le=1000, description="Goal events per slot between updates.")] = 4
    max_n_steps: Annotated[int, Field(gt=0, le=100_000)] = 256
    min_epochs: Annotated[int, Field(gt=0, le=1000)] = 4
    budget_s: BudgetS = 20.0
