"""A real channel process that dies mid-run costs the episode it was running, not the sim-to-real run.

The payment API server process, the refund service's process (a process file's declared real channel),
or the embedded PostgreSQL's postmaster, is killed (SIGKILL) as one real episode of a paired run starts: that episode is recorded as a failed real episode with its
failure reason, the service is started again (a new process) and every later episode runs on it.
A second death is one AgentFlowError.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.errors import AgentFlowError
from agentflow_core.evaluation.sim_to_real import paired_episodes, summarize
from agentflow_core.variants import VariantSpec
from tasks.config_io import load_config
from tasks.context import PhaseContext
from tasks.real_channels import open_real_channels, real_channel_names

REPO = Path(__file__).resolve().parents[2]


def _first_allowed(obs: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.argmax(mask, axis=1)


BASES = {
    "payment_api": "payment_api_v1",
    "order_db": "order_db_v1",
    "refund_api": "refund_api_v1",
    "refund_db": "refund_db_v1",
}
PARAMS = {"payment_api": "params-checkout.yaml", "order_db": "params-checkout.yaml", "refund_api": "params-refund.yaml"}


def _variant(family: str, i: int) -> VariantSpec:
    return VariantSpec(f"{BASES[family]}_{i}", BASES[family], family, {}, f"hash{i}")


@pytest.mark.parametrize("family", ["payment_api", "order_db", "refund_api", "refund_db"])
def test_a_killed_channel_process_costs_one_episode_and_is_restarted_once(family: str) -> None:
    ctx = PhaseContext.of(load_config(REPO / PARAMS.get(family, "params-refund.yaml")))
    variants, seeds = [_variant(family, i) for i in range(5)], list(range(5))
    with open_real_channels(ctx, [family], {family: BASES[family]}) as channels:
        first_pid = channels.pids[family]
        made = []

        def make_real(variant: VariantSpec) -> SemanticEnv:
            env = channels.make_real(variant)
            made.append(variant.env_id)
            if len(made) == 3:  # the third real episode: its server dies under it
                os.kill(channels.pids[family], signal.SIGKILL)
                if family.endswith("_api"):
                    os.waitpid(channels.pids[family], 0)  # our child: reap it
            return env

        episodes = paired_episodes(variants, seeds, channels.make_sim, make_real, _first_allowed, lambda: 0.0, channels)
        assert channels.pids[family] != first_pid and channels.alive(family)
        failed = [e for e in episodes if e.real.failure_reason is not None]
        assert [e.env_id for e in failed] == [f"{BASES[family]}_2"]
        assert "real channel process died" in str(failed[0].real.failure_reason)
        assert all(e.real.actions for e in episodes if e.real.failure_reason is None)  # the others ran
        report = summarize(episodes, real_channel_names(ctx.process))
        assert report.families[0].real_channel_failures == 1
        assert report.to_dict()["real_failures"][0]["env_id"] == f"{BASES[family]}_2"
        channels.probes[family] = lambda: False  # it "dies" again: no second restart
        with pytest.raises(AgentFlowError, match="died again after a restart"):
            paired_episodes(
                variants[:1], seeds[:1], channels.make_sim, channels.make_real, _first_allowed, lambda: 0.0, channels
            )
