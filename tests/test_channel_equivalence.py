"""The channel equivalence contract: one business state gives one observation on every channel of a process.

For every process and every pair of its channels, the scripted expert's episodes on paired scenarios
(the same variant parameters, the same seed, faults off) must give the same tokens, the same features
(within 0.01) and the same legal actions at every step. With a network fault on, the channels fail at
different moments, so only the token sequence is compared, with the fault's own tokens (and the
recovery they cause) left out. Features a channel's mapping declares unobservable are compared only
where both channels observe them (docs/adapters-equivalence.md).
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agentflow_core.process import ProcessSpec
from agentflow_core.registry import EnvEntry, EnvRegistry
from tasks.config_io import parse_config
from tasks.process_io import load_process
from tasks.registry_io import load_registry

REPO = Path(__file__).resolve().parents[1]
FEATURE_TOLERANCE = 0.01
SEEDS = (0, 7)
# the process `agentflow process new --forms` writes: its machine as the simulator, a web form, SQL rows and an HTTP
# service, and a hand-written SQL channel, all as data
SCAFFOLD = "scaffold"
ENV_DIRS: dict[str, Path | None] = {
    "checkout": REPO / "configs/envs",
    "checkout_v2": REPO / "configs/checkout_v2/envs",
    "refund": REPO / "configs/refund/envs",
    SCAFFOLD: None,  # written into a temporary project by the fixture
}
# Tokens a network fault brings and the state it leaves behind (compared only up to these).
FAULT_TOKENS = {"checkout": frozenset({"NETWORK_TIMEOUT", "SERVER_ERROR", "PAGE_NOT_FOUND"})}
FAULT_TOKENS["refund"] = frozenset({"SERVICE_TIMEOUT"})
FAULT_TOKENS[SCAFFOLD] = frozenset({"TIMEOUT"})
FAULT_TOKENS["checkout_v2"] = frozenset()  # its outage is business state, the same on every channel

# Paired scenarios, faults off: checkout's user tiers and start stages, a short wallet, certain declines;
# refund's evidence-required order value, flagged account and a review already under way; checkout_v2's cards,
# a new customer and a flagged account (its hidden causes drawn from the seed, the same on every channel).
CLEAN: dict[str, list[dict[str, Any]]] = {
    "checkout": [
        {"card_decline_rate": 0.0},
        {"card_decline_rate": 0.0, "user_tier": "vip"},
        {"card_decline_rate": 0.0, "user_tier": "blocked"},
        {"card_decline_rate": 0.0, "start_stage": "product_detail"},
        {"card_decline_rate": 0.0, "start_stage": "checkout"},
        {"card_decline_rate": 0.0, "start_stage": "payment"},
        {"card_decline_rate": 0.0, "balance": 50.0},
        {"card_decline_rate": 0.0, "inventory": 0},
    ],
    "refund": [{}, {"order_value": 150.0}, {"account": "flagged"}, {"entry_stage": "under_review"}],
    SCAFFOLD: [{}, {"plan": "annual"}, {"account": "disputed"}, {"plan": "annual", "plan_price": 80.0}],
    "checkout_v2": [{}, {"card": "prepaid", "customer": "new"}, {"account": "flagged"}, {"card": "credit"}],
}
FAULTY: dict[str, list[dict[str, Any]]] = {
    "checkout": [{"card_decline_rate": 0.0, "network": "packet_loss_5%"}],
    "refund": [{"network": "packet_loss_5%"}],
    SCAFFOLD: [{"network": "packet_loss_5%", "plan": "annual"}],
    "checkout_v2": [{"gateway": "flaky", "card": "prepaid"}],
}

Step = tuple[frozenset[str], dict[str, float], tuple[bool, ...]]


def scaffold_env_dir(root: Path) -> Path:
    """The scaffold written under ``root``, its process file also beside its env configs (found without a chdir)."""
    from tasks.process_scaffold import write_scaffold

    write_scaffold(SCAFFOLD, root, forms=True)
    env_dir = root / "configs" / SCAFFOLD / "envs"
    (env_dir.parent / "processes").mkdir()
    shutil.copy(root / "configs/processes" / f"{SCAFFOLD}.yaml", env_dir.parent / "processes")
    return env_dir


@pytest.fixture(scope="module", params=sorted(ENV_DIRS))
def process_and_registry(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ProcessSpec, EnvRegistry]]:
    name = request.param
    env_dir = ENV_DIRS[name] or scaffold_env_dir(tmp_path_factory.mktemp(name))
    cfg = parse_config({"process": name, "base": {"env_config_dir": str(env_dir)}})
    yield load_process(cfg), load_registry(cfg)


def _episode(process: ProcessSpec, entry: EnvEntry, params: dict[str, Any], seed: int) -> list[Step]:
    """The expert's episode on one channel: (tokens, features, legal actions) at every step, the last included."""
    env = entry.make(params)
    expert = process.expert(entry.family)
    try:
        obs, info = env.reset(seed=seed)
        steps: list[Step] = []
        for _ in range(env.max_episode_steps):
            last = env.last_obs
            assert last is not None
            features = {k: v for k, v in last.features.items() if k != "step_fraction"}
            steps.append((frozenset(info["tokens"]), features, tuple(bool(m) for m in info["action_mask"])))
            obs, _, terminated, truncated, info = env.step(expert.act(obs, info["action_mask"]))
            if terminated or truncated:
                break
        last = env.last_obs
        assert last is not None
        steps.append((frozenset(info["tokens"]), {}, tuple(bool(m) for m in info["action_mask"])))
        return steps
    finally:
        env.close()


