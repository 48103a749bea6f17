"""Pool test fixtures: a tiny physical env + adapter, and a faulty env that fails on command.

The tiny "counter shop" is a real physical env behind a real :class:`BaseSemanticAdapter` and
:class:`SemanticEnv`, small enough that pool behaviour (batching, autoreset, faults) is what the
tests measure. Faults are declared per variant env_id in a picklable factory, so the same
fixture runs in-process and inside Ray actors.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import resource
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentflow_core.adapters.base import BaseSemanticAdapter
from agentflow_core.envs.base import Scenario, StepResult
from agentflow_core.envs.semantic_env import SemanticEnv
from agentflow_core.semantics import CHECKOUT, Vocabulary
from agentflow_core.variants import VariantSpec, content_hash

TINY_MAPPING: dict[str, Any] = {
    "family": "tiny_shop",
    "template": "web",
    "version": 1,
    "token_rules": [
        {"id": "login", "when": {"page": "login"}, "emit": ["LOGGED_OUT"]},
        {"id": "shop", "when": {"page": "shop"}, "emit": ["LOGGED_IN", "PRODUCT_VIEWED"]},
        {"id": "paid", "when": {"page": "paid"}, "emit": ["PAYMENT_SUCCESS"]},
    ],
    "feature_rules": [{"id": "views", "feature": "cart_items", "source": "views", "scale": 0.1}],
    "actions": {"LOGIN": {"type": "login"}, "VIEW_PRODUCT": {"type": "view"}, "SUBMIT_PAYMENT": {"type": "pay"}},
}


# The tiny shop speaks checkout's words but is its own process: it declares no legal actions, so its
# masks are its mapping's (the three mapped actions) rather than checkout's funnel.
TINY_VOCABULARY = dataclasses.replace(CHECKOUT, contract=None)


class TinyAdapter(BaseSemanticAdapter):
    """Equality rules on the raw dict; features read straight from it."""

    template = "web"

    def __init__(
        self, mapping: Mapping[str, Any], source: str = "<mapping>", vocabulary: Vocabulary = TINY_VOCABULARY
    ) -> None:
        super().__init__(mapping, source, vocabulary=vocabulary)

    def match(self, when: Mapping[str, Any], raw: Any) -> bool:
        return all(raw.get(k) == v for k, v in when.items())

    def extract(self, source: str, raw: Any) -> float | None:
        return raw.get(source)


@dataclass(frozen=True)
class Fault:
    """Fail at ``at_step`` of every episode: ``crash`` raises, ``hang`` sleeps ``hang_s``, ``spin`` busy-loops ``hang_s``, ``nan`` returns NaN.

    ``gil_sleep`` sleeps ``hang_s`` in a C call that keeps the GIL: no thread of the process runs meanwhile.
    """

    kind: str
    at_step: int = 1
    hang_s: float = 2.0


class TinyShopEnv:
    """LOGIN -> shop page; VIEW_PRODUCT counts views; SUBMIT_PAYMENT in the shop pays (terminated, +10)."""

    family, version = "tiny_shop", 1

    def __init__(self, scenario: Scenario, env_id: str, fault: Fault | None = None) -> None:
        self.scenario, self.env_id, self.fault = scenario, env_id, fault
        self.page, self.views, self.t = "login", 0, 0

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        self.page, self.views, self.t = "login", 0, 0
        return self._raw(), {"env_id": self.env_id, "step_id": 0, "failure_reason": None}

    def _raw(self) -> dict[str, Any]:
        return {"page": self.page, "views": self.views}

    def step(self, native_action: Mapping[str, Any]) -> StepResult:
        self.t += 1
        if self.fault is not None and self.t == self.fault.at_step:
            if self.fault.kind == "crash":
                raise RuntimeError("injected crash")
            if self.fault.kind == "hang":
                time.sleep(self.fault.hang_s)
            if self.fault.kind == "gil_sleep":  # a C call that keeps the GIL (PyDLL does not release it)
                ctypes.PyDLL(None).sleep(int(self.fault.hang_s))
            if self.fault.kind == "spin":  # busy loop in Python: holds a core and competes for the GIL
                until = time.monotonic() + self.fault.hang_s
                while time.monotonic() < until:
                    pass
            if self.fault.kind == "nan":
                return StepResult(
                    {"page": self.page, "views": float("nan")},
                    -0.01,
                    False,
                    False,
                    {"env_id": self.env_id, "step_id": self.t, "failure_reason": None},
                )
        kind, reward, terminated = native_action.get("type"), -0.01, False
        if kind == "login":
            self.page = "shop"
        elif kind == "view" and self.page == "shop":
            self.views += 1
        elif kind == "pay" and self.page == "shop":
            self.page, reward, terminated = "paid", 10.0, True
        else:
            reward = -0.05
        truncated = not terminated and self.t >= self.scenario.max_episode_steps
        info = {
            "env_id": self.env_id,
            "step_id": self.t,
            "failure_reason": "max_steps" if truncated else None,
            "applied": reward != -0.05,
        }  # declared action risk counts only for actions that took effect
        return StepResult(self._raw(), reward, terminated, truncated, info)

    def close(self) -> None:
        self.page = "closed"


@dataclass(frozen=True)
class TinyFactory:
    """Picklable factory: tiny shop envs, with the faults declared per variant env_id."""

    faults: dict[str, Fault] = field(default_factory=dict, hash=False)
    max_episode_steps: int = 50
    vocabulary: Vocabulary = field(default=CHECKOUT, hash=False, repr=False)  # the pool sizes its rows by it

    def __call__(self, variant: Any) -> SemanticEnv:
        scenario = Scenario(max_episode_steps=self.max_episode_steps)
        physical = TinyShopEnv(scenario, variant.env_id, self.faults.get(variant.env_id))
        return SemanticEnv(physical, TinyAdapter(TINY_MAPPING), max_episode_steps=self.max_episode_steps)


def tiny_variants(n: int) -> list[VariantSpec]:
    """``n`` distinct tiny variants (env_id tiny_shop_v1_<i>)."""
    specs = []
    for i in range(n):
        params = {"max_episode_steps": 50, "inventory": i}
        specs.append(
            VariantSpec(
                f"tiny_shop_v1_{i:04d}", "tiny_shop_v1", "tiny_shop", params, content_hash("tiny_shop_v1", params)
            )
        )
    return specs


def registry_catalogue(samples_per_combination: int = 1) -> tuple[list[Any], Any, list[VariantSpec]]:
    """(registry entries, RegistryEnvFactory, demo variants) over the shipped ``configs/envs`` families."""
    from pathlib import Path

    import yaml

    from agentflow_core.config import VariantsConfig
    from agentflow_core.pool.base import RegistryEnvFactory
    from agentflow_core.registry import EnvRegistry
    from agentflow_core.variants import BaseEnvInfo, generate_variants

    entries = EnvRegistry(Path(__file__).resolve().parents[1] / "configs" / "envs", yaml.safe_load).entries()
    cfg = VariantsConfig(samples_per_combination=samples_per_combination)
    variants = generate_variants(
        [BaseEnvInfo(e.env_id, e.family, e.version) for e in entries],
        cfg.dimensions,
        cfg.perturbations,
        cfg.samples_per_combination,
        seed=0,
        scenario=CHECKOUT.scenario,
    )
    return entries, RegistryEnvFactory({e.env_id: e for e in entries}), variants


def may_leave_ray_nice() -> bool:
    """Whether a process of this user may go from Ray's worker nice 15 back to 0 (root, or RLIMIT_NICE >= 20)."""
    soft = resource.getrlimit(resource.RLIMIT_NICE)[0]
    return os.geteuid() == 0 or soft == resource.RLIM_INFINITY or soft >= 20
