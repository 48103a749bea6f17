"""Typed, frozen configuration of one training cycle (the parsed form of ``params.yaml``).

One section per phase plus a shared ``base``. Parsing from YAML happens at the edge
(``tasks.config_io``); the library only ever sees these validated models. Unknown keys are
errors (``extra="forbid"``), every range is declared, and derived values are properties.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

PositiveInt = Annotated[int, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0.0, le=1.0)]
# Upper bounds that no run on one machine reaches; beyond them a typo would allocate, loop or wait forever.
MAX_ENVS = 4096
MAX_STEPS = 10**10
MAX_COUNT = 10**7
MAX_WIDTH = 4096
MAX_LAYERS = 8
MAX_TIMEOUT_S = 3600.0
MAX_VARIANTS = 10**6
EnvCount = Annotated[int, Field(gt=0, le=MAX_ENVS)]
StepCount = Annotated[int, Field(gt=0, le=MAX_STEPS)]
Count = Annotated[int, Field(gt=0, le=MAX_COUNT)]
Seed = Annotated[int, Field(ge=0, lt=2**32, description="numpy and torch seeds are 32-bit.")]
TimeoutS = Annotated[float, Field(gt=0.0, le=MAX_TIMEOUT_S)]
# A phase's wall-clock allotment (docs/design.md §2.2: the article's days become per-phase budgets); at most 30 days.
MAX_BUDGET_S = 30 * 24 * 3600.0
BudgetS = Annotated[
    float, Field(gt=0.0, le=MAX_BUDGET_S, description="Wall-clock seconds this phase is allotted (recorded vs used).")
]


class _Section(BaseModel):
    # Every float is finite: a NaN reward or an infinite timeout passes every range check and
    # surfaces hours later as an all-NaN policy or a hang.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RayConfig(_Section):
    """`base.ray`: where Ray runs and how much of the machine it may take."""

    address: str | None = Field(
        None, description="Ray cluster address; None starts a local Ray (RAY_ADDRESS overrides)."
    )
    num_cpus: Annotated[int, Field(gt=0, le=1024)] = 2
    include_dashboard: bool = False
    object_store_mb: Annotated[int, Field(ge=78, le=1 << 20)] = 512


class TrackingConfig(_Section):
    """`base.tracking`: where MLflow and Prefect keep runs, and the names runs and the champion go under."""

    mlflow_uri: str | None = Field(None, description="MLflow tracking URI; None means sqlite:///<state_dir>/mlflow.db.")
    experiment: str = "agentflow"
    registered_model: str = "agentflow-policy"
    prefect_api_url: str | None = Field(None, description="Prefect server; None uses the ephemeral API.")


class BaseSection(_Section):
    """`base`: what every phase shares: seed, run name, state and data directories, device, Ray and tracking."""

    seed: Seed = 0
    run_name: str = "demo"
    state_dir: str = Field(".agentflow", description="Prefect home, MLflow db, DVC remote, checkpoints live here.")
    data_dir: str = "data"
    env_config_dir: str = "configs/envs"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    ray: RayConfig = RayConfig()
    tracking: TrackingConfig = TrackingConfig()

    @field_validator("device")
    @classmethod
    def _device_present(cls, value: str) -> str:
        if value != "cuda":
            return value
        # Imported here, for "cuda" only: torch is heavy, and a command imports it when it needs it.
        import torch

        if not torch.cuda.is_available():
            raise ValueError("device 'cuda' but torch sees no CUDA GPU on this machine (use 'cpu' or 'auto')")
        return value


class CalibrateConfig(_Section):
    """`calibrate` (Phase 0): the sandbox gate a variant family must pass before training sees it."""

    variants_per_family: Annotated[int, Field(gt=0, le=10_000)] = 4
    resets: Count = 100
    max_reward_variance: Annotated[float, Field(gt=0.0)] = 0.05
    max_failed_fraction: Fraction = 0.2
    min_expert_success: Fraction = 0.9
    handled_outcomes: list[str] = ["user_blocked"]
    budget_s: BudgetS = 600.0


class RangeSpec(_Section):
    """A perturbation: uniform float range ``low..high``, integer range, or a list of choices."""

    kind: Literal["uniform", "int", "choice"]
    low: float | None = None
    high: float | None = None
    choices: list[Any] | None = None

    @model_validator(mode="after")
    def _check(self) -> RangeSpec:
        if self.kind in ("uniform", "int"):
            if self.low is None or self.high is None:
                raise ValueError(f"a {self.kind} perturbation needs both low and high")
            if self.low > self.high:
                raise ValueError(f"low ({self.low}) must not exceed high ({self.high})")
        elif not self.choices:
            raise ValueError("a choice perturbation needs a non-empty 'choices' list")
        return self


class SplitConfig(_Section):
    """Shares of the catalogue held out for validation (checkpoint choice) and test (reporting only)."""

    validation: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1
    test: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.1

    @model_validator(mode="after")
    def _train_left(self) -> SplitConfig:
        if self.validation + self.test >= 1.0:
            raise ValueError(f"validation + test ({self.validation} + {self.test}) must leave a train share (< 1)")
        return self


class VariantsConfig(_Section):
    """`variants`: the catalogue, dimensions (cartesian) x perturbations x samples, and its split."""

    base_envs: list[str] = ["web_checkout_v2", "order_db_v1", "payment_api_v1"]
    dimensions: dict[str, list[Any]] = {
        "start_stage": ["login", "product_detail", "checkout", "payment"],
        "user_tier": ["standard", "vip", "blocked"],
        "network": ["normal", "latency_500ms", "packet_loss_5%"],
    }
    perturbations: dict[str, RangeSpec] = {
        "price_factor": RangeSpec(kind="uniform", low=0.85, high=1.15),
        "inventory": RangeSpec(kind="int", low=0, high=100),
    }
    samples_per_combination: Annotated[int, Field(gt=0, le=100_000)] = 67
    split: SplitConfig = SplitConfig()
    budget_s: BudgetS = 120.0

    @field_validator("dimensions")
    @classmethod
    def _non_empty(cls, value: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for name, choices in value.items():
            if not choices:
                raise ValueError(f"dimension {name!r} has no values")
        return value

    @model_validator(mode="after")
    def _catalogue_size(self) -> VariantsConfig:
        size = len(self.base_envs) * self.samples_per_combination
        for choices in self.dimensions.values():
            size *= len(choices)
        if size > MAX_VARIANTS:
            raise ValueError(f"the catalogue would hold {size} variants, more than {MAX_VARIANTS}")
        return self


class PoolConfig(_Section):
    """`pool`: the Ray-backed env pool and its scheduler over the catalogue."""

    num_workers: Annotated[int, Field(ge=0, le=1024)] = 2
    backend: Literal["ray", "inprocess"] = Field(
        "ray",
        description=(
            "where env workers run: Ray actors ('ray') or this process ('inprocess'). "
            "Left out, it is 'ray' whenever num_workers > 0."
        ),
    )
    max_live_per_worker: EnvCount = 256
    step_timeout_s: TimeoutS = 5.0
    step_patience_s: TimeoutS | None = Field(
        None,
        description=(
            "a pool step waits this long for an env step, then goes on without it: the slot is left out "
            "of the next pool steps until its step returns (or is ended at step_timeout_s). Hangs then "
            "cost the other slots nothing, but which steps are late depends on timing, so a run is no "
            "longer bit-reproducible. A step busy on the CPU that long (its own thread's CPU clock) is "
            "ended as env_timeout instead. null (default): wait up to step_timeout_s (training's "
            "worker-side rollouts always wait)."
        ),
    )
    step_isolation: Literal["thread", "process"] = Field(
        "thread",
        description=(
            "inprocess backend only: 'process' hosts each env worker in a child process that is killed "
            "and replaced after a hung step (no thread outlives it); 'thread' steps envs in this process "
            "(a hung step is abandoned after step_timeout_s, its thread stays)."
        ),
    )
    quarantine_after: PositiveInt = 3
    max_worker_restarts: Annotated[
        int, Field(ge=0, le=10_000, description="Worker restarts allowed within any restart_window_s.")
    ] = 3
    restart_window_s: Annotated[
        float,
        Field(
            gt=0.0,
            le=30 * 24 * 3600.0,
            description="The window the restart budget counts over (a multi-day run "
            "that loses a worker now and then keeps going; a crash loop still stops it).",
        ),
    ] = 3600.0
    scheduler: Literal["uniform", "round_robin", "heat", "plr_coverage"] = "plr_coverage"
    heat_decay: Annotated[
        float, Field(gt=0.0, lt=1.0, description="docs/design.md §2.1: h <- decay*h + k each round (k: times drawn).")
    ] = 0.95
    cold_threshold: Annotated[float, Field(gt=0.0, description="a variant with heat below this is cold.")] = 0.3
    heat_cold_weight: Annotated[
        float, Field(ge=1.0, description="heat: weight of a cold variant (a warm one weighs 1).")
    ] = 20.0
    plr_temperature: Annotated[float, Field(gt=0.0, description="PLR beta: P_S ∝ (1/rank)^(1/beta).")] = 1.0
    plr_staleness_coef: Annotated[
        float, Field(ge=0.0, le=1.0, description="PLR rho: share of the staleness distribution.")
    ] = 0.3
    plr_token_coef: Annotated[float, Field(ge=0.0, le=1.0, description="share of the rare-semantic-token bonus.")] = 0.1
    plr_floor: Annotated[float, Field(gt=0.0, le=1.0, description="uniform share so no variant starves.")] = 0.05
    plr_score_ema: Annotated[
        float, Field(gt=0.0, le=1.0, description="EMA rate of a variant's learning-signal score.")
    ] = 0.5
    plr_max_staleness: Annotated[
        float, Field(ge=1.0, description="catalogue sweeps without a draw after which a variant is drawn first.")
    ] = 4.0

    @model_validator(mode="before")
    @classmethod
    def _default_backend(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("backend") is None:
            workers = data.get("num_workers", 2)
            return {**data, "backend": "inprocess" if isinstance(workers, int) and workers == 0 else "ray"}
        return data

    @model_validator(mode="after")
    def _plr_mix(self) -> PoolConfig:
        if self.backend == "ray" and self.num_workers == 0:
            raise ValueError("backend 'ray' needs num_workers >= 1 (or backend: inprocess)")
        if self.plr_staleness_coef + self.plr_token_coef > 1.0:
            raise ValueError(
                f"plr_staleness_coef + plr_token_coef must not exceed 1, got {self.plr_staleness_coef + self.plr_token_coef}"
            )
        return self


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


def _vocabulary(info: ValidationInfo) -> Any:
    """The selected process's vocabulary (``context={"vocabulary": ...}`` at load), else checkout's."""
    from agentflow_core.semantics import CHECKOUT

    return (info.context or {}).get("vocabulary", CHECKOUT)


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
    bc_warm_start: bool = True
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


def _checkout_only(enabled: bool, info: ValidationInfo) -> bool:
    """Refuse switching on a phase built on the checkout vocabulary under another process.

    The validation context carries the selected process's vocabulary only when it is not checkout
    (``tasks.config_io``).
    """
    if enabled and isinstance(info.context, dict) and info.context.get("vocabulary") is not None:
        raise ValueError("supported for process 'checkout' only (set it to false)")
    return enabled


class SimToRealConfig(_Section):
    """Sim-to-real validation in Phase 3: the policy on the real channels next to the simulated ones.

    Per family, the first ``episodes_per_family`` variants of the stress sample (test split) run once on
    the simulated channel and once on its real counterpart with the same seed (web_checkout: headless
    Chromium on the storefront web app; order_db: PostgreSQL through pgserver; payment_api: the HTTP
    server in a separately started process).
    """

    enabled: bool = False
    episodes_per_family: Annotated[int, Field(gt=0, le=1000)] = 16
    max_gap: Fraction = Field(
        0.02, description="Gate: sim minus real process success, per family, at most this (when enabled)."
    )
    families: list[Literal["web_checkout", "order_db", "payment_api"]] = ["web_checkout", "order_db", "payment_api"]
    env_config_dir: str = Field("configs/real_envs", description="Registry of the real-only envs (the browser).")

    @field_validator("enabled")
    @classmethod
    def _enabled_checkout_only(cls, enabled: bool, info: ValidationInfo) -> bool:
        return _checkout_only(enabled, info)


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

    @field_validator("enabled")
    @classmethod
    def _enabled_checkout_only(cls, enabled: bool, info: ValidationInfo) -> bool:
        return _checkout_only(enabled, info)


class StressConfig(_Section):
    """Phase 3 stress validation (agentflow_core.evaluation documents every measure)."""

    episodes: Count = 1000
    variants: Count = Field(720, description="Size of the stratified catalogue sample the episodes run on.")
    num_envs: EnvCount = 32
    consistency_variants: Count = 100
    consistency_target: Fraction = 0.82
    failure_reward_threshold: float = 5.0
    risk_threshold: Fraction = 0.3
    risk_penalty: Annotated[float, Field(ge=0.0)] = 1.0
    hacking_reward_threshold: float = 5.0
    coverage_group: str = Field(
        "network", description="Variant dimension that groups the coverage heatmap rows (with the family)."
    )
    long_tail_frequency: Fraction = Field(
        0.01, description="Tokens seen on fewer than this share of steps are long-tail."
    )
    min_robustness: Fraction = Field(0.8, description="Phase 3 gate: robustness_score must reach this.")
    max_crash_rate: Fraction = Field(0.0, description="Phase 3 gate: share of crashed episodes allowed.")
    sim_to_real: SimToRealConfig = SimToRealConfig()
    budget_s: BudgetS = 600.0


class ReportConfig(_Section):
    """Reports and the champion/challenger canary (docs/design.md §5.3)."""

    formats: list[Literal["md", "html", "json"]] = ["md", "html", "json"]
    champion_slice: Annotated[float, Field(gt=0.0, le=1.0)] = 0.1
    champion_episodes: Count = Field(200, description="Episodes per policy on the champion slice.")
    promote_min_consistency: Fraction = 0.85
    promote_min_reward_gain: float = 0.05
    budget_s: BudgetS = 300.0


class ValidatorConfig(_Section):
    """`validator`: the discriminator reward validator (docs/design-003.md §3.2, ``agentflow_core.evaluation.validator``).

    Trained after exploration to tell the expert's steps from a near-uniform policy's at the same
    states; an episode whose mean authenticity is below ``threshold`` is suspicious. Training pays
    the positive rewards of suspicious episodes times ``suspicious_weight``; stress and the report
    flag them.
    """

    enabled: bool = True
    hidden: Annotated[int, Field(gt=0, le=MAX_WIDTH)] = 64
    epochs: Annotated[int, Field(gt=0, le=1000)] = 30
    max_samples: Count = 50_000
    threshold: Fraction = Field(0.5, description="Episodes with mean authenticity below this are suspicious.")
    suspicious_weight: Fraction = Field(0.1, description="Factor on the positive rewards of suspicious episodes.")
    min_heldout_accuracy: Fraction = Field(
        0.8, description="Gate: expert-vs-policy accuracy of the discriminator on 10% held-out states."
    )
    budget_s: BudgetS = 60.0

    @field_validator("enabled")
    @classmethod
    def _enabled_checkout_only(cls, enabled: bool, info: ValidationInfo) -> bool:
        return _checkout_only(enabled, info)


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

    @field_validator("enabled")
    @classmethod
    def _enabled_checkout_only(cls, enabled: bool, info: ValidationInfo) -> bool:
        return _checkout_only(enabled, info)


class AgentFlowConfig(_Section):
    """The whole of ``params.yaml``."""

    process: str = Field(
        "checkout",
        pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$",
        description="The business process: configs/processes/<process>.yaml (agentflow_core/process.py).",
    )
    base: BaseSection = BaseSection()
    calibrate: CalibrateConfig = CalibrateConfig()
    variants: VariantsConfig = VariantsConfig()
    pool: PoolConfig = PoolConfig()
    explore: ExploreConfig = ExploreConfig()
    offline: OfflineConfig = OfflineConfig()
    train: TrainConfig = TrainConfig()
    stress: StressConfig = StressConfig()
    report: ReportConfig = ReportConfig()
    validator: ValidatorConfig = ValidatorConfig()
    tune: TuneConfig = TuneConfig()

    @model_validator(mode="before")
    @classmethod
    def _checkout_only_phases_default_off(cls, data: Any) -> Any:
        # the offline stage, the reward validator, the auto-tuner and sim-to-real read the checkout
        # vocabulary's widths (agentflow_core/rl/cql.py, evaluation/validator.py, tasks/steps/tune.py):
        # for another process they default to off (switching one on is refused by _checkout_only)
        if not isinstance(data, dict) or data.get("process", "checkout") == "checkout":
            return data
        data = dict(data)
        if isinstance(data.get("stress"), dict):
            data["stress"] = dict(data["stress"])
        for owner, key in ((data, "offline"), (data, "validator"), (data, "tune"), (data.get("stress"), "sim_to_real")):
            section = owner.get(key) if isinstance(owner, dict) else None
            if isinstance(owner, dict) and (section is None or isinstance(section, dict)):
                owner[key] = {"enabled": False, **(section or {})}
        return data

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases in the order the cycle runs them."""
        return ("calibrate", "variants", "explore", "offline", "train", "stress", "report")
