"""The shapes that cross the core's layers: the env pool, its batch, a policy function, failure reasons.

This module is the ground floor (in the spirit of Stable-Baselines3's ``type_aliases.py``): it
imports nothing from the project but the vocabulary's type (``semantics``, the other ground-floor
module), and ``pool/``, ``rl/`` and ``evaluation/`` type their seams with
it, so mypy checks the contract between the learner and whatever steps its envs
(:class:`~agentflow_core.pool.inprocess.InProcessPool` or
:class:`~agentflow_core.pool.ray_pool.RayPool`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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
