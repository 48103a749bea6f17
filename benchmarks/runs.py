"""Repeated benchmark runs: one result with every run's value of each target metric.

A single run on a small shared machine can land on either side of a target; ``--repeat N`` runs
the whole benchmark N times and the verdict requires the target in *every* run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def combine_runs(results: list[dict[str, Any]], target_keys: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The last run's full result plus ``runs`` ({metric: [value per run]}) for the target metrics
    and for the keys a benchmark lists in ``repeat_keys`` (numbers, or one line of text per run).

    ``targets_met`` (where the benchmark reports verdicts) becomes "met in every run".
    """
    if not results:
        raise ValueError("combine_runs needs at least one benchmark result")
    out = dict(results[-1])
    out["repeats"] = len(results)
    if len(results) == 1:
        return out
    keys = set(target_keys or {}) | set(out.get("targets", {})) | set(out.get("repeat_keys", []))
    out["runs"] = {}
    for key in sorted(keys):
        values = [r.get(key) for r in results]
        if all(_number(v) for v in values):
            out["runs"][key] = [float(v) for v in values]  # type: ignore[arg-type]
        elif all(isinstance(v, str) for v in values):
            out["runs"][key] = values
    if isinstance(out.get("targets_met"), dict):
        out["targets_met"] = {
            key: all(bool(r.get("targets_met", {}).get(key, False)) for r in results) for key in out["targets_met"]
        }
    return out


def run_repeated(
    run: Callable[[int], dict[str, Any]], repeat: int, target_keys: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """``run(i)`` for i in range(repeat), combined by :func:`combine_runs`."""
    if repeat < 1:
        raise ValueError(f"--repeat must be >= 1, got {repeat}")
    return combine_runs([run(i) for i in range(repeat)], target_keys)
