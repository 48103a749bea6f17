"""Gymnasium ids for the channel families (the three simulated ones and the real browser), for tools that speak only ``gymnasium.make``.

Importing this module registers the ids (that is its sole purpose), so
``gymnasium.make("agentflow_core.gym_registration:agentflow/WebCheckout-v2")`` works without
any other setup; nothing else in the core registers at import. Keyword arguments of ``make``
override :class:`~agentflow_core.envs.base.Scenario` fields, e.g.
``gymnasium.make("agentflow/OrderDB-v1", network="packet_loss_5%")``.

Episode length: the spec's ``max_episode_steps`` is the Scenario default, where the channel
itself truncates (with ``failure_reason="max_steps"``). ``gymnasium.make(..., max_episode_steps=N)``
only sets gymnasium's TimeLimit, so it can shorten episodes but not lengthen them past the
Scenario's limit.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import gymnasium

from agentflow_core.envs.base import Scenario
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.registry import EnvEntry, entry_from_config

ENTRY_POINT = "agentflow_core.gym_registration:make_semantic_env"

# gymnasium id -> the base env config it builds (mapping resolved in agentflow_core/mappings/).
GYM_ENVS: dict[str, dict[str, str]] = {
    "agentflow/WebCheckout-v2": {
        "env_id": "web_checkout_v2",
        "process": "checkout",
        "class_path": "agentflow_core.envs.web_checkout:WebCheckoutEnv",
        "adapter": "web",
        "mapping": "web_checkout_v2.json",
    },
    "agentflow/OrderDB-v1": {
        "env_id": "order_db_v1",
        "process": "checkout",
        "class_path": "agentflow_core.envs.order_db:OrderDBEnv",
        "adapter": "db",
        "mapping": "order_db_v1.json",
    },
    "agentflow/PaymentAPI-v1": {
        "env_id": "payment_api_v1",
        "process": "checkout",
        "class_path": "agentflow_core.envs.payment_api:PaymentAPIEnv",
        "adapter": "api",
        "mapping": "payment_api_v1.json",
    },
    # The web channel in a real headless Chromium (Playwright; /usr/bin/chromium) on the storefront web app.
    "agentflow/WebBrowser-v1": {
        "env_id": "web_browser_v1",
        "process": "checkout",
        "class_path": "agentflow_core.envs.web_browser:BrowserCheckoutEnv",
        "adapter": "web",
        "mapping": "web_browser_v1.json",
    },
}
_BY_BASE_ID = {config["env_id"]: config for config in GYM_ENVS.values()}


@cache
def packaged_entry(base_env_id: str) -> EnvEntry:
    """The validated entry of one packaged base env (mapping from the installed package)."""
    return entry_from_config(_BY_BASE_ID[base_env_id], Path(__file__))


def make_semantic_env(base_env_id: str, **scenario_overrides: Any) -> SemanticEnv:
    """Entry point of the gymnasium ids: default Scenario, keyword arguments override its fields."""
    return packaged_entry(base_env_id).make(scenario_overrides)


def register_envs() -> list[str]:
    """Register the ids that are not registered yet (idempotent); returns all agentflow ids."""
    for gym_id, config in GYM_ENVS.items():
        if gym_id not in gymnasium.registry:
            gymnasium.register(
                id=gym_id,
                entry_point=ENTRY_POINT,
                kwargs={"base_env_id": config["env_id"]},
                max_episode_steps=Scenario().max_episode_steps,
            )
    return list(GYM_ENVS)


register_envs()
