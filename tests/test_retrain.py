"""Retrains on the tiny cycle: a fresh cycle makes the champion, then retrains build on it (real Prefect, MLflow, pools).

One module fixture runs three cycles in one sqlite-tracked state dir: a fresh cycle (promoted: no
champion yet), a retrain with the tiny settings, and a retrain whose PPO is sabotaged by overrides
(huge entropy bonus and step size) with the canary thresholds opened, so the paired held-out
comparison is what decides.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from agentflow_core.rl.trajectories import read_card, read_steps
from agentflow_core.semantics import CHECKOUT, N_ACTIONS, OBS_DIM
from tasks.context import PhaseContext
from tasks.prefect_tasks import GateFailed
from tests.tiny import write_tiny_params

pytestmark = pytest.mark.slow

SABOTAGE = {
    "train.ent_coef": 50.0,
    "train.learning_rate": 0.05,
    "train.clip_range": 0.9,
    "report.promote_min_reward_gain": -1000.0,
    "report.promote_min_consistency": 0.0,
}


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def cycles(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None) -> dict[str, Any]:
    from flows.training_cycle import training_cycle

    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)  # track in the tiny state dir's sqlite store
    root = tmp_path_factory.mktemp("retrain")
    # every cycle must reach its report: a retrain's exploration runs on a fresh OS-drawn seed, and the tiny
    # catalogue's coverage (0.55-0.68) sits near the tiny 0.5 gate, so the gate is recorded only here
    # (tests/test_gates.py fails it on purpose)
    params = write_tiny_params(root, explore={"min_state_coverage": 0.0})
    data, state = root / "data", root / ".agentflow"
    out: dict[str, Any] = {"root": root, "params": params}
    try:
        out["first"] = training_cycle(params_path=str(params), run_name="first")
        shutil.copy2(data / "checkpoints" / "policy.safetensors", root / "first-policy.safetensors")
        out["first_card"] = read_card(data / "trajectories")
        out["first_report"] = _files(state / "reports" / out["first"]["mlflow_run_id"])
        out["retrain"] = training_cycle(params_path=str(params), run_name="retrain", retrain=True)
        out["retrain_card"] = read_card(data / "trajectories")
        out["retrain_train"] = json.loads((data / "checkpoints" / "train_summary.json").read_text())
        out["retrain_untrained"] = load_file(str(data / "checkpoints" / "checkpoints" / "untrained.safetensors"))
        out["champion_before_worse"] = (state / "reports" / "champion").resolve()
        out["champion_report_before_worse"] = _files(out["champion_before_worse"])
        try:
            out["worse"] = training_cycle(params_path=str(params), run_name="worse", retrain=True, overrides=SABOTAGE)
        except GateFailed as exc:  # a sabotaged policy may also fail the stress gate: never promoted either way
            out["worse"] = {"gate_failed": str(exc)}
    finally:
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved
    return out


def _client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / '.agentflow' / 'mlflow.db'}")


def test_warm_start_loads_the_champions_weights(cycles: dict[str, Any]) -> None:
    champion = load_file(str(cycles["root"] / "first-policy.safetensors"))
    start = cycles["retrain_untrained"]
    assert set(start) == set(champion)
    assert all((start[k] == champion[k]).all() for k in champion)  # PPO started from exactly the champion
    assert cycles["retrain_train"]["warm_start"]["checkpoint"] == cycles["retrain"]["retrain"]["warm_start"]
    assert cycles["retrain_train"]["bc"]["used"] is False
    assert cycles["retrain"]["retrain"]["champion_version"] == "1"


def test_each_retrain_draws_a_fresh_seed_and_records_it(cycles: dict[str, Any]) -> None:
    seeds = [cycles[k]["retrain"]["cycle_seed"] for k in ("retrain",)]
    seed = seeds[0]
    assert seed != 0  # base.seed of the tiny config
    assert cycles["retrain_train"]["seed"] == seed
    run = _client(cycles["root"]).get_run(cycles["retrain"]["mlflow_run_id"])
    assert run.data.params["cycle_seed"] == str(seed) and run.data.tags["agentflow.cycle_seed"] == str(seed)
    assert run.data.params["base.seed"] == "0"
    assert seed in cycles["retrain_card"]["seeds"] and 0 in cycles["retrain_card"]["seeds"]


def test_shards_are_appended_with_their_cycle(cycles: dict[str, Any]) -> None:
    first, after = cycles["first_card"], cycles["retrain_card"]
    retrain_id = cycles["retrain"]["mlflow_run_id"]
    assert after["rows"] == first["rows"] + cycles["retrain"]["explore"]["cycle_rows"] > first["rows"]
    assert after["shards"][: len(first["shards"])] == [{"cycle": "initial", **s} for s in first["shards"]]
    new = after["shards"][len(first["shards"]) :]
    assert new and all(s["cycle"] == retrain_id and s["file"].startswith("cycle-001-") for s in new)
    assert [c["cycle"] for c in after["cycles"]] == ["initial", retrain_id]
    final = read_card(cycles["root"] / "data" / "trajectories")  # after the third cycle appended too
    assert [c["cycle"] for c in final["cycles"]][:2] == ["initial", retrain_id] and len(final["cycles"]) == 3
    assert final["shards"][: len(after["shards"])] == after["shards"]
    table = read_steps(cycles["root"] / "data" / "trajectories", vocabulary=CHECKOUT)  # every shard's checksum verified
    assert table.num_rows == final["rows"] == sum(c["rows"] for c in final["cycles"])


def test_exploration_starts_with_what_the_champion_failed(cycles: dict[str, Any]) -> None:
    plan = json.loads(Path(cycles["retrain"]["retrain"]["plan"]).read_text())
    failed = set(plan["champion_failed"])
    assert failed and set(plan["priority"][: len(failed)]) == failed
    table = read_steps(cycles["root"] / "data" / "trajectories", vocabulary=CHECKOUT)
    cycle_rows = [i for i, c in enumerate(table.column("seed").to_pylist()) if c == plan["seed"]]
    first_envs = {table.column("env_id")[i].as_py() for i in cycle_rows[:8]}  # the first pool step: 8 slots
    assert first_envs == set(plan["priority"][:8])


def test_worse_challenger_is_not_promoted_and_the_champion_report_stays(cycles: dict[str, Any]) -> None:
    root = cycles["root"] / ".agentflow" / "reports"
    worse_id = os.readlink(root / "latest")
    earlier = {cycles["first"]["mlflow_run_id"], cycles["retrain"]["mlflow_run_id"]}
    assert worse_id not in earlier, f"the sabotaged cycle wrote no report: {cycles['worse']}"
    decision = json.loads((root / worse_id / "decision.json").read_text())
    assert decision["promote"] is False
    paired = decision["paired"]  # the canary was opened, so the held-out pairs decided
    assert paired["beats"] is False and paired["losses"] > paired["wins"] and paired["episodes"] == 128
    assert (root / "champion").resolve() == cycles["champion_before_worse"]
    assert _files(cycles["champion_before_worse"]) == cycles["champion_report_before_worse"]
    client = _client(cycles["root"])
    alias = client.get_model_version_by_alias("agentflow-policy", "champion")
    assert alias.tags["promotion"] == "True" and str(alias.version) in ("1", "2")


def test_latest_points_to_the_newest_cycle_and_every_cycle_keeps_its_report(cycles: dict[str, Any]) -> None:
    root = cycles["root"] / ".agentflow" / "reports"
    kept = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    assert len(kept) == 3
    newest = max((root / k for k in kept), key=lambda p: (p / "decision.json").stat().st_mtime)
    assert os.readlink(root / "latest") == newest.name
    first_id = cycles["first"]["mlflow_run_id"]
    assert _files(root / first_id) == cycles["first_report"]  # later cycles never rewrote it
    for k in kept:
        assert (root / k / "report.md").stat().st_size > 0 and "promote" in json.loads(
            (root / k / "decision.json").read_text()
        )


def test_paired_comparison_plays_identical_episodes_and_rejects_an_untrained_policy(
    cycles: dict[str, Any], tmp_path: Path
) -> None:
    from agentflow_core.rl.checkpoint import save_checkpoint
    from agentflow_core.rl.policy import ActorCritic
    from agentflow_core.semantics import VOCAB_VERSION
    from tasks.config_io import load_config
    from tasks.retrain import heldout_outcomes, paired_heldout

    cfg = load_config(cycles["params"])
    champion = cycles["retrain"]["retrain"]["warm_start"]
    untrained = save_checkpoint(
        tmp_path,
        "update_00000000",
        ActorCritic(OBS_DIM, N_ACTIONS).state_dict(),
        {},
        {"vocab_version": VOCAB_VERSION, "hidden_sizes": [64, 64]},
    )
    a, b = heldout_outcomes(PhaseContext.of(cfg), champion), heldout_outcomes(PhaseContext.of(cfg), untrained)
    assert len(a) == 128 and [o.key for o in a] == [o.key for o in b]
    assert heldout_outcomes(PhaseContext.of(cfg), champion) == a  # the same episodes give the same outcomes
    result = paired_heldout(PhaseContext.of(cfg), untrained, champion)
    assert not result.beats and result.losses > result.wins


def test_a_retrain_trains_with_ewc_toward_the_champion(cycles: dict[str, Any]) -> None:
    from agentflow_core.rl.ewc import EWCPenalty

    assert cycles["first"]["train"]["ewc"] == {"used": False}  # no champion yet
    fisher_file = Path(cycles["retrain"]["retrain"]["ewc"])
    assert fisher_file.name == "fisher.safetensors" and fisher_file.parent.name == cycles["retrain"]["mlflow_run_id"]
    ewc = cycles["retrain_train"]["ewc"]
    assert ewc["used"] and ewc["file"] == str(fisher_file) and ewc["ewc/fisher_max"] > 0.0
    penalty = EWCPenalty.load(fisher_file, lam=1.0)
    champion = load_file(str(cycles["root"] / "first-policy.safetensors"))
    assert set(penalty.anchor) == {k for k in champion if k.startswith(("actor.", "critic."))}
    assert all((penalty.anchor[k] == champion[k]).all() for k in penalty.anchor)  # anchored at the champion
    assert all(float(penalty.fisher[k].abs().sum()) == 0.0 for k in penalty.fisher if k.startswith("critic."))
    client, parent = _client(cycles["root"]), cycles["retrain"]["mlflow_run_id"]
    train_run = client.search_runs(
        [client.get_run(parent).info.experiment_id],
        f"tags.`mlflow.parentRunId` = '{parent}' and tags.`agentflow.phase` = 'train'",
    )[0]
    assert "train/losses/regularizer" in train_run.data.metrics  # the penalty is tracked per update
