"""Evaluation episodes defined by (variant, episode number, seed), played next to the env workers.

A training run's validation and test evaluations used to step separate round-robin pools from the
driver: two worker round trips per pool step, the workers idle while the driver ran the policy,
and on Ray a pool of actors of their own to start. Here an evaluation is a fixed *set* of episodes
-- ``per_variant`` episodes of every evaluation variant, episode ``j`` of variant ``i`` reset from
:func:`episode_seed` ``(seed, i, j)`` -- that any env worker can play: the driver ships the policy
weights once, each training env worker plays its share with the deterministic actor
(:class:`ActorSpec`) and returns one :class:`EpisodeRecord` per episode in one call. An episode's
episodes are shared out over the workers by variant, the same way on either backend, so both give
the same records; :func:`agentflow_core.evaluation.policy_eval.summarise_episodes`
turns them into an :class:`~agentflow_core.evaluation.policy_eval.EvalResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from agentflow_core.contracts import VariantLike
from agentflow_core.envs.experts import ScriptedExpert, expert_for
from agentflow_core.pool.base import POOL_FAILURES, WORKER_LOST
from agentflow_core.pool.worker import EnvWorker
from agentflow_core.rl.exploration import epsilon_greedy
from agentflow_core.rl.policy import ActorCritic
from agentflow_core.semantics import Vocabulary

# An env worker's catalogue keys and slots for evaluation episodes, apart from the training slice's
# (its variants are keyed by catalogue index, its slots numbered from 0).
EVAL_KEY_BASE = 1 << 40
EVAL_SLOT_BASE = 1 << 40

Weights = dict[str, np.ndarray]
GREEDY, EPSILON_GREEDY, EXPERT, ORACLE = "greedy", "epsilon_greedy", "expert", "oracle"


def episode_seed(seed: int, variant: int, episode: int) -> int:
    """The reset seed of episode ``episode`` of evaluation variant ``variant``: a pure function of the three."""
    return int(np.random.SeedSequence([seed, variant, episode]).generate_state(1, dtype=np.uint32)[0] >> 1)


@dataclass(frozen=True)
class ActorSpec:
    """How an evaluation acts, as data a worker can rebuild: the policy's argmax, epsilon-greedy around
    it (each episode with its own generator, seeded like the episode), the family's scripted expert
    (``experts``: the process's rules per family; checkout's when empty), or the env's oracle (it reads
    the hidden state: evaluation only)."""

    kind: str  # GREEDY | EPSILON_GREEDY | EXPERT | ORACLE
    hidden_sizes: tuple[int, ...] = ()
    epsilon: float = 0.0
    experts: tuple[tuple[str, ScriptedExpert], ...] = ()

    def expert(self, family: str) -> ScriptedExpert:
        """The scripted expert of ``family``."""
        return dict(self.experts).get(family) or expert_for(family)


@dataclass(frozen=True)
class EpisodeRecord:
    """One finished evaluation episode (``variant`` indexes the evaluation's variant list)."""

    variant: int
    episode: int
    episode_return: float
    length: int
    paid: bool  # the goal token reached (the pool's ``success``)
    terminated: bool
    final_obs: np.ndarray  # [obs_dim]: what process success is judged on
    failure_reason: str | None = None
    business_value: float | None = None  # the channel's ``info["business_value"]`` at the end, if it prices episodes


@dataclass
class EvalRequest:
    """One worker's share of an evaluation: its variants (keyed for its catalogue) and episodes."""

    variants: dict[int, VariantLike]  # worker catalogue key -> variant
    episodes: list[tuple[int, int, int, int]]  # (evaluation variant index, episode number, key, reset seed)
    actor: ActorSpec
    num_slots: int
    seed: int
    max_steps: int = 100_000


def _actor(
    spec: ActorSpec, weights: Weights | None, policy: ActorCritic | None, vocabulary: Vocabulary
) -> ActorCritic | None:
    if spec.kind in (EXPERT, ORACLE):
        return None
    if policy is None or policy.hidden_sizes != tuple(spec.hidden_sizes):
        with torch.random.fork_rng(devices=[]):  # overwritten at once; torch's global generator untouched
            policy = ActorCritic(vocabulary.obs_dim, vocabulary.n_actions, spec.hidden_sizes)
    assert weights is not None, "a policy actor needs its weights"
    policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()})
    return policy


