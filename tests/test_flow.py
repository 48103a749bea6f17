"""The training cycle as a Prefect flow, end to end at tiny scale, tracked by a real ``mlflow server``
(REST: nested runs, per-update batches, proxied artifacts, registry and alias, search, model loading).
The embedded sqlite store runs the failed-gate cycle here and whole cycles in test_dvc.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.artifacts import Artifact

from agentflow_core.semantics import CHECKOUT
from tasks.prefect_tasks import GateFailed
from tasks.process_io import SHIPPED_PROCESS_DIR, read_process
from tasks.provenance import GIT_COMMIT_TAG, GIT_DIRTY_TAG
from tasks.stages import dvc_md5, params_hash, stage_fingerprint
from tasks.tracking import metric_name
from tests.tiny import REPO, write_tiny_params

pytestmark = pytest.mark.slow

PHASES = {"calibrate", "variants", "explore", "offline", "validator", "tune", "train", "stress", "report"}


def mlflow_client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / '.agentflow' / 'mlflow.db'}")


def runs_by_name(client: MlflowClient) -> dict[str, list]:
    experiment = client.get_experiment_by_name("agentflow")
    out: dict[str, list] = {}
    for run in client.search_runs([experiment.experiment_id]):
        out.setdefault(run.info.run_name, []).append(run)
    return out


@pytest.fixture(scope="module")
def cycle(tmp_path_factory: pytest.TempPathFactory, prefect_harness: None, mlflow_server: str) -> tuple[Path, dict]:
    from flows.training_cycle import training_cycle

    root = tmp_path_factory.mktemp("cycle")
    params = write_tiny_params(root, base={"tracking": {"mlflow_uri": mlflow_server}})
    results = training_cycle(params_path=str(params), run_name="tiny-cycle")
    return root, results


def test_every_phase_ran_and_wrote_its_outputs(cycle: tuple[Path, dict]) -> None:
    root, results = cycle
    assert results["calibrate"]["passed"] and results["calibrate"]["env_stability_score"] == 1.0
    assert results["variants"]["variants"] == 48
    assert 0.0 < results["explore"]["state_coverage_ratio"] <= 1.0
    assert results["train"]["global_step"] >= 1024
    # the offline stage ran between explore and train, and PPO started from its actor
    assert results["offline"]["enabled"] and results["offline"]["transitions"] > 0
    assert (root / "data" / "offline" / "actor.safetensors").is_file()
    assert results["train"]["bc"]["source"] == "offline" and results["train"]["offline"]["kl_coef"] > 0
    assert results["stress"]["episodes"] == 24 and results["stress"]["crash_episodes"] == 0
    data = root / "data"
    for name in ("report.md", "report.html", "report.json"):
        assert (data / "reports" / name).stat().st_size > 0
    report = json.loads((data / "reports" / "report.json").read_text())
    assert report["metrics"]["robustness_score"] == pytest.approx(results["stress"]["robustness_score"])
    assert (data / "variants" / "catalogue.parquet").exists() and (data / "trajectories" / "_meta.json").exists()
    assert (data / "checkpoints" / "checkpoints" / "latest.json").exists()
    for phase in ("calibrate", "explore", "stress"):
        assert (data / "metrics" / f"{phase}.json").exists()


def test_mlflow_run_tree_and_champion_alias(cycle: tuple[Path, dict], mlflow_server: str) -> None:
    root, results = cycle
    client = MlflowClient(mlflow_server)
    runs = runs_by_name(client)
    parent = runs["tiny-cycle"][0]
    assert parent.info.run_id == results["mlflow_run_id"] and parent.info.status == "FINISHED"
    assert parent.data.params["train.clip_range"] == "0.08"
    children = {
        name for name, rs in runs.items() for r in rs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    assert children == PHASES
    assert all(r.info.status == "FINISHED" for rs in runs.values() for r in rs)
    train = runs["train"][0]
    history = client.get_metric_history(train.info.run_id, "train/losses/approx_kl")
    assert len(history) == len({m.step for m in history}) == results["train"]["updates"]  # one batch per update
    config = {a.path for a in client.list_artifacts(parent.info.run_id, "config")}
    assert config == {"config/params.yaml", "config/process", "config/mappings", "config/env_configs"}
    assert [a.path for a in client.list_artifacts(parent.info.run_id, "config/process")] == [
        "config/process/checkout.yaml"
    ]
    assert len(client.list_artifacts(parent.info.run_id, "config/mappings")) == 3
    assert {a.path for a in client.list_artifacts(train.info.run_id)} >= {"plots", "curves"}
    compared = client.search_runs([parent.info.experiment_id], "tags.`agentflow.kind` = 'cycle'")
    assert [r.info.run_id for r in compared] == [parent.info.run_id]
    for phase in ("calibrate", "explore", "train", "stress"):  # every phase's metrics file, as DVC shows it
        declared = json.loads((root / "data" / "metrics" / f"{phase}.json").read_text())
        for key, value in declared.items():  # MLflow spells a dimension value's % as pct
            assert parent.data.metrics[metric_name(key)] == pytest.approx(float(value)), key
    assert {"test_process_success", "robustness_score", "env_stability_score"} <= set(parent.data.metrics)
    assert "test/process_success/user_tier/standard" in parent.data.metrics  # per dimension value, in MLflow
    champion = client.get_model_version_by_alias("agentflow-policy", "champion")
    assert champion.run_id == train.info.run_id
    assert champion.tags["promotion"] == "True" and "no champion yet" in champion.tags["reason"]


def test_parent_run_names_its_code_data_params_and_prefect_run(cycle: tuple[Path, dict], mlflow_server: str) -> None:
    from tasks.config_io import load_config

    root, results = cycle
    tags = MlflowClient(mlflow_server).get_run(results["mlflow_run_id"]).data.tags
    assert len(tags[GIT_COMMIT_TAG]) == 40 and tags[GIT_DIRTY_TAG] in {"true", "false"}
    assert tags["agentflow.params_hash"] == params_hash(load_config(root / "params.yaml"))
    assert tags["agentflow.torch_threads"] == "1" and set(tags["agentflow.blas_threads"].split(",")) == {"1"}
    for name in ("calibration", "variants", "trajectories", "checkpoints", "stress"):
        assert tags[f"agentflow.data.{name}.md5"] == dvc_md5(root / "data" / name), name
    assert tags["agentflow.policy_hash"] == results["train"]["policy_hash"]
    assert tags["prefect.flow_run_id"] and tags["prefect.flow_run_url"].endswith(tags["prefect.flow_run_id"])
    # the process it trained on: its file's hash, and per channel the class, its code version and mapping hash
    assert tags["agentflow.process"] == "checkout" and len(tags["agentflow.process.sha256"]) == 16
    for env_id in ("web_checkout_v2", "order_db_v1", "payment_api_v1"):
        assert tags[f"agentflow.channel.{env_id}.version"].startswith("sha256:"), env_id
        assert len(tags[f"agentflow.channel.{env_id}.mapping_sha256"]) == 16
    from uuid import UUID

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect_client:
        flow_run = prefect_client.read_flow_run(UUID(tags["prefect.flow_run_id"]))
    assert flow_run.name == f"checkout-{results['run_name']}"
    assert {"process:checkout", f"run:{results['run_name']}"} <= set(flow_run.tags)
    link = Artifact.get("mlflow-run")
    assert link is not None and results["mlflow_run_id"] in link.data
    card = json.loads((root / "data" / "trajectories" / "_meta.json").read_text())
    catalogue = json.loads((root / "data" / "variants" / "_meta.json").read_text())
    assert card["catalogue_sha256"] == catalogue["catalogue_sha256"] and card["git_commit"] == tags[GIT_COMMIT_TAG]


def test_registered_model_predicts_from_observation_and_mask_columns(
    cycle: tuple[Path, dict], mlflow_server: str
) -> None:
    import mlflow
    import numpy as np

    from agentflow_core.semantics import N_ACTIONS, OBS_DIM
    from tasks.model_registry import champion_checkpoint
    from tasks.policy_model import policy_frame, tracking_uri_set
    from tasks.steps.stress import load_policy
    from tasks.tracking import MlflowTracker

    with tracking_uri_set(mlflow_server):
        model = mlflow.pyfunc.load_model("models:/agentflow-policy@champion")
    assert "python_model" not in (model.metadata.flavors["python_function"])  # from code, not cloudpickled
    assert model.metadata.signature is not None and model.metadata.saved_input_example_info is not None
    rng = np.random.default_rng(0)
    obs = (rng.random((5, OBS_DIM)) > 0.5).astype(np.float32)
    mask = np.zeros((5, N_ACTIONS), dtype=np.float32)
    mask[:, 3] = 1.0
    assert model.predict(policy_frame(obs, mask, vocabulary=CHECKOUT)).tolist() == [3] * 5  # only the legal action
    free = model.predict(policy_frame(obs, vocabulary=CHECKOUT))
    checkpoint = champion_checkpoint(MlflowTracker(mlflow_server, "agentflow"), "agentflow-policy")
    assert checkpoint is not None
    assert (
        free.tolist()
        == load_policy(checkpoint, read_process(SHIPPED_PROCESS_DIR / "checkout.yaml")).act(obs, None).tolist()
    )


def test_prefect_artifacts_per_phase(cycle: tuple[Path, dict]) -> None:
    for key in ("calibration", "variants", "exploration", "offline", "training", "stress", "champion", "cycle-summary"):
        artifact = Artifact.get(key)
        assert artifact is not None, key
    assert "robustness_score" in Artifact.get("cycle-summary").data


def test_rerun_reuses_the_cached_variant_phase_and_moves_champion_only_on_gain(
    cycle: tuple[Path, dict], mlflow_server: str
) -> None:
    from flows.training_cycle import training_cycle

    root, first = cycle
    catalogue = root / "data" / "variants" / "catalogue.parquet"
    before = catalogue.stat().st_mtime_ns
    second = training_cycle(params_path=str(root / "params.yaml"), run_name="tiny-cycle-2", resume=True)
    assert catalogue.stat().st_mtime_ns == before  # variants came from the phase cache
    assert second["variants"]["catalogue_sha256"] == first["variants"]["catalogue_sha256"]
    client = MlflowClient(mlflow_server)
    versions = client.search_model_versions("name='agentflow-policy'")
    assert len(versions) == 2
    champion = client.get_model_version_by_alias("agentflow-policy", "champion")
    newest = max(versions, key=lambda v: int(v.version))
    if second["report"]["promoted"]:
        assert str(champion.version) == str(newest.version)
    else:
        assert str(champion.version) == "1" and "reward" in newest.tags["reason"]


def test_a_failed_gate_stops_the_downstream_phases(tmp_path: Path, prefect_harness: None) -> None:
    from flows.training_cycle import training_cycle

    config_dir = tmp_path / "envs"
    shutil.copytree(REPO / "configs" / "envs", config_dir)
    mapping = json.loads((REPO / "agentflow_core" / "mappings" / "web_checkout_v2.json").read_text())
    mapping["token_rules"] = [r for r in mapping["token_rules"] if "PAYMENT_PAGE" not in r["emit"]]
    (config_dir / "web_checkout_v2.json").write_text(json.dumps(mapping))
    params = write_tiny_params(tmp_path, calibrate={"variants_per_family": 2, "resets": 5, "max_failed_fraction": 0.1})
    text = params.read_text().replace(str(REPO / "configs" / "envs"), str(config_dir))
    params.write_text(text)
    with pytest.raises(GateFailed, match=r"calibrate gate failed: failed_fraction=0.3333 \(required <= 0.1\)"):
        training_cycle(params_path=str(params), run_name="broken")
    runs = runs_by_name(mlflow_client(tmp_path))
    assert runs["broken"][0].info.status == "FAILED"
    assert "calibrate" in runs and "train" not in runs and "variants" not in runs
    assert not (tmp_path / "data" / "variants").exists()


def test_phase_cache_key_follows_the_stage_deps_and_params(tmp_path: Path) -> None:
    from tasks.config_io import load_config

    cfg = load_config(write_tiny_params(tmp_path))
    before = stage_fingerprint(cfg, "explore")
    assert stage_fingerprint(cfg, "explore") == before
    changed = cfg.model_copy(update={"explore": cfg.explore.model_copy(update={"total_steps": 321})})
    assert stage_fingerprint(changed, "explore") != before  # a params key the stage names
    unrelated = cfg.model_copy(update={"report": cfg.report.model_copy(update={"champion_slice": 0.25})})
    assert stage_fingerprint(unrelated, "explore") == before  # a key it does not name
    (tmp_path / "data" / "variants").mkdir(parents=True)
    (tmp_path / "data" / "variants" / "catalogue.parquet").write_bytes(b"other catalogue")
    assert stage_fingerprint(cfg, "explore") != before  # a data dep


def test_no_task_reads_persisted_results_so_a_planted_pickle_runs_nothing(
    tmp_path: Path, prefect_harness: None
) -> None:
    """Prefect trusts the serializer named inside a result record: a JSON result serializer is not enough."""
    import base64

    import cloudpickle
    from prefect import flow, task
    from prefect.cache_policies import NO_CACHE
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH

    import tasks.prefect_tasks as prefect_tasks
    import tasks.validator_tasks as validator_tasks

    marker = tmp_path / "pwned"
    storage = Path(PREFECT_LOCAL_STORAGE_PATH.value())
    storage.mkdir(parents=True, exist_ok=True)
    record = {
        "metadata": {"storage_key": str(storage / "planted"), "serializer": {"type": "pickle"}, "prefect_version": "3"},
        "result": base64.encodebytes(cloudpickle.dumps(Touch(marker))).decode(),
    }
    (storage / "planted").write_text(json.dumps(record))

    @task(persist_result=True, cache_key_fn=lambda *_: "planted", result_serializer="json")
    def json_task_with_a_cache_key() -> int:
        return 1

    flow(json_task_with_a_cache_key)()
    assert marker.exists()  # the plant is live: any task that looks its key up runs the pickle
    modules = (prefect_tasks, validator_tasks)
    ours = [t for m in modules for t in vars(m).values() if hasattr(t, "persist_result") and hasattr(t, "fn")]
    assert {t.name for t in ours} == PHASES
    assert all(t.persist_result is False and t.cache_policy is NO_CACHE for t in ours)


class Touch:
    """A pickle payload: unpickling it creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (Path.touch, (self.path,))
