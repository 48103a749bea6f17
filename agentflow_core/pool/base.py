"""How a pool's envs are built; the pool contract itself (:class:`EnvPool`, :class:`PoolBatch`) lives in
:mod:`agentflow_core.contracts` and is re-exported here.

Env factories are picklable callables from a variant spec to a :class:`SemanticEnv`-like env,
so a Ray worker builds its envs from data (the registry's :class:`EnvEntry` travels, live envs
never do).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from agentflow_core.contracts import (
    ENV_CRASH,
    ENV_INVALID,
    ENV_TIMEOUT,
    POOL_FAILURES,
    STEP_PENDING,
    WORKER_LOST,
    EnvPool,
    PoolBatch,
    VariantLike,
)
from agentflow_core.errors import AgentFlowError
from agentflow_core.semantics import Vocabulary

__all__ = [
    "ENV_CRASH",
    "ENV_INVALID",
    "ENV_TIMEOUT",
    "POOL_FAILURES",
    "STEP_PENDING",
    "WORKER_LOST",
    "EnvFactory",
    "EnvPool",
    "PoolBatch",
    "PoolEnv",
    "PoolError",
    "RegistryEnvFactory",
    "ReusingEnvFactory",
    "VariantLike",
    "as_variant_list",
]


class PoolError(AgentFlowError):
    """The pool cannot go on (workers keep dying, every variant is quarantined, ...)."""


T = TypeVar("T")


class InFlight(Generic[T]):
    """Work sent to the env workers, answered by :meth:`result`: the caller goes on meanwhile.

    Ray actors start at once; an in-process backend runs the work when :meth:`result` asks (the
    same work either way, so the same answer). ``started_at`` (``time.perf_counter``) is when the
    work began: at sending, or with ``deferred`` at the first :meth:`result`.
    """

    def __init__(self, gather: Callable[[], T], deferred: bool = False) -> None:
        self._gather: Callable[[], T] | None = gather
        self.started_at: float | None = None if deferred else time.perf_counter()

    def result(self) -> T:
        """Wait for the answer (once: the work is not sent again)."""
        if self._gather is None:
            raise PoolError("this work's result was already taken")
        gather, self._gather = self._gather, None
        if self.started_at is None:
            self.started_at = time.perf_counter()
        return gather()


@runtime_checkable
class PoolEnv(Protocol):
    """The env surface a pool steps: Gymnasium reset/step plus the mask of legal actions."""

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Gymnasium reset: the first observation and info of a new episode, reproducible from ``seed``."""

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Gymnasium step on a semantic action id: ``(obs, reward, terminated, truncated, info)``."""

    def action_masks(self) -> np.ndarray:
        """Legal actions in the current state; the pool hands them to the policy with the observation."""

    def close(self) -> None:
        """Release what the env holds; the pool calls it when it evicts or discards the env."""


class EnvFactory(Protocol):
    """Builds the env of one variant. Must be picklable: Ray workers receive it by value.

    A factory may also offer ``reuse(env, variant) -> PoolEnv | None`` (see
    :class:`ReusingEnvFactory`): workers then re-target idle envs of the same base env instead of
    building new ones.
    """

    def __call__(self, variant: VariantLike) -> PoolEnv:
        """A fresh env of ``variant``, not yet reset."""


@runtime_checkable
class ReusingEnvFactory(EnvFactory, Protocol):
    """A factory that can re-target an idle env of ``variant``'s base env to ``variant``."""

    def reuse(self, env: PoolEnv, variant: VariantLike) -> PoolEnv | None:
        """The env re-targeted to ``variant`` (behaving exactly like a fresh one), or None if it cannot be."""
        ...


@runtime_checkable
class PreparingEnvFactory(EnvFactory, Protocol):
    """A factory that can pay its one-off costs (imports, shared adapters) before its first build."""

    def prepare(self) -> None:
        """Import the env classes and build what every env of a base env shares, without building an env."""
        ...


