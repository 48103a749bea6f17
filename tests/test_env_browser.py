"""The web channel on a real browser: the DOM reads back the simulated storefront's pages, step for step.

One Chromium for the whole session (``browser_session``); a killed process leaves no Chromium behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import gymnasium
import httpx
import numpy as np
import pytest
import yaml
from conftest import owned_chromium_pids
from gymnasium.utils.env_checker import check_env

from agentflow_core.envs.base import INAPPLICABLE_REWARD, Scenario
from agentflow_core.envs.experts import expert_for
from agentflow_core.envs.web_app.server import MAX_BODY_BYTES, acquire_shared_storefront, release_shared_storefront
from agentflow_core.envs.web_browser import BrowserCheckoutEnv, BrowserHost
from agentflow_core.envs.web_checkout import WebCheckoutEnv
from agentflow_core.registry import EnvRegistry
from agentflow_core.semantics import SemanticAction

REPO = Path(__file__).resolve().parents[1]
SIM = EnvRegistry(REPO / "configs/envs", yaml.safe_load).get("web_checkout_v2")
REAL = EnvRegistry(REPO / "configs/real_envs", yaml.safe_load).get("web_browser_v1")

pytestmark = pytest.mark.usefixtures("browser_session")


def _same_step(sim: Any, real: Any) -> None:
    """Equal observation vectors, rewards, endings and infos (the mask compared as an array)."""
    for a, b in zip(sim, real, strict=True):
        if isinstance(a, np.ndarray):
            assert np.array_equal(a, b)
        elif isinstance(a, dict):
            assert {k: v for k, v in a.items() if k != "action_mask"} == {
                k: v for k, v in b.items() if k != "action_mask"
            }
            assert np.array_equal(a["action_mask"], b["action_mask"])
        else:
            assert a == b


@pytest.mark.parametrize(
    "params",
    [
        {"start_stage": "login", "balance": 60.0, "network": "packet_loss_5%", "card_decline_rate": 0.5},
        {"start_stage": "product_detail", "user_tier": "vip", "inventory": 0},
        {"start_stage": "payment", "user_tier": "blocked"},
    ],
    ids=["funds-loss-declines", "vip-out-of-stock", "blocked"],
)
def test_browser_pages_equal_the_simulated_pages_step_for_step(params: dict[str, Any]) -> None:
    """Expert then random legal actions: the raw DOM observation, reward and info equal the simulator's."""
    sim, real = SIM.make(params, "web_v0_same"), REAL.make(params, "web_v0_same")
    expert, rng = expert_for("web_checkout"), np.random.default_rng(5)
    try:
        for seed in (1, 2):
            reset_sim, reset_real = sim.reset(seed=seed), real.reset(seed=seed)
            _same_step(reset_sim, reset_real)
            assert real.physical._obs == sim.physical._obs  # type: ignore[attr-defined]
            obs, info, done, n = reset_sim[0], reset_sim[1], False, 0
            while not done:
                legal = np.flatnonzero(info["action_mask"])
                action = expert.act(obs, info["action_mask"]) if seed == 1 else int(rng.choice(legal))
                step_sim, step_real = sim.step(action), real.step(action)
                _same_step(step_sim, step_real)
                assert real.physical._obs == sim.physical._obs  # type: ignore[attr-defined]
                obs, info, done, n = step_sim[0], step_sim[4], step_sim[2] or step_sim[3], n + 1
                if n == 8:  # the random walk: enough steps to leave the funnel, bounded for test time
                    break
    finally:
        sim.close()
        real.close()


def test_typed_card_travels_with_the_click_and_an_absent_button_sends_nothing() -> None:
    """``type`` fills the live input; paying then fails on the typed number, as in the simulator."""
    scenario = Scenario(start_stage="payment")
    real, sim = BrowserCheckoutEnv(scenario, "web"), WebCheckoutEnv(scenario, "web")
    try:
        real.reset(seed=3), sim.reset(seed=3)
        typed = {"type": "type", "field": "card_number", "text": "1234"}
        got, expected = real.step(typed), sim.step(typed)
        assert got.obs["fields"] == expected.obs["fields"] and got.info == expected.info
        # The one known difference: the page text ("card ending ...") follows the typed value only after
        # the next request in the browser, at once in the simulator.
        assert "ending 0002" in got.obs["text"] and "ending 1234" in expected.obs["text"]
        pay = {"type": "click", "target": "#pay-now"}
        got, expected = real.step(pay), sim.step(pay)
        assert got.obs == expected.obs and got.reward == expected.reward and got.info == expected.info
        assert "card number is incomplete" in got.obs["text"]
        # A button the page lacks: nothing happens in the browser (the banner stays up); the simulator
        # re-renders the page without its banner. Same reward and info.
        absent = {"type": "click", "target": "#add-to-cart"}
        after, expected = real.step(absent), sim.step(absent)
        assert after.obs == got.obs and expected.obs["banner"] is None
        assert after.reward == expected.reward == INAPPLICABLE_REWARD and after.info == expected.info
        assert real._seq == 1  # one request reached the server: the pay click (typing is client side)
    finally:
        real.close()


def test_storefront_answers_bad_requests_with_4xx() -> None:
    server = acquire_shared_storefront()
    try:
        with httpx.Client(base_url=server.url) as client:
            assert client.get("/static/app.js").status_code == 200
            assert client.post("/api/act", json={"type": "click", "target": "#x"}).status_code == 401
            assert client.post("/api/session", content=b"[1]").status_code == 400
            assert client.post("/api/session", json={"scenario": {"colour": "red"}}).status_code == 400
            big = b"{" + b" " * MAX_BODY_BYTES + b"}"
            assert client.post("/api/session", content=big).status_code == 413
            created = client.post("/api/session", json={"scenario": {}, "seed": 1})
            assert created.status_code == 201 and "HttpOnly" in created.headers["set-cookie"]
            assert client.post("/api/act", json={"type": "navigate", "url": "/"}).status_code == 400
            answered = client.post("/api/act", json={"type": "submit", "form": "login", "fields": {}})
            assert answered.status_code == 200 and answered.json()["attrs"]["data-page"] == "home"
    finally:
        release_shared_storefront(server)


def test_gymnasium_id_passes_check_env() -> None:
    env = gymnasium.make("agentflow_core.gym_registration:agentflow/WebBrowser-v1", start_stage="payment")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env.unwrapped, skip_render_check=True)
    assert [str(w.message) for w in caught if "gymnasium" in w.filename] == []
    obs, info = env.reset(seed=0)
    _, reward, terminated, _, _ = env.step(int(SemanticAction.SUBMIT_PAYMENT))
    assert terminated and reward > 0
    env.close()


CHILD = """
import sys, time
from agentflow_core.envs.base import Scenario
from agentflow_core.envs.web_browser import BrowserCheckoutEnv, live_browsers
env = BrowserCheckoutEnv(Scenario(), "x"); env.reset(seed=0); env.close()
print("closed", live_browsers(), flush=True)
sys.stdin.readline()  # the parent has counted this process's Chromium: none after close
env = BrowserCheckoutEnv(Scenario(), "y"); env.reset(seed=0)
print("ready", flush=True)
time.sleep(120)
"""


def test_close_and_a_killed_process_leave_no_chromium() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().split() == ["closed", "0"]
        assert owned_chromium_pids(child.pid) == []
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "ready"
        assert owned_chromium_pids(child.pid) != []
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
        deadline = time.monotonic() + 15
        while owned_chromium_pids(child.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert owned_chromium_pids(child.pid) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_a_missing_chromium_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"apt-get install -y chromium"):
        BrowserHost(str(tmp_path / "no-chromium"))
