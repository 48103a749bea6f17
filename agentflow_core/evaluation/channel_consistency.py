"""Cross-channel action consistency on paired states: does a policy act the same in one business state on every channel?

Paired scenarios are the same variant parameters and seed on every channel of a process, faults
off (one scenario per dimension value, the others at their first value). The process's scripted
expert plays each; step ``i`` of a paired episode is the same business state on every channel (the
equivalence contract, ``tests/test_channel_equivalence.py``). A policy's consistency is the share
of paired states, over every pair of channels, on which it picks the same action; a uniformly
random legal policy gives the scale.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from agentflow_core.contracts import PolicyFn
from agentflow_core.process import ProcessSpec
from agentflow_core.registry import EnvRegistry

PAIRED_SEEDS = (0, 1, 2)
FAULTY_NETWORKS = frozenset({"latency_500ms", "packet_loss_5%"})
State = tuple[np.ndarray, np.ndarray]  # (observation, legal-action mask)


def paired_states(
    process: ProcessSpec, registry: EnvRegistry, scenarios: Sequence[Mapping[str, Any]], seeds: Sequence[int]
) -> list[list[State]]:
    """Per channel, the (observation, mask) of every step of the expert's episodes on the paired scenarios.

    Episodes that differ in length between channels (they should not, by the equivalence contract) are
    cut to the shortest, so index ``i`` is the same business state on every channel.
    """
    episodes: list[list[list[State]]] = []
    for channel in process.channels:
        entry, expert = registry.get(channel.env), process.expert(channel.family)
        episodes.append([])
        for params, seed in itertools.product(scenarios, seeds):
            env = entry.make(params)
            try:
                obs, info = env.reset(seed=seed)
                episode: list[State] = []
                for _ in range(env.max_episode_steps):
                    episode.append((obs, info["action_mask"]))
                    obs, _, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
                    if terminated or truncated:
                        break
            finally:
                env.close()
            episodes[-1].append(episode)
    cut = [min(len(channel[i]) for channel in episodes) for i in range(len(episodes[0]))]
    return [[s for i, episode in enumerate(channel) for s in episode[: cut[i]]] for channel in episodes]


def action_consistency(
    states: list[list[tuple[np.ndarray, np.ndarray]]], act: Callable[[np.ndarray, np.ndarray], int]
) -> float:
    """Share of paired states, over every pair of channels, on which ``act`` picks the same action."""
    actions = [[act(obs, mask) for obs, mask in channel] for channel in states]
    agree = total = 0
    for a, b in itertools.combinations(actions, 2):
        agree += sum(x == y for x, y in zip(a, b, strict=True))
        total += len(a)
    return agree / total if total else float("nan")


def paired_scenarios(dimensions: Mapping[str, Sequence[Any]]) -> list[dict[str, Any]]:
    """One scenario per dimension value (the others at their first value), a faulty network never."""
    base = {
        name: next((v for v in values if v not in FAULTY_NETWORKS), values[0]) for name, values in dimensions.items()
    }
    out = [dict(base)]
    for name, values in dimensions.items():
        out += [{**base, name: value} for value in values if value != base[name] and value not in FAULTY_NETWORKS]
    return out


def cross_channel_consistency(
    process: ProcessSpec,
    registry: EnvRegistry,
    dimensions: Mapping[str, Sequence[Any]],
    act: PolicyFn,
    seed: int,
    seeds: Sequence[int] = PAIRED_SEEDS,
) -> dict[str, float]:
    """``act``'s and a random legal policy's consistency on the process's paired states.

    Channels whose base env the registry lacks are left out; with fewer than two the figures are NaN.
    """
    process = replace(process, channels=tuple(c for c in process.channels if c.env in registry))
    if len(process.channels) < 2:
        nan = float("nan")
        return {
            "cross_channel_consistency": nan,
            "cross_channel_consistency_random": nan,
            "cross_channel_paired_states": 0.0,
        }
    states = paired_states(process, registry, paired_scenarios(dimensions), seeds)
    rng = np.random.default_rng(seed)

    def policy(obs: np.ndarray, mask: np.ndarray) -> int:
        return int(np.asarray(act(obs[None], mask[None])).reshape(-1)[0])

    def uniform(_obs: np.ndarray, mask: np.ndarray) -> int:
        return int(rng.choice(np.flatnonzero(mask)))

    return {
        "cross_channel_consistency": action_consistency(states, policy),
        "cross_channel_consistency_random": action_consistency(states, uniform),
        "cross_channel_paired_states": float(len(states[0])),
    }