@dataclass(frozen=True)
class RegistryEnvFactory:
    """Build variants' envs from registry entries (plain data), sharing one adapter per base env.

    Adapters are stateless rule engines over their mapping, so one instance per base env serves
    every live env of a worker; building it per env would re-validate the mapping schema each time
    and multiply the memory of the compiled rules by the number of live envs.
    """

    entries: Mapping[str, Any]  # base_env_id -> agentflow_core.registry.EnvEntry
    _adapters: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    _lock: Any = field(default_factory=threading.Lock, compare=False, repr=False)

    def __call__(self, variant: VariantLike) -> PoolEnv:
        """The variant's physical env wrapped in a SemanticEnv, with the adapter shared across its base env."""
        from agentflow_core.adapters import load_object
        from agentflow_core.envs.semantic_env import SemanticEnv

        entry = self.entries[variant.base_env_id]
        scenario = entry.scenario(variant.params)
        physical = load_object(entry.class_path)(scenario, variant.env_id, **entry.kwargs)
        return SemanticEnv(physical, self._adapter(entry), max_episode_steps=scenario.max_episode_steps)

    def prepare(self) -> None:
        """Import every entry's env class and build its shared adapter now.

        A fresh worker process otherwise pays them inside its first timed reset of each base env:
        importing the order-database env (SQLAlchemy) alone takes 0.23 s of CPU here, which a
        tight step timeout (the soak's 0.25 s) ends as an ``env_timeout``.
        """
        from agentflow_core.adapters import load_object

        for entry in self.entries.values():
            load_object(entry.class_path)
            self._adapter(entry)

    def reuse(self, env: PoolEnv, variant: VariantLike) -> PoolEnv | None:
        """Re-target an idle env of ``variant``'s base env via its physical env's ``reconfigure``.

        The physical env (and its connection, client or database) is kept; the semantic face is
        rebuilt around it with the base env's shared adapter, exactly as :meth:`__call__` builds it.
        """
        from agentflow_core.envs.semantic_env import SemanticEnv

        physical = getattr(env, "physical", None)
        if physical is None or not callable(getattr(physical, "reconfigure", None)):
            return None
        entry = self.entries[variant.base_env_id]
        scenario = entry.scenario(variant.params)
        physical.reconfigure(scenario, variant.env_id)
        return SemanticEnv(physical, self._adapter(entry), max_episode_steps=scenario.max_episode_steps)

    def _adapter(self, entry: Any) -> Any:
        with self._lock:
            adapter = self._adapters.get(entry.env_id)
            if adapter is None:
                adapter = entry.build_adapter()
                self._adapters[entry.env_id] = adapter
        return adapter

    @property
    def vocabulary(self) -> Vocabulary:
        """The one vocabulary its entries' mappings speak (the pool's widths); mixing processes is an error."""
        found = {entry.vocabulary for entry in self.entries.values()}  # registry EnvEntry
        if len(found) > 1:
            raise PoolError(f"base envs of more than one process in one pool: {sorted(v.version for v in found)}")
        if not found:
            raise PoolError("a pool over no base envs speaks no process's vocabulary")
        return found.pop()

    def __getstate__(self) -> dict[str, Any]:
        return {"entries": dict(self.entries)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "entries", state["entries"])
        object.__setattr__(self, "_adapters", {})
        object.__setattr__(self, "_lock", threading.Lock())


def factory_vocabulary(factory: Any) -> Vocabulary:
    """The vocabulary of the envs ``factory`` builds (its ``vocabulary``): the pool's widths and names."""
    vocabulary = getattr(factory, "vocabulary", None)
    if not isinstance(vocabulary, Vocabulary):
        raise PoolError(f"{type(factory).__name__}: an env factory declares the vocabulary its envs speak (vocabulary)")
    return vocabulary


def as_variant_list(variants: Sequence[VariantLike]) -> list[VariantLike]:
    """Validate a catalogue for a pool: non-empty and unique env_ids (they key the LRU and routing)."""
    items = list(variants)
    if not items:
        raise PoolError("the variant catalogue is empty")
    seen: set[str] = set()
    for v in items:
        if v.env_id in seen:
            raise PoolError(f"duplicate variant env_id {v.env_id!r} in the catalogue")
        seen.add(v.env_id)
    return items
