"""The per-slot infos of a pool step, built when first read.

A pool step keeps, per slot, what its info dict says (the slot's variant before the autoreset, the
step id, failure reason, hot tokens and risk of the step) plus the few entries the step added to
some slots (a pending step, an episode's end, the next episode); :class:`LazyInfoBatch` turns them
into the list of dicts on the first read of ``infos``. A caller that reads no info (a benchmark's
timed loop) pays for none; one that does gets the very dicts, values and key order an
eager build gives, built a whole batch at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from agentflow_core.contracts import PoolBatch

TOKEN_CACHE_LIMIT = 4096  # distinct hot-token rows kept (a business state each, a few hundred)
# A step's infos while the driver writes them: slot -> entries (the step's additions), or the built list.
SlotInfoRows = MutableMapping[int, dict[str, Any]] | list[dict[str, Any]]
INFO_KEYS = ("env_id", "variant_index", "variant_hash", "step_id", "failure_reason", "tokens", "risk")


class SlotInfos:
    """Builds a step's per-slot infos of one pool's catalogue and vocabulary (token names cached per hot row)."""

    def __init__(self, env_ids: Sequence[str], variant_hashes: Sequence[str], token_names: np.ndarray) -> None:
        self._env_ids = np.empty(len(env_ids), dtype=object)
        self._env_ids[:] = list(env_ids)
        self._hashes = np.empty(len(variant_hashes), dtype=object)
        self._hashes[:] = list(variant_hashes)
        self._token_names = token_names
        self._names_of_row: dict[bytes, list[str]] = {}  # a row's hot-token bytes -> its token names

    def tokens(self, hot: np.ndarray) -> list[list[str]]:
        """The token names of each row of hot-token flags, a fresh list per row (a business state looked up once)."""
        n, width = hot.shape
        if width == 0:
            return [[] for _ in range(n)]
        keys: list[Any] = np.ascontiguousarray(hot).view(np.dtype((np.void, width))).ravel().tolist()
        cache = self._names_of_row
        names: list[Any] = list(map(cache.get, keys))
        for i in [i for i, found in enumerate(names) if found is None]:
            if len(cache) >= TOKEN_CACHE_LIMIT:
                cache.clear()
            names[i] = cache[keys[i]] = self._token_names[hot[i]].tolist()
        return list(map(list, names))

    def build(
        self,
        variant: np.ndarray,
        step_id: np.ndarray,
        failure_reason: list[str | None],
        hot: np.ndarray,
        risk: np.ndarray,
        extras: Mapping[int, dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """One info dict per slot (keys in :data:`INFO_KEYS` order), then each slot's ``extras`` added."""
        columns = zip(
            self._env_ids[variant].tolist(),
            variant.tolist(),
            self._hashes[variant].tolist(),
            step_id.tolist(),
            failure_reason,
            self.tokens(hot),
            risk.tolist(),
            strict=True,
        )
        infos = [  # a dict display: twice as fast as dict(zip(INFO_KEYS, row))
            {
                "env_id": env_id,
                "variant_index": v,
                "variant_hash": variant_hash,
                "step_id": step,
                "failure_reason": reason,
                "tokens": tokens,
                "risk": r,
            }
            for env_id, v, variant_hash, step, reason, tokens, r in columns
        ]
        for slot, extra in extras.items():
            infos[slot].update(extra)
        return infos


class LazyInfoBatch(PoolBatch):
    """A :class:`PoolBatch` whose ``infos`` are built by ``build`` on first read (then kept; pickled built)."""

    def __init__(
        self,
        obs: np.ndarray,
        action_mask: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_obs: np.ndarray,
        build: Callable[[], list[dict[str, Any]]],
        pending: np.ndarray | None = None,
    ) -> None:
        self._build: Callable[[], list[dict[str, Any]]] | None = build
        self._infos: list[dict[str, Any]] | None = None
        self.obs, self.action_mask, self.reward = obs, action_mask, reward
        self.terminated, self.truncated, self.final_obs, self.pending = terminated, truncated, final_obs, pending

    @property  # type: ignore[override]
    def infos(self) -> list[dict[str, Any]]:
        """Per-slot infos (see :class:`PoolBatch`), built on the first read."""
        if self._infos is None:
            assert self._build is not None
            self._infos, self._build = self._build(), None
        return self._infos

    @infos.setter
    def infos(self, value: list[dict[str, Any]]) -> None:
        self._infos, self._build = value, None

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.obs, self.action_mask, self.reward, self.terminated, self.truncated, self.final_obs)
        return PoolBatch, (*fields, self.infos, self.pending)
