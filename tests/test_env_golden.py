"""The channels behave exactly as recorded: fast paths change the cost of a step, never its outcome.

``tests/data/env_golden.json`` was recorded (``python tests/env_golden.py``) from the implementation
before the SQL and HTTP channels were made cheaper per step; every family must still reproduce it
step for step -- raw observation, channel info, reward, flags, failure reason, semantic vector and mask.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from env_golden import FAMILIES, GOLDEN, record


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("family", FAMILIES)
def test_trajectories_match_the_recorded_ones(family: str, golden: dict[str, Any]) -> None:
    expected = golden[family]
    replayed = json.loads(json.dumps(record(family)))  # the same float/tuple normalisation as the file
    assert replayed.keys() == expected.keys()
    for run, rows in expected.items():
        for index, (want, got) in enumerate(zip(rows, replayed[run], strict=True)):
            assert got == want, f"{family} run {run} row {index}: recorded {want}, replayed {got}"


def test_the_record_reaches_the_cases_it_guards(golden: dict[str, Any]) -> None:
    """Failures, retries after faults, constraints and truncation are all in the record, not only happy paths."""
    reasons = {
        family: {row[4] for rows in runs.values() for row in rows if row[0] != "reset"}
        for family, runs in golden.items()
    }
    assert {"network_timeout", "query_timeout", "constraint_violation", "max_steps"} <= reasons["order_db"]
    assert {"user_blocked", "escalated", "order_cancelled", "max_steps"} <= reasons["payment_api"]
    successes = {
        family: sum(row[1] >= 5 for rows in runs.values() for row in rows[1:] if row[0] != "reset")
        for family, runs in golden.items()
    }
    assert all(count > 10 for count in successes.values())