class EpisodePlayer:
    """Plays evaluation requests on one env worker (kept between calls: its policy copy is reused)."""

    def __init__(self, worker: EnvWorker) -> None:
        self.worker = worker
        self._policy: ActorCritic | None = None

    def play(self, request: EvalRequest, weights: Weights | None) -> list[EpisodeRecord]:
        """Every episode of ``request``, ``num_slots`` at a time; records in request order."""
        worker = self.worker
        vocabulary = worker.vocabulary
        goal = vocabulary.token_index()[vocabulary.goal]
        worker.variants.update(request.variants)
        policy = _actor(request.actor, weights, self._policy, vocabulary)
        self._policy = policy if policy is not None else self._policy
        queue = list(request.episodes)
        queue.reverse()  # pop() takes them in request order
        n = min(request.num_slots, len(queue))
        slots = EVAL_SLOT_BASE + np.arange(n, dtype=np.int64)
        playing: list[tuple[int, int, int, int] | None] = [None] * n
        rngs: list[np.random.Generator | None] = [None] * n
        obs = np.zeros((n, vocabulary.obs_dim), np.float32)
        mask = np.ones((n, vocabulary.n_actions), bool)
        ret, length = np.zeros(n), np.zeros(n, np.int64)
        records: dict[tuple[int, int], EpisodeRecord] = {}

        def finish(
            row: int, terminated: bool, final: np.ndarray, paid: bool, reason: str | None, value: float = np.nan
        ) -> None:
            i, j = playing[row][:2]  # type: ignore[index]
            records[(i, j)] = EpisodeRecord(
                i, j, float(ret[row]), int(length[row]), paid, terminated, final, reason, _priced(value)
            )
            playing[row] = None

        def start(rows: list[int]) -> None:
            while rows and queue:
                taken = [(r, queue.pop()) for r in rows[: len(queue)]]
                rows = rows[len(taken) :]
                out = worker.reset(
                    slots[[r for r, _ in taken]],
                    np.array([e[2] for _, e in taken], np.int64),
                    np.array([e[3] for _, e in taken], np.int64),
                )
                for k, (r, e) in enumerate(taken):
                    playing[r], ret[r], length[r] = e, 0.0, 0
                    if out.failure_reason[k] is not None:  # the episode never started: a failed one
                        finish(r, False, np.zeros(vocabulary.obs_dim, np.float32), False, out.failure_reason[k])
                        rows.append(r)
                        continue
                    obs[r], mask[r] = out.obs[k], out.action_mask[k]
                    rngs[r] = np.random.default_rng([request.seed, e[0], e[1]])

        spec = request.actor
        # each family's expert, looked up once per evaluation rather than per row and step
        experts = {v.family: spec.expert(v.family) for v in request.variants.values()} if spec.kind == EXPERT else {}

        def act(live: list[int]) -> np.ndarray:
            episodes = [playing[r] for r in live]
            rows = (obs[live], mask[live], [rngs[r] for r in live])
            return _actions(spec, policy, experts, request, episodes, *rows, lambda: worker.oracle_actions(slots[live]))

        start(list(range(n)))
        for _ in range(request.max_steps):
            live = [r for r in range(n) if playing[r] is not None]
            if not live:
                break
            actions = act(live)
            out = worker.step(slots[live], actions)
            ended: list[int] = []
            for k, r in enumerate(live):
                reason = out.failure_reason[k]
                ret[r] += float(out.reward[k])
                length[r] += 1
                if reason in POOL_FAILURES or reason == WORKER_LOST:  # no valid observation: the last good one
                    finish(r, False, obs[r].copy(), False, reason)
                    ended.append(r)
                elif out.terminated[k] or out.truncated[k]:
                    paid = bool(out.terminated[k] and out.obs[k, goal] > 0.5)
                    finish(r, bool(out.terminated[k]), out.obs[k].copy(), paid, reason, out.business_value[k])
                    ended.append(r)
                else:
                    obs[r], mask[r] = out.obs[k], out.action_mask[k]
            start(ended)
        worker.release(slots)
        return [records[(e[0], e[1])] for e in request.episodes if (e[0], e[1]) in records]


def _actions(
    spec: ActorSpec,
    policy: ActorCritic | None,
    experts: dict[str, ScriptedExpert],
    request: EvalRequest,
    episodes: list[tuple[int, int, int, int] | None],
    obs: np.ndarray,
    mask: np.ndarray,
    rngs: list[np.random.Generator | None],
    oracle: Callable[[], np.ndarray],
) -> np.ndarray:
    """The actions of the live rows (``episodes``, their ``obs`` and ``mask``): expert, oracle (the envs'
    own ``oracle_action``), greedy or epsilon-greedy."""
    if spec.kind == ORACLE:
        return oracle()
    if spec.kind == EXPERT:
        families = [request.variants[e[2]].family for e in episodes]  # type: ignore[index]
        return np.array([experts[f].act(x, y) for f, x, y in zip(families, obs, mask, strict=True)], np.int64)
    assert policy is not None
    with torch.no_grad():
        actions = np.asarray(policy.act(obs, mask), dtype=np.int64).reshape(len(episodes))
    if spec.kind == EPSILON_GREEDY:  # each episode draws from its own generator
        for k, rng in enumerate(rngs):
            assert rng is not None
            actions[k : k + 1] = epsilon_greedy(actions[k : k + 1], mask[k : k + 1], spec.epsilon, rng)[0]
    return actions


def _priced(value: float) -> float | None:
    """An episode's business value as recorded: None where the channel reported none (NaN)."""
    return None if np.isnan(value) else float(value)


def actor_weights(policy: ActorCritic | None) -> Weights | None:
    """The policy's weights as numpy arrays (what an evaluation request ships), or None for the expert."""
    if policy is None:
        return None
    return {k: v.detach().cpu().numpy().copy() for k, v in policy.state_dict().items()}
