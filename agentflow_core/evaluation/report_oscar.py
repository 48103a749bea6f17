"""The report's django-oscar parts: the zero-shot run per dimension value, and a fine-tune's before and after.

``sim_to_real_oscar`` is the stress phase's paired run on the store (:func:`tasks.real_channels.run_sim_to_real_oscar`);
its optional ``finetune`` is what ``agentflow train --channel oscar`` measured on the same episodes before and
after continuing the same policy on Oscar. Pure: rows and labels, rendered by :mod:`.report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

FINETUNE_COLUMNS = [
    "dimension",
    "value",
    "episodes",
    "sim success",
    "Oscar before",
    "Oscar after",
    "gap before",
    "gap after",
]


def _pct(x: float) -> str:
    return "n/a" if x != x else f"{x:.1%}"


def _pts(gap: float) -> str:
    return f"{100 * gap:+.1f} pts"


def oscar_rows(report: Mapping[str, Any], key: str = "sim_to_real_oscar") -> list[list[Any]]:
    """One row per dimension value of the run on the django-oscar store (``key``: another sim-to-real run's; none
    when it did not run)."""
    return [
        [
            r["dimension"],
            r["value"],
            r["episodes"],
            _pct(r["sim_process_success"]),
            _pct(r["real_process_success"]),
            _pts(r["gap"]),
            "; ".join(r["root_causes"]),
        ]
        for r in (report.get(key) or {}).get("per_dimension", [])
    ]


def finetune_rows(report: Mapping[str, Any]) -> list[list[Any]]:
    """All episodes, then one row per dimension value: Oscar success and gap before and after the fine-tune."""
    finetune = (report.get("sim_to_real_oscar") or {}).get("finetune")
    if not finetune:
        return []
    before, after = finetune["before"], finetune["after"]
    rows: list[list[Any]] = [
        [
            "all",
            "",
            before["episodes"],
            _pct(before["sim_process_success"]),
            _pct(before["real_process_success"]),
            _pct(after["real_process_success"]),
            _pts(before["gap"]),
            _pts(after["gap"]),
        ]
    ]
    after_rows = {(r["dimension"], r["value"]): r for r in after["per_dimension"]}
    for r in before["per_dimension"]:
        a = after_rows.get((r["dimension"], r["value"]))
        if a is None:
            continue
        rows.append(
            [
                r["dimension"],
                r["value"],
                r["episodes"],
                _pct(r["sim_process_success"]),
                _pct(r["real_process_success"]),
                _pct(a["real_process_success"]),
                _pts(r["gap"]),
                _pts(a["gap"]),
            ]
        )
    return rows


def oscar_labels(oscar: Mapping[str, Any] | None) -> list[tuple[str, list[str]]]:
    """The report tree's django-oscar line and its children (per dimension value, the fine-tune), as labels."""
    if not oscar or not oscar.get("episodes"):
        return []
    children = [
        f"{r['dimension']}={r['value']}: sim {r['sim_process_success']:.1%}, Oscar {r['real_process_success']:.1%} "
        f"over {r['episodes']} episode(s)" + (f"; {', '.join(r['root_causes'])}" if r["root_causes"] else "")
        for r in oscar["per_dimension"]
    ]
    finetune = oscar.get("finetune")
    if finetune:
        before, after = finetune["before"], finetune["after"]
        children.append(
            f"fine-tuned on Oscar ({finetune['total_steps']} steps): success {before['real_process_success']:.1%} -> "
            f"{after['real_process_success']:.1%}, gap {_pts(before['gap'])} -> {_pts(after['gap'])}"
        )
    label = (
        f"Sim-to-Real on django-oscar: success {oscar['real_process_success']:.1%} (sim "
        f"{oscar['sim_process_success']:.1%}, gap {100 * oscar['gap']:+.1f} pts) over {oscar['episodes']} paired "
        f"episodes; step p50 {oscar['real_step_ms_p50']:.0f} ms"
    )
    if oscar.get("real_business_value") is not None:
        label += (
            f"; business value per episode {oscar['real_business_value']:.1f} on Oscar, "
            f"{oscar['sim_business_value']:.1f} in the simulator"
        )
    return [(label, children)]
