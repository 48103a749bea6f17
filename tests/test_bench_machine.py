"""benchmarks.machine: the steal share and load a timing benchmark records about its machine."""

from __future__ import annotations

from collections import namedtuple

import pytest

from benchmarks import machine
from benchmarks.machine import MachineLoad

Times = namedtuple("Times", "user nice system idle iowait irq softirq steal")


def test_steal_share_is_steal_over_all_cpu_time_of_the_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([Times(10, 0, 2, 80, 0, 0, 0, 8), Times(40, 0, 5, 120, 0, 0, 0, 23)])
    monkeypatch.setattr(machine.psutil, "cpu_times", lambda: next(readings))
    load = MachineLoad()
    got = load.result()
    # over the interval: 30 user + 3 system + 40 idle + 15 steal = 88 s, 15 of them stolen
    assert got["cpu_steal_share"] == pytest.approx(15 / 88)
    assert load.result() is got  # measured once
    assert "17.0% of CPU time stolen" in load.note()


def test_on_this_machine_the_figures_are_in_range() -> None:
    load = MachineLoad()
    sum(range(10**6))
    got = load.result()
    assert 0.0 <= got["cpu_steal_share"] <= 1.0
    assert got["load_avg_1m_before"] >= 0.0 and got["load_avg_1m_after"] >= 0.0


def test_guest_time_is_not_counted_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    # Linux's /proc/stat already counts guest and guest_nice inside user and nice
    guest = namedtuple("guest", "user nice system idle iowait irq softirq steal guest guest_nice")
    readings = iter([guest(0, 0, 0, 0, 0, 0, 0, 0, 0, 0), guest(60, 0, 10, 20, 0, 0, 0, 10, 50, 0)])
    monkeypatch.setattr(machine.psutil, "cpu_times", lambda: next(readings))
    assert MachineLoad().result()["cpu_steal_share"] == pytest.approx(10 / 100)
