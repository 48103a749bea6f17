"""The shapes that cross the core's layers: the env pool and its batch, a rollout source and its slice,
the learner's reward and metrics seams, a registered env as the mapping audit reads it, failure reasons.

This module is the ground floor (in the spirit of Stable-Baselines3's ``type_aliases.py``): it
imports nothing from the project but the vocabulary's type (``semantics``, the other ground-floor
module), and ``adapters/``, ``rl/``, ``pool/`` and ``evaluation/`` type their seams with it, so
mypy checks the contract between the learner and whatever steps its envs
(:class:`~agentflow_core.pool.inprocess.InProcessPool` or
:class:`~agentflow_core.pool.ray_pool.RayPool`) without a layer importing the one above it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from agentflow_core.semantics import Vocabulary

# failure_reason values the pool itself assigns (the channel assigns max_steps, user_blocked, ...).
ENV_CRASH = "env_crash"
ENV_TIMEOUT = "env_timeout"
ENV_INVALID = "env_invalid"
WORKER_LOST = "worker_lost"
POOL_FAILURES: frozenset[str] = frozenset({ENV_CRASH, ENV_TIMEOUT, ENV_INVALID, WORKER_LOST})
# A worker's row for a slot whose step has not returned yet (the pool step went on without it); never
# an episode's end: the driver turns it into a paused row (``PoolBatch.pending``).
STEP_PENDING = "step_pending"

PolicyT_contra = TypeVar("PolicyT_contra", contravariant=True)

PolicyFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""A batched policy: ``(obs [N, OBS_DIM], action_mask [N, N_ACTIONS]) -> actions [N]``."""


class VariantLike(Protocol):
    """What a pool needs of a variant spec (``agentflow_core.variants.VariantSpec`` satisfies it)."""

    @property
    def env_id(self) -> str:
        """Unique id of the variant (``<family>_v<version>...``); the key of per-env statistics."""

    @property
    def base_env_id(self) -> str:
        """The registry entry the variant perturbs: variants of one base env can share an idle env."""

    @property
    def family(self) -> str:
        """The business family (channel) the variant belongs to; reports and PLR group by it."""

    @property
    def params(self) -> Mapping[str, Any]:
        """The scenario overrides that make this variant; the base entry's scenario is built from them."""

    @property
    def content_hash(self) -> str:
        """Hash of the variant's definition: an episode record names the exact variant it played."""


@dataclass
class PoolBatch:
    """One step of every slot, with explicit SAME_STEP autoreset (Gymnasium's ``AutoresetMode.SAME_STEP``).

    When a slot's episode ends, ``obs`` already holds the first observation of the slot's next
    episode and ``final_obs`` keeps the last observation of the finished one (for bootstrapping on
    truncation). ``infos[i]`` describes the step slot ``i`` just took: env_id, variant_index,
    variant_hash, step_id, failure_reason, tokens, risk; at episode end also episode_return,
    episode_length, success and ``next_env_id`` / ``next_variant_index`` / ``next_episode_seed``
    naming the episode whose first observation is in ``obs[i]``. After ``reset`` each info also
    carries ``episode_seed``: (variant, episode seed) replays any episode exactly.

    ``pending[i]`` (None: no slot pending) marks a slot whose step had not returned when the pool
    step ended (``pool.step_patience_s``): its row repeats the last observation with no reward and no
    end, no transition happened, and the action given for it is ignored until the step returns. The
    row of the step where it returns is the outcome of the action it was given when it went pending,
    named by ``infos[i]["action"]``.
    """

    obs: np.ndarray
    action_mask: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    infos: list[dict[str, Any]]
    pending: np.ndarray | None = None

    @property
    def done(self) -> np.ndarray:
        """Slots whose episode ended this step, by termination or truncation."""
        return self.terminated | self.truncated


