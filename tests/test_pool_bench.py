"""The semantic-overhead benchmark compares like with like: its replay sides play the pool's episodes.

The pool reports each episode's (variant, episode seed); a fresh SemanticEnv reset with them
reproduces the episode, and the benchmark's raw and semantic SyncVectorEnvs, replaying the
record, end their episodes on exactly the steps the pool's do.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pool_fixtures import registry_catalogue

from agentflow_core.config import PoolConfig
from agentflow_core.pool.inprocess import InProcessPool
from agentflow_core.semantics import N_ACTIONS
from benchmarks.semantic_overhead import semantic_overhead

_, FACTORY, VARIANTS = registry_catalogue()


def test_pool_infos_name_each_episodes_seed_and_replaying_it_reproduces_the_episode() -> None:
    sample = VARIANTS[:: max(len(VARIANTS) // 12, 1)][:12]
    pool = InProcessPool(sample, FACTORY, 4, PoolConfig(num_workers=1, scheduler="uniform"), seed=5)
    batch = pool.reset(seed=5)
    rng = np.random.default_rng(0)
    # slot -> (variant index, episode seed, first obs, [(action, obs, reward, done)])
    episodes: list[tuple[int, int, np.ndarray, list[tuple[int, np.ndarray, float, bool]]]] = []
    current = {
        s: (info["variant_index"], info["episode_seed"], batch.obs[s].copy(), []) for s, info in enumerate(batch.infos)
    }
    for _ in range(60):
        actions = rng.integers(0, N_ACTIONS, size=4)
        batch = pool.step(actions)
        for s, info in enumerate(batch.infos):
            current[s][3].append(
                (int(actions[s]), batch.final_obs[s].copy(), float(batch.reward[s]), bool(batch.done[s]))
            )
            if batch.done[s]:
                episodes.append(current[s])
                current[s] = (info["next_variant_index"], info["next_episode_seed"], batch.obs[s].copy(), [])
    pool.close()
    assert len(episodes) >= 8
    assert len({seed for _, seed, _, _ in episodes}) == len(episodes)  # a fresh seed per episode
    for v, seed, first_obs, steps in episodes:
        env = FACTORY(sample[v])
        obs, _ = env.reset(seed=seed)
        np.testing.assert_array_equal(obs, first_obs)
        for action, want_obs, want_reward, want_done in steps:
            obs, reward, terminated, truncated, _ = env.step(action)
            np.testing.assert_array_equal(obs, want_obs)
            assert np.float32(reward) == np.float32(want_reward) and (terminated or truncated) == want_done
        env.close()


def test_semantic_overhead_sides_play_the_same_trajectories() -> None:
    out = semantic_overhead(VARIANTS, FACTORY, num_envs=12, steps=24, scheduler="plr_coverage", warmup=8, blocks=3)
    assert out["overhead_trajectory_match"] == 1.0
    assert out["overhead_episodes"] > 12  # episodes ended and were replayed, not only the first ones
    assert out["overhead_steps"] == 24 and out["overhead_envs"] == 12
    # The replay sides keep idle envs like the pool does: not one env per slot and variant.
    assert out["overhead_raw_envs_created"] <= out["overhead_envs"] * 3
    assert out["raw_step_us"] > 0 and out["pool_step_us"] > 0


def test_repeated_runs_count_a_target_as_met_only_if_every_run_met_it(tmp_path: Path) -> None:
    from agentflow_core.atomic import write_json
    from benchmarks.markdown import render_benchmarks
    from benchmarks.runs import combine_runs

    pool_runs = [
        {
            "semantic_overhead": x,
            "targets": {"semantic_overhead": 0.25},
            "targets_met": {"semantic_overhead": x <= 0.25},
        }
        for x in (0.18, 0.27, 0.15)
    ]
    pool = combine_runs(pool_runs)
    assert pool["semantic_overhead"] == 0.15 and pool["repeats"] == 3  # the last run's values ...
    assert pool["runs"] == {"semantic_overhead": [0.18, 0.27, 0.15]}  # ... and every run's target metrics
    assert pool["targets_met"] == {"semantic_overhead": False}
    ppo = combine_runs([{"sps_ratio_vs_sb3": x, "targets": {"sps_ratio_vs_sb3": 3.0}} for x in (3.4, 3.6)])
    write_json(tmp_path / "pool.json", pool)
    write_json(tmp_path / "ppo.json", ppo)
    notes = tmp_path / "measurements"
    notes.mkdir()
    (notes / "one-off.md").write_text("## A removed path, measured once\n\n| x | 1 |\n")
    text = render_benchmarks(tmp_path, notes)
    # listed last by title and path; the narrative itself stays in its file
    assert text.rstrip().endswith(
        f"## One-off measurements\n\n- A removed path, measured once: `{notes.as_posix()}/one-off.md`"
    )
    assert "| x | 1 |" not in text
    assert "`agentflow bench pool --repeat 3`" in text and "`agentflow bench ppo --repeat 2`" in text
    assert "| `semantic_overhead` | 0.15 | 0.25 | **no** | 0.18 / 0.27 / 0.15 |" in text
    assert "| `sps_ratio_vs_sb3` | 3.6 | 3 | yes | 3.4 / 3.6 |" in text
    with pytest.raises(ValueError, match="at least one"):
        combine_runs([])


def test_live_layout_keeps_every_worker_within_the_config_bound() -> None:
    from agentflow_core.config import MAX_ENVS
    from agentflow_core.variants import stable_worker
    from benchmarks.pool_bench import live_layout

    env_ids = [f"env_{i}" for i in range(2 * MAX_ENVS - 100)]
    assert live_layout(env_ids, 300) == (1, 300)
    workers, max_live = live_layout(env_ids, len(env_ids))
    assert workers >= 2 and max_live == MAX_ENVS
    slices = np.bincount([stable_worker(e, workers) for e in env_ids], minlength=workers)
    assert slices.max() <= MAX_ENVS and slices.sum() == len(env_ids)
    PoolConfig(num_workers=workers, max_live_per_worker=max_live)  # within the bounds: no ValidationError


def test_the_all_live_probe_holds_every_variant_live_beyond_one_workers_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the bound at 8 the 24 variants are spread over workers of at most 8 each, and all 24 are live at once."""
    import benchmarks.pool_bench as pool_bench

    monkeypatch.setattr(pool_bench, "MAX_ENVS", 8)
    sample = VARIANTS[:24]
    workers, max_live = pool_bench.live_layout([v.env_id for v in sample], len(sample))
    assert workers >= 3 and max_live == 8
    out = pool_bench._memory_probe([v.to_json() for v in sample], FACTORY, len(sample), workers, max_live)
    assert out["live_envs"] == len(sample)
