"""Every phase on the Ray backend, on real Ray (no mocks), and the commands against a Ray cluster.

- The tiny cycle's phases (calibrate, variants, explore, train with its held-out evaluations,
  stress) run once with ``pool.backend: ray`` and once with ``inprocess``: the same records,
  metrics and policy hash (both backends run the same driver, scheduler and episode seeds).
- ``agentflow explore`` / ``agentflow train`` with ``RAY_ADDRESS`` pointing at a cluster made with
  ``ray start`` (a head and a second node, one CPU each) place their env workers on that cluster,
  on both nodes; killing the second node mid-train leaves the run going with the pool's recovery.
- A SIGKILLed env worker of a local ``agentflow train`` is replaced and the run completes.
- An unreachable address fails within 30 s with one error naming it, and writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tasks.context import PhaseContext
from tasks.ray_runtime import RAY_CLUSTER_SWITCH
from tests.tiny import tiny_params, write_tiny_params

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


def _cfg(root: Path, backend: str) -> Any:
    from agentflow_core.config import AgentFlowConfig

    params = tiny_params(root, pool={"num_workers": 2, "backend": backend})
    return AgentFlowConfig.model_validate(params)


def _phases(root: Path, backend: str) -> dict[str, Any]:
    from tasks.paths import DataPaths
    from tasks.steps.calibrate import run_calibrate
    from tasks.steps.explore import run_explore
    from tasks.steps.stress import run_stress
    from tasks.steps.train import run_train
    from tasks.steps.variants import run_variants

    cfg = _cfg(root, backend)
    paths = DataPaths.of(cfg)
    out: dict[str, Any] = {"calibrate": run_calibrate(PhaseContext.of(cfg), paths.calibration)}
    out["variants"] = run_variants(PhaseContext.of(cfg), paths.variants)["catalogue_sha256"]
    out["explore"] = run_explore(PhaseContext.of(cfg), paths.variants, paths.trajectories)
    train = run_train(PhaseContext.of(cfg), paths.variants, paths.trajectories, paths.checkpoints, resume=False)
    out["train"] = {k: train[k] for k in ("policy_hash", "test_process_success", "test_return", "global_step")}
    out["train_pool"] = train["pool"]
    out["stress"] = run_stress(PhaseContext.of(cfg))["metrics"]
    return out


@pytest.mark.slow
@pytest.mark.usefixtures("ray_session")
def test_every_phase_gives_the_same_results_on_ray_and_in_process(tmp_path: Path) -> None:
    import ray

    actors_before = len(ray._private.state.actors())
    on_ray = _phases(tmp_path / "ray", "ray")
    workers = [a for a in ray._private.state.actors().values() if a["ActorClassName"] == "RayEnvWorker"]
    assert len(ray._private.state.actors()) > actors_before and len(workers) >= 2  # the phases made Ray actors
    in_process = _phases(tmp_path / "inprocess", "inprocess")
    assert on_ray["train_pool"]["worker_restarts"] == 0
    for phase in ("calibrate", "variants", "explore", "train", "stress"):
        assert _untimed(on_ray[phase]) == _untimed(in_process[phase]), phase


def _untimed(summary: Any) -> Any:
    """A phase's summary less its wall-clock budget use (measured, not reproduced)."""
    from flows.reproduce import is_timing

    return {k: v for k, v in summary.items() if not is_timing(k)} if isinstance(summary, dict) else summary


@pytest.mark.usefixtures("ray_session")
def test_config_default_backend_follows_num_workers(tiny_config: Any) -> None:
    from agentflow_core.config import PoolConfig
    from agentflow_core.pool.inprocess import InProcessPool
    from agentflow_core.pool.ray_pool import RayPool
    from agentflow_core.variants import read_catalogue
    from tasks.compose import build_pool
    from tasks.paths import DataPaths
    from tasks.steps.variants import run_variants

    assert PoolConfig().backend == "ray" and PoolConfig(num_workers=0).backend == "inprocess"
    with pytest.raises(ValueError, match="needs num_workers >= 1"):
        PoolConfig(num_workers=0, backend="ray")
    cfg = tiny_config(pool={"num_workers": 1})
    run_variants(PhaseContext.of(cfg), DataPaths.of(cfg).variants)
    variants = read_catalogue(DataPaths.of(cfg).variants)
    pool = build_pool(PhaseContext.of(cfg), variants, 4, seed=0, standby=False)
    try:
        assert isinstance(pool, RayPool)
    finally:
        pool.close()
    cfg = tiny_config(pool={"num_workers": 0})
    assert isinstance(build_pool(PhaseContext.of(cfg), variants, 4, seed=0), InProcessPool)


