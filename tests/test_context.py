"""The phase context and the backend object: built once, the backend branch in one place, chunks back in order."""

from __future__ import annotations

from typing import Any

from tasks.backend import InProcessBackend, RayBackend, backend_of
from tasks.compose import map_chunks
from tasks.context import PhaseContext


def test_the_backend_follows_pool_backend(tiny_config: Any) -> None:
    assert isinstance(backend_of(tiny_config(pool={"num_workers": 0})), InProcessBackend)
    assert isinstance(backend_of(tiny_config(pool={"num_workers": 2})), RayBackend)
    assert isinstance(backend_of(tiny_config(pool={"num_workers": 2, "backend": "inprocess"})), InProcessBackend)
    place = backend_of(tiny_config(pool={"num_workers": 3, "backend": "inprocess"})).place()
    assert place.describe(12) == "inprocess (this process), 3 workers x 4 envs, 1 node(s)"


def test_in_process_chunks_run_in_order_and_map_chunks_restores_item_order(tiny_config: Any) -> None:
    ctx = PhaseContext.of(tiny_config(pool={"num_workers": 3, "backend": "inprocess"}))
    done: list[int] = []
    out = ctx.backend.map_chunks(lambda chunk: [x * 10 for x in chunk], [[1, 2], [3], [4, 5, 6]], done.append)
    assert out == [[10, 20], [30], [40, 50, 60]] and done == [0, 1, 2]
    progress: list[tuple[int, int]] = []
    items = list(range(7))
    assert map_chunks(ctx, lambda chunk: [x + 100 for x in chunk], items, lambda d, n: progress.append((d, n))) == [
        x + 100 for x in items
    ]
    assert progress == [(3, 7), (5, 7), (7, 7)]  # chunks items[0::3], items[1::3], items[2::3]


def test_the_context_holds_what_the_config_selects_and_follows_a_changed_config(tiny_config: Any) -> None:
    cfg = tiny_config()
    ctx = PhaseContext.of(cfg)
    assert ctx.paths.root == ctx.paths.of(cfg).root and ctx.vocabulary is ctx.process.vocabulary
    assert set(cfg.variants.base_envs) <= {entry.env_id for entry in ctx.registry.entries()}
    on_ray = cfg.pool.model_copy(update={"num_workers": 1, "backend": "ray"})
    one_worker = ctx.with_config(cfg.model_copy(update={"pool": on_ray}))
    assert one_worker.registry is ctx.registry and one_worker.process is ctx.process  # same envs, same process
    assert isinstance(one_worker.backend, RayBackend) and isinstance(ctx.backend, InProcessBackend)
