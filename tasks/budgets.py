"""Phase budgets: used vs allotted wall-clock seconds (and env steps), as metrics every phase writes.

Each step function puts these keys into its metrics file (``data/metrics/<phase>.json``), so
``dvc metrics show``, the flow's MLflow parent run (which carries every phase's metrics) and the
report (which reads the metrics files) all see the same numbers, whichever orchestrator ran it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentflow_core.gates import BudgetUse

PHASES_WITH_BUDGET = ("calibrate", "variants", "explore", "offline", "train", "stress", "report")


def budget_metrics(
    phase: str, wall_s: float, budget_s: float, steps: int | None = None, budget_steps: int | None = None
) -> dict[str, float]:
    """``budget/<phase>/...`` metrics of one phase run."""
    return BudgetUse(phase, wall_s, budget_s, steps, budget_steps).metrics()


def read_budgets(metrics_dir: Path) -> list[dict[str, Any]]:
    """Used vs allotted per phase, from the phases' metrics files (phases that have not run are left out)."""
    rows = []
    for phase in PHASES_WITH_BUDGET:
        path = Path(metrics_dir) / f"{phase}.json"
        if not path.exists():
            continue
        values = json.loads(path.read_text(encoding="utf-8"))
        prefix = f"budget/{phase}/"
        if f"{prefix}wall_s" not in values:
            continue
        use = BudgetUse(
            phase,
            float(values[f"{prefix}wall_s"]),
            float(values[f"{prefix}budget_s"]),
            int(values[f"{prefix}steps"]) if f"{prefix}steps" in values else None,
            int(values[f"{prefix}budget_steps"]) if f"{prefix}budget_steps" in values else None,
        )
        rows.append(
            {
                "phase": phase,
                "wall_s": use.wall_s,
                "budget_s": use.budget_s,
                "steps": use.steps,
                "budget_steps": use.budget_steps,
                "within": use.within,
            }
        )
    return rows