# ---------------------------------------------------------------------------------------- CLI runs
def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)  # only the tests that name a cluster get one
    return {**env, **extra}


def _agentflow(*args: str, env: dict[str, str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(VENV_BIN / "agentflow"), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
    )


def _train_params(root: Path, total_steps: int) -> Path:
    return write_tiny_params(
        root,
        pool={"num_workers": 2, "backend": "ray"},
        train={
            "total_steps": total_steps,
            "eval_every_updates": 1000,
            "checkpoint_every_updates": 1,
            "bc_warm_start": False,
        },
    )


def _train_disrupted(params: Path, env: dict[str, str], cwd: Path, disrupt: Callable[[subprocess.Popen], None]) -> str:
    """``agentflow train`` in the background, ``disrupt`` once its first checkpoint exists; its output (exit 0 asserted)."""
    train = subprocess.Popen(
        [str(VENV_BIN / "agentflow"), "train", "--params", str(params)],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        ckpts = cwd / "data" / "checkpoints" / "checkpoints"
        _wait_for(lambda: any(ckpts.glob("update_*")) or train.poll() is not None, 180, "training to start")
        disrupt(train)
        out, _ = train.communicate(timeout=300)
    finally:
        if train.poll() is None:
            train.kill()
    assert train.returncode == 0, out[-3000:]
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray_start(*args: str, env: dict[str, str]) -> subprocess.Popen:
    """``ray start ... --block`` in its own process group, so the test can stop that node by the group id."""
    return subprocess.Popen(
        [str(VENV_BIN / "ray"), "start", "--block", "--num-cpus=1", "--disable-usage-stats", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    """SIGKILL the node's whole process tree (its group, plus any descendant that left it)."""
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    for child in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    proc.wait(timeout=30)


def _cluster_actors(address: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """The cluster's RayEnvWorker actors (read from its GCS by a separate driver)."""
    code = (
        "import json, ray\n"
        f"ray.init(address={address!r}, log_to_driver=False)\n"
        "actors = [dict(state=a['State'], node=a['Address']['NodeID']) for a in ray._private.state.actors().values()"
        " if a['ActorClassName'] == 'RayEnvWorker']\n"
        "print(json.dumps(actors))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def _wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture()
def cluster(tmp_path: Path) -> Iterator[tuple[str, dict[str, str], subprocess.Popen, subprocess.Popen]]:
    """A two-node Ray cluster on this machine, made as a user would: ``ray start --head`` + ``ray start --address``."""
    port = _free_port()
    address = f"127.0.0.1:{port}"
    # `ray start` clusters use token auth. A machine that never ran a local Ray has no ~/.ray/auth_token (and
    # `ray start --head` does not make one), so the cluster gets its own token, as an operator would hand out.
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32))
    # An in-process phase earlier in the suite made this process's own Ray loopback-only by switching
    # Ray's cluster mode off in os.environ; a `ray start` cluster a user makes has it on.
    env.pop(RAY_CLUSTER_SWITCH, None)
    head = _ray_start("--head", f"--port={port}", "--include-dashboard=false", env=env)
    second: subprocess.Popen | None = None
    try:
        _wait_for(lambda: _reachable(port), 90, "the Ray head")
        second = _ray_start(f"--address={address}", env=env)
        _wait_for(lambda: _alive_nodes(address, env) >= 2, 240, "the second node")
        yield address, env, head, second
    finally:
        if second is not None:
            _stop(second)
        _stop(head)


def _reachable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _alive_nodes(address: str, env: dict[str, str]) -> int:
    code = (
        f"import ray; ray.init(address={address!r}, log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    return int(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout.strip() else 0


@pytest.mark.slow
def test_explore_and_train_run_on_a_two_node_cluster_and_survive_losing_a_node(
    tmp_path: Path, cluster: tuple[str, dict[str, str], subprocess.Popen, subprocess.Popen]
) -> None:
    address, cluster_env, _head, second = cluster
    env = {**cluster_env, "RAY_ADDRESS": address}
    env.pop("RAY_AUTH_MODE")  # agentflow itself switches to token mode when a token is available
    params = _train_params(tmp_path, total_steps=24 * 512)
    assert _agentflow("variants", "--params", str(params), env=env, cwd=tmp_path).returncode == 0
    explore = _agentflow("explore", "--params", str(params), env=env, cwd=tmp_path)
    assert explore.returncode == 0, explore.stderr[-2000:]

    def lose_the_second_node(_train: subprocess.Popen) -> None:
        _stop(second)  # the second node and every process on it die mid-training (at once: the run is short)

    out = _train_disrupted(params, env, tmp_path, lose_the_second_node)
    assert f"ray ({address})" in out and "2 workers" in out
    summary = json.loads((tmp_path / "data" / "checkpoints" / "train_summary.json").read_text())
    assert len(summary["pool"]["nodes_used"]) == 2  # the pool placed its env workers on both nodes
    actors = _cluster_actors(address, cluster_env)  # read from the cluster's GCS by another driver
    assert {a["node"] for a in actors} >= set(summary["pool"]["nodes_used"]), actors
    assert summary["global_step"] >= 24 * 512
    assert summary["pool"]["worker_restarts"] >= 1 and summary["pool"]["recoveries"]
    assert "env worker(s) lost and replaced" in out


@pytest.mark.slow
def test_a_sigkilled_env_worker_is_replaced_and_training_completes(tmp_path: Path) -> None:
    params = _train_params(tmp_path, total_steps=24 * 512)
    env = _env()
    assert _agentflow("variants", "--params", str(params), env=env, cwd=tmp_path).returncode == 0

    def kill_a_stepping_worker(train: subprocess.Popen) -> None:
        from benchmarks.train_bench import busy_env_worker

        victim = busy_env_worker(train.pid, deadline=time.monotonic() + 60)
        assert victim is not None, "no env worker of the training run was seen stepping"
        os.kill(victim, signal.SIGKILL)

    out = _train_disrupted(params, env, tmp_path, kill_a_stepping_worker)
    assert "ray (local), 2 workers x 4 envs" in out
    summary = json.loads((tmp_path / "data" / "checkpoints" / "train_summary.json").read_text())
    assert summary["pool"]["worker_restarts"] >= 1
    assert summary["pool"]["recoveries"][0]["recovery_s"] > 0
    assert summary["pool"]["workers_started_ahead"] == 3  # both workers and the standby started with Ray
    # each rollout's seconds per worker, measured in the worker, and the rollout the kill fell in
    rows = summary["pool"]["worker_rollout_s"]
    assert len(rows) == summary["updates"] and all(len(row) == 2 and min(row) > 0.0 for row in rows)
    assert summary["pool"]["rollout_workers"] == [0, 1] and len(summary["pool"]["lost_in_rollouts"]) >= 1
    assert summary["global_step"] >= 24 * 512


def test_an_unreachable_cluster_fails_fast_naming_it_and_writes_nothing(tmp_path: Path) -> None:
    params = _train_params(tmp_path, total_steps=1024)
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    proc = _agentflow("train", "--params", str(params), env=_env(RAY_ADDRESS=address), cwd=tmp_path, timeout=60)
    assert proc.returncode != 0
    assert address in proc.stderr and "no Ray cluster reachable" in proc.stderr
    assert not (tmp_path / "data").exists() and not (tmp_path / ".agentflow").exists()


@pytest.mark.usefixtures("ray_session")
@pytest.mark.skipif(os.geteuid() != 0, reason="raising a process's priority back to nice 0 needs root or RLIMIT_NICE")
def test_ray_env_workers_run_at_normal_priority(tiny_config: Any) -> None:
    from agentflow_core.variants import read_catalogue
    from tasks.compose import build_pool
    from tasks.paths import DataPaths
    from tasks.steps.variants import run_variants

    cfg = tiny_config(pool={"num_workers": 2})
    run_variants(PhaseContext.of(cfg), DataPaths.of(cfg).variants)
    pool = build_pool(PhaseContext.of(cfg), read_catalogue(DataPaths.of(cfg).variants), 4, seed=0, standby=False)
    try:
        pids = pool.worker_pids()  # type: ignore[attr-defined]
        assert [psutil.Process(pid).nice() for pid in pids] == [0, 0]  # Ray itself starts workers at nice 15
    finally:
        pool.close()


@pytest.mark.timing
def test_an_unreachable_cluster_fails_within_30_s(tmp_path: Path) -> None:
    params = _train_params(tmp_path, total_steps=1024)
    started = time.monotonic()
    _agentflow("train", "--params", str(params), env=_env(RAY_ADDRESS=f"127.0.0.1:{_free_port()}"), cwd=tmp_path)
    assert time.monotonic() - started < 30
