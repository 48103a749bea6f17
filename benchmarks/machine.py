"""What other tenants took from this machine while a benchmark ran, measured rather than assumed.

On a virtual machine a busy neighbour shows as *steal* time (the hypervisor ran someone else while
this guest had work), not as load in the guest; a timing benchmark records both so its figures can be
read against how quiet the machine was.
"""

from __future__ import annotations

import os
from typing import Any

import psutil


def _total(times: Any) -> float:
    """All CPU time in ``times``; Linux counts guest time inside user time too, so it is left out once."""
    return float(sum(times)) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)


class MachineLoad:
    """Started before a benchmark's sides run; :meth:`result` after them."""

    def __init__(self) -> None:
        self._start = psutil.cpu_times()
        self._load_before = os.getloadavg()[0]
        self._result: dict[str, Any] | None = None

    def result(self) -> dict[str, Any]:
        """``cpu_steal_share`` over the benchmark (0 where the kernel reports no steal) and the load averages,
        measured at the first call (later calls return the same)."""
        if self._result is not None:
            return self._result
        end = psutil.cpu_times()
        elapsed = _total(end) - _total(self._start)
        steal = getattr(end, "steal", 0.0) - getattr(self._start, "steal", 0.0)
        self._result = {
            "cpu_steal_share": steal / elapsed if elapsed > 0 else 0.0,
            "load_avg_1m_before": self._load_before,
            "load_avg_1m_after": os.getloadavg()[0],
        }
        return self._result

    def note(self) -> str:
        """One line for a benchmark's notes: how quiet the machine was."""
        r = self.result()
        return (
            f"machine: {r['cpu_steal_share']:.1%} of CPU time stolen by other tenants over the benchmark "
            f"(/proc/stat steal), 1-min load average {r['load_avg_1m_before']:.2f} before it"
        )
