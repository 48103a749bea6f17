"""Roll a policy out on a pool of (held-out) variants: success rate and returns.

Each slot counts only its first ``ceil(n_episodes / num_envs)`` finished episodes, so short
episodes (often the successful ones) are not over-represented, as they would be if the first
``n_episodes`` completions overall were taken. The reference policies the trained one is judged
against live here too: the exploration policy (epsilon-greedy around the untrained policy) and
the scripted experts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from agentflow_core.contracts import EnvPool, PolicyFn
from agentflow_core.envs.experts import expert_for
from agentflow_core.rl.exploration import epsilon_greedy
from agentflow_core.rl.policy import ActorCritic


@dataclass(frozen=True)
class EvalResult:
    """Outcome of an evaluation; ``success_rate`` = share of episodes ending in PAYMENT_SUCCESS."""

    episodes: int
    success_rate: float
    mean_return: float
    std_return: float
    mean_length: float
    success_by_family: dict[str, float] = field(default_factory=dict)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """Flat numbers for a metrics sink."""
        out = {f"{prefix}{k}": float(v) for k, v in asdict(self).items() if k != "success_by_family"}
        out.update({f"{prefix}success/{fam}": v for fam, v in self.success_by_family.items()})
        return out


def evaluate_policy(
    pool: EnvPool, act: PolicyFn, n_episodes: int, seed: int, max_pool_steps: int = 100_000
) -> EvalResult:
    """Run ``act(obs, mask) -> actions`` until every slot finished its share of ``n_episodes``.

    The pool's scheduler state is restored afterwards, so every evaluation on a pool sees the same
    variant sequence: evaluations of different checkpoints are comparable (and a resumed run
    evaluates exactly as an uninterrupted one).
    """
    snapshot = pool.scheduler.state_dict()
    try:
        return _evaluate(pool, act, n_episodes, seed, max_pool_steps)
    finally:
        pool.scheduler.load_state_dict(snapshot)


def _evaluate(pool: EnvPool, act: PolicyFn, n_episodes: int, seed: int, max_pool_steps: int) -> EvalResult:
    per_slot = -(-n_episodes // pool.num_envs)
    counts = np.zeros(pool.num_envs, dtype=np.int64)
    returns: list[float] = []
    lengths: list[int] = []
    successes: list[bool] = []
    families: list[str] = []
    batch = pool.reset(seed=seed)
    variants = pool.variants
    for _ in range(max_pool_steps):
        if (counts >= per_slot).all():
            break
        # a slot that has its episodes pauses: its steps would be thrown away
        batch = pool.step(np.asarray(act(batch.obs, batch.action_mask), dtype=np.int64), active=counts < per_slot)
        for i in np.flatnonzero(batch.terminated | batch.truncated):
            if counts[i] >= per_slot:
                continue
            counts[i] += 1
            info = batch.infos[i]
            returns.append(float(info["episode_return"]))
            lengths.append(int(info["episode_length"]))
            successes.append(bool(info["success"]))
            families.append(variants[int(info["variant_index"])].family)
    by_family: dict[str, float] = {}
    fam_arr, succ_arr = np.asarray(families, dtype=object), np.asarray(successes, dtype=float)
    for fam in sorted(set(families)):
        by_family[fam] = float(succ_arr[fam_arr == fam].mean())
    n = len(returns)
    return EvalResult(
        episodes=n,
        success_rate=float(succ_arr.mean()) if n else 0.0,
        mean_return=float(np.mean(returns)) if n else 0.0,
        std_return=float(np.std(returns)) if n else 0.0,
        mean_length=float(np.mean(lengths)) if n else 0.0,
        success_by_family=by_family,
    )


def greedy_policy(policy: ActorCritic) -> PolicyFn:
    """The trained policy's argmax legal action."""
    return lambda obs, mask: policy.act(obs, mask)


def exploration_policy(policy: ActorCritic, epsilon: float, rng: np.random.Generator) -> PolicyFn:
    """Epsilon-greedy around ``policy`` (the untrained one: the exploration phase's behaviour policy)."""
    return lambda obs, mask: epsilon_greedy(policy.act(obs, mask), mask, epsilon, rng)[0]


def expert_policy(pool: EnvPool) -> PolicyFn:
    """Each slot's family's scripted expert (the pool says which variant a slot is playing)."""
    variants = pool.variants

    def act(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
        slots = pool.slot_variants()
        return np.array(
            [expert_for(variants[v].family).act(o, m) for v, o, m in zip(slots.tolist(), obs, mask, strict=True)],
            dtype=np.int64,
        )

    return act