class StatefulScheduler(Protocol):
    """The part of a pool's scheduler that checkpoints see (bit-identical resume)."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-able scheduler state; loading it back makes the next draws bit-identical."""

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` taken from a scheduler of the same strategy and catalogue."""


class EnvPool(Protocol):
    """``num_envs`` semantic envs stepped as one batch over a catalogue of variants.

    ``variants[info["variant_index"]]`` is the variant a slot played. ``set_value_loss`` is the
    learner's feedback to a prioritised scheduler (PLR); ``feedback_state`` / ``load_feedback_state``
    carry the pending feedback through a checkpoint. ``stats`` returns counters (steps, episodes,
    failures by reason, worker restarts, quarantined variants).
    """

    num_envs: int
    vocabulary: Vocabulary  # the process the pool's envs speak: observation widths, tokens, actions

    @property
    def variants(self) -> Sequence[VariantLike]:
        """The catalogue the pool schedules from, indexed by ``info["variant_index"]``."""

    @property
    def scheduler(self) -> StatefulScheduler:
        """The scheduler picking each slot's next variant; checkpoints save its state."""

    def reset(self, seed: int) -> PoolBatch:
        """Start an episode in every slot; the same ``seed`` replays the same variants and episode seeds."""

    def step(self, actions: np.ndarray, active: np.ndarray | None = None) -> PoolBatch:
        """Step the slots where ``active`` is true (all by default); the others repeat their observation, unrewarded."""

    def slot_variants(self) -> np.ndarray:
        """The catalogue index each slot is playing now (the episode in ``obs``)."""

    def set_value_loss(
        self, variant_indices: Sequence[int] | np.ndarray, value_loss: Sequence[float] | np.ndarray
    ) -> None:
        """Feed the learner's value loss per variant to the scheduler (PLR's learning-potential score)."""

    def feedback_state(self) -> list[float | None]:
        """Feedback received but not yet applied, per variant, so a checkpoint can carry it."""

    def load_feedback_state(self, state: Sequence[float | None]) -> None:
        """Restore pending feedback saved by :meth:`feedback_state`."""

    def stats(self) -> dict[str, Any]:
        """Counters for logs and tests: steps, episodes, failures by reason, worker restarts, quarantined variants."""

    def close(self) -> None:
        """Release the envs and the workers that host them."""


@dataclass
class RolloutSlice:
    """``n_steps`` x ``k`` slots of transitions, in SAME_STEP autoreset layout (row ``t`` = step ``t``).

    What a :class:`RolloutSource` hands the learner: the pool's workers fill it, ``rl`` learns from it.

    ``obs[t]``/``masks[t]`` is what the policy saw; ``rewards`` are the env's own rewards (the
    training reward is applied afterwards, in step order, by the learner); ``final_obs[t]`` is the
    last observation of an episode that ended at ``t``; ``last_obs``/``last_masks`` follow the
    last step (the bootstrap value's input). ``variant_index`` is the catalogue index of the
    episode that took step ``t``; ``episode_*`` hold the pool's episode stats where it ended.
    """

    obs: np.ndarray  # [T, k, OBS_DIM] float32
    masks: np.ndarray  # [T, k, N_ACTIONS] bool
    actions: np.ndarray  # [T, k] int64
    logprobs: np.ndarray  # [T, k] float32
    values: np.ndarray  # [T, k] float32
    rewards: np.ndarray  # [T, k] float32
    terminated: np.ndarray  # [T, k] bool
    truncated: np.ndarray  # [T, k] bool
    final_obs: np.ndarray  # [T, k, OBS_DIM] float32
    variant_index: np.ndarray  # [T, k] int64
    risk: np.ndarray  # [T, k] float32
    episode_return: np.ndarray  # [T, k] float64, NaN where no episode ended
    episode_length: np.ndarray  # [T, k] int64
    success: np.ndarray  # [T, k] bool
    last_obs: np.ndarray  # [k, OBS_DIM] float32
    last_masks: np.ndarray  # [k, N_ACTIONS] bool

    @classmethod
    def empty(cls, n_steps: int, k: int, obs_dim: int, n_actions: int) -> RolloutSlice:
        """Zeroed arrays for ``n_steps`` x ``k`` slots."""
        shape = (n_steps, k)
        return cls(
            obs=np.zeros((*shape, obs_dim), np.float32),
            masks=np.zeros((*shape, n_actions), bool),
            actions=np.zeros(shape, np.int64),
            logprobs=np.zeros(shape, np.float32),
            values=np.zeros(shape, np.float32),
            rewards=np.zeros(shape, np.float32),
            terminated=np.zeros(shape, bool),
            truncated=np.zeros(shape, bool),
            final_obs=np.zeros((*shape, obs_dim), np.float32),
            variant_index=np.full(shape, -1, np.int64),
            risk=np.zeros(shape, np.float32),
            episode_return=np.full(shape, np.nan),
            episode_length=np.zeros(shape, np.int64),
            success=np.zeros(shape, bool),
            last_obs=np.zeros((k, obs_dim), np.float32),
            last_masks=np.ones((k, n_actions), bool),
        )

    @classmethod
    def concatenate(cls, parts: Sequence[RolloutSlice]) -> RolloutSlice:
        """The slices side by side (slot axis), in the given order."""
        if len(parts) == 1:
            return parts[0]
        names = cls.__dataclass_fields__
        return cls(
            **{n: np.concatenate([getattr(p, n) for p in parts], axis=0 if n.startswith("last_") else 1) for n in names}
        )

    @property
    def done(self) -> np.ndarray:
        """[T, k]: the step ended its episode (terminated or truncated)."""
        return self.terminated | self.truncated

    def reset_batch(self) -> PoolBatch:
        """The pool's reset batch of this rollout (what a reward's per-episode state starts from)."""
        k = self.obs.shape[1]
        zeros = np.zeros(k, bool)
        infos = [{"variant_index": int(v)} for v in self.variant_index[0].tolist()]
        return PoolBatch(self.obs[0], self.masks[0], np.zeros(k, np.float32), zeros, zeros, self.obs[0], infos)

    def step_batch(self, t: int) -> PoolBatch:
        """Pool step ``t`` as :class:`PoolBatch` with the infos a training reward reads (variant, risk)."""
        last = t + 1 == self.obs.shape[0]
        obs = self.last_obs if last else self.obs[t + 1]
        masks = self.last_masks if last else self.masks[t + 1]
        infos = [
            {"variant_index": v, "risk": r}
            for v, r in zip(self.variant_index[t].tolist(), self.risk[t].tolist(), strict=True)
        ]
        return PoolBatch(obs, masks, self.rewards[t], self.terminated[t], self.truncated[t], self.final_obs[t], infos)


@runtime_checkable
class RolloutSource(Protocol[PolicyT_contra]):
    """Where a learner's rollouts come from: ``n_steps`` x ``num_envs`` transitions per call, from a given policy.

    Two sources exist: worker-side slices (``agentflow_core.pool.rollout.SlicedRollouts``: each env
    worker runs its own slots for the whole rollout with a copy of the policy) and any
    :class:`EnvPool` stepped from the learner's process (``agentflow_core.rl.rollout.CentralRollouts``).
    The learner types its seam with this protocol rather than with the union of the two, so ``rl``
    imports nothing from ``pool``. Generic in the policy it runs (``ActorCritic`` in practice): the
    ground floor does not import the network.
    """

    num_envs: int
    rollout_started_at: float  # perf_counter when the last rollout collected began (a prefetched one: when sent)

    @property
    def variants(self) -> Sequence[VariantLike]:
        """The catalogue, indexed by the slices' ``variant_index``."""

    @property
    def scheduler(self) -> StatefulScheduler:
        """The scheduler(s) picking each slot's next variant, checkpointed as one."""

    def prefetch(self, policy: PolicyT_contra, n_steps: int, seed: int, update: int) -> None:
        """Start the rollout :meth:`collect` will ask for with these arguments now, where a source can."""

    def collect(self, policy: PolicyT_contra, n_steps: int, seed: int, update: int) -> list[RolloutSlice]:
        """One rollout of every slot, in slot order; a pure function of (weights, seed, update, scheduler state)."""

    def set_value_loss(
        self, variant_indices: Sequence[int] | np.ndarray, value_loss: Sequence[float] | np.ndarray
    ) -> None:
        """Feed the learner's value loss per variant to the scheduler (PLR's learning-potential score)."""

    def feedback_state(self) -> list[float | None]:
        """Feedback received but not yet applied, per variant, so a checkpoint can carry it."""

    def load_feedback_state(self, state: Sequence[float | None]) -> None:
        """Restore pending feedback saved by :meth:`feedback_state`."""


@runtime_checkable
class MetricsSink(Protocol):
    """Where diagnostics go (MLflow, a progress bar, a list in a test); the core never prints."""

    def record(self, step: int, metrics: dict[str, float]) -> None:
        """Take the diagnostics of one update, keyed by name; ``step`` is the env steps so far."""

    def flush(self) -> None:
        """Make what was recorded durable: the trainer calls it before each checkpoint, the point a resumed
        run restarts from (a sink that writes in the background waits here)."""


@runtime_checkable
class RewardTransform(Protocol):
    """Maps a pool step's env rewards to training rewards (reward function + per-env normaliser)."""

    def reset(self, batch: PoolBatch) -> None:
        """Start of new episodes: reset per-episode reward state (tokens already paid, shaping terms fired)."""

    def __call__(self, batch: PoolBatch) -> np.ndarray:
        """Training reward per slot for this pool step."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to resume with the same reward scale."""

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    def metrics(self) -> dict[str, float]:
        """Reward diagnostics since the last call; reading them starts a new window."""


@runtime_checkable
class RewardValidatorHook(Protocol):
    """Scales the training rewards of episodes a reward validator finds suspicious (docs/design-003.md §3.2)."""

    def reweight(self, obs: np.ndarray, actions: np.ndarray, done: np.ndarray, rewards: np.ndarray) -> np.ndarray:
        """Rewards ``[n_steps, num_envs]`` after down-weighting; episodes are cut at ``done`` in each slot's column."""

    def metrics(self) -> dict[str, float]:
        """Diagnostics since the last call (share of suspicious episodes)."""


class RegisteredEnv(Protocol):
    """What the mapping audit reads of a registered env (``agentflow_core.registry.EnvEntry`` satisfies it).

    The audit sits with the adapters, below the registry that loads env configs; it types its input
    with this so the adapters never import the registry.
    """

    @property
    def class_path(self) -> str:
        """``module:Class`` of the env family; the module's ``RAW_STATES`` are the audit's labelled samples."""

    @property
    def mapping_path(self) -> str:
        """The mapping file the entry loaded: findings name it."""

    @property
    def source_file(self) -> str:
        """The env config file the entry came from: errors name it."""

    @property
    def kwargs(self) -> dict[str, Any]:
        """Constructor keywords; a channel written as data has its document (labelled samples included) as ``spec``."""

    def build_adapter(self) -> Any:
        """The entry's semantic adapter over its mapping, in its process's vocabulary."""


class ChannelHealth(Protocol):
    """The real channels' processes as a paired sim-to-real run sees them (one per family).

    Why a seam: the core runs the paired episodes and decides what a dead channel costs (the episode
    it was running); the edge owns the processes (a browser, a PostgreSQL server, a server process)
    and knows how to probe and restart them (``tasks.real_channels.RealChannels``).
    """

    def alive(self, family: str) -> bool:
        """Is the family's real channel process still serving?"""

    def restart(self, family: str) -> None:
        """Replace a dead channel with a fresh one; raises when it cannot (the run then ends)."""


@runtime_checkable
class OracleEnv(Protocol):
    """An env that can say what a policy reading its hidden state would do (a simulator that knows it).

    Why a seam: the oracle is the upper bound the trained policy's regret is measured against; the
    evaluation episodes (``agentflow_core.pool.episodes``) ask the env for it step by step, and only
    evaluation does: training and exploration never see it.
    """

    def oracle_action(self) -> int | str:
        """The oracle's action in the current state: a semantic action index, or (a physical env behind the
        semantic wrapper) the name of its native action."""


@runtime_checkable
class OraclePool(Protocol):
    """A pool that can ask each slot's env for its :class:`OracleEnv` action (``PoolDriver`` pools can)."""

    def oracle_actions(self) -> np.ndarray:
        """Every slot's oracle action, in slot order."""
