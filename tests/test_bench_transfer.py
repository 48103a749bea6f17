"""The pieces of ``agentflow bench transfer``: the channel filter on a catalogue and cross-channel consistency."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from agentflow_core.evaluation.channel_consistency import action_consistency, paired_scenarios, paired_states
from agentflow_core.splits import channel_catalogue, read_splits
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.process_io import load_process
from tasks.registry_io import load_registry
from tasks.steps.variants import run_variants

REPO = Path(__file__).resolve().parents[1]


def test_a_channel_catalogue_keeps_each_variant_in_its_split(tmp_path: Path) -> None:
    run_variants(PhaseContext.of(load_config(REPO / "params-checkout.yaml")), tmp_path / "all")
    full = read_splits(tmp_path / "all")
    without = channel_catalogue(tmp_path / "all", tmp_path / "without", ["order_db_v1", "payment_api_v1"])
    only = channel_catalogue(tmp_path / "all", tmp_path / "only", ["web_checkout_v2"])
    for name, members in full.items():
        kept = {v.content_hash for v in read_splits(without)[name]}
        held = {v.content_hash for v in read_splits(only)[name]}
        assert kept == {v.content_hash for v in members if v.base_env_id != "web_checkout_v2"}
        assert held == {v.content_hash for v in members if v.base_env_id == "web_checkout_v2"}
        assert kept and held and not kept & held


def test_action_consistency_counts_agreeing_pairs() -> None:
    mask = np.ones(3, dtype=bool)
    eye = np.eye(3, dtype=np.float32)
    states = [
        [(eye[0], mask), (eye[1], mask)],
        [(eye[0], mask), (eye[2], mask)],
        [(eye[0], mask), (eye[1], mask)],
    ]
    # argmax: channel 0 and 2 agree on both states, each with channel 1 on the first only: (2 + 1 + 1) / 6
    assert action_consistency(states, lambda obs, _m: int(np.argmax(obs))) == pytest.approx(4 / 6)


def test_paired_states_are_one_state_on_every_channel() -> None:
    cfg = load_config(REPO / "params-refund.yaml")  # refund's own dimensions (entry_stage, account, network)
    process = load_process(cfg)
    states = paired_states(process, load_registry(cfg), paired_scenarios(dict(cfg.variants.dimensions))[:2], (0,))
    assert len(states) == 2 and len(states[0]) == len(states[1]) > 2
    # by the equivalence contract the paired observations and masks are equal, so any function of them agrees
    assert action_consistency(states, lambda obs, _m: int(np.argmax(obs))) == 1.0
    rng = np.random.default_rng(0)
    assert action_consistency(states, lambda _o, mask: int(rng.choice(np.flatnonzero(mask)))) < 1.0


@pytest.mark.slow
@pytest.mark.bench
def test_bench_transfer_command_on_refund_reaches_the_rules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``agentflow bench transfer`` as a user types it, on refund's two channels (about 4 min on 2 cores)."""
    from typer.testing import CliRunner

    from flows.cli.bench import bench_app

    for name in ("configs", "params-refund.yaml"):
        (tmp_path / name).symlink_to(REPO / name)
    monkeypatch.chdir(tmp_path)  # data/bench/transfer_refund.json and BENCHMARKS.md land here, not in the repo
    outcome = CliRunner().invoke(bench_app, ["transfer", "--params", "params-refund.yaml", "--steps", "2048"])
    assert outcome.exit_code == 0, outcome.output
    result = json.loads((tmp_path / "data" / "bench" / "transfer_refund.json").read_text())
    assert set(result["held_out"]) == {"refund_db_v1", "refund_api_v1"}
    assert result["min_held_out_over_rules"] >= 0.95 and all(result["targets_met"].values())
    assert result["cross_channel_consistency_random"] < result["cross_channel_consistency_policy"]
    assert "Cross-channel transfer, refund process" in (tmp_path / "BENCHMARKS.md").read_text()