def _unobservable(entry: EnvEntry) -> set[str]:
    return set(entry.mapping.get("unobservable_features", []))


def _channels(process: ProcessSpec, registry: EnvRegistry) -> list[EnvEntry]:
    return [registry.get(channel.env) for channel in process.channels]


def _name(process: ProcessSpec, step: tuple[bool, ...]) -> list[str]:
    return [a for a, ok in zip(process.vocabulary.actions, step, strict=True) if ok]


def test_every_process_declares_its_contract(process_and_registry: tuple[ProcessSpec, EnvRegistry]) -> None:
    process, registry = process_and_registry
    contract = process.vocabulary.state_contract
    assert len(_channels(process, registry)) >= 2
    assert any(rule.tokens for rule in contract.legal), "legal actions declared per business state"
    assert all(spec.meaning and spec.scale for spec in contract.features), "every feature has a meaning and scale"


def test_paired_clean_episodes_give_the_same_observation_on_every_channel(
    process_and_registry: tuple[ProcessSpec, EnvRegistry],
) -> None:
    process, registry = process_and_registry
    entries = _channels(process, registry)
    for params, seed in itertools.product(CLEAN[process.name], SEEDS):
        episodes = {e.family: _episode(process, e, params, seed) for e in entries}
        for a, b in itertools.combinations(entries, 2):
            left, right = episodes[a.family], episodes[b.family]
            where = f"{process.name} {a.family} vs {b.family} {params} seed={seed}"
            assert [s[0] for s in left] == [s[0] for s in right], f"tokens differ: {where}"
            hidden = _unobservable(a) | _unobservable(b)
            for i, ((_, fa, ma), (_, fb, mb)) in enumerate(zip(left, right, strict=True)):
                assert ma == mb, (
                    f"legal actions differ at step {i}: {_name(process, ma)} / {_name(process, mb)} {where}"
                )
                for name in fa.keys() - hidden:
                    assert abs(fa[name] - fb[name]) <= FEATURE_TOLERANCE, f"{name} at step {i}: {where}"


def _business_tokens(steps: list[Step], fault: frozenset[str]) -> list[frozenset[str]]:
    """The token sequence with the fault's tokens left out and the repeats a retry causes collapsed."""
    out: list[frozenset[str]] = []
    for tokens, _, _ in steps:
        business = tokens - fault
        if not out or out[-1] != business:
            out.append(business)
    return out


def test_paired_faulty_episodes_give_the_same_business_token_sequence(
    process_and_registry: tuple[ProcessSpec, EnvRegistry],
) -> None:
    process, registry = process_and_registry
    entries = _channels(process, registry)
    fault = FAULT_TOKENS[process.name]
    for params, seed in itertools.product(FAULTY[process.name], SEEDS):
        sequences = {e.family: _business_tokens(_episode(process, e, params, seed), fault) for e in entries}
        for a, b in itertools.combinations(entries, 2):
            assert sequences[a.family] == sequences[b.family], f"{process.name} {a.family} vs {b.family} {params}"


def test_the_mask_is_the_process_s_and_a_channel_never_widens_it(
    process_and_registry: tuple[ProcessSpec, EnvRegistry],
) -> None:
    process, registry = process_and_registry
    contract = process.vocabulary.state_contract
    for entry in _channels(process, registry):
        for tokens, _, mask in _episode(process, entry, CLEAN[process.name][0], SEEDS[0]):
            assert np.array_equal(np.array(mask), contract.legal_mask(tokens)), (entry.family, sorted(tokens))
