"""An abandoned step's interrupt never lands inside an import (it would leave the module unbound for good)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from agentflow_core.pool.watchdog import AbandonedStep, interrupt_thread


def _package(root: Path, name: str) -> None:
    pkg = root / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # a submodule whose import takes a while in Python code, like a first SQLAlchemy dialect import
    (pkg / "slow.py").write_text(
        "import time\n_end = time.perf_counter() + 0.4\nwhile time.perf_counter() < _end:\n    pass\n"
    )


def test_a_thread_importing_is_asked_again_later_and_its_import_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"agentflow_slowpkg_{time.monotonic_ns()}"
    _package(tmp_path, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    ended: list[str] = []
    importing = threading.Event()

    def step() -> None:
        try:
            importing.set()
            __import__(f"{name}.slow")
            ended.append("imported")
            while True:  # then a busy-looping step, which the next ask does end
                pass
        except AbandonedStep:
            ended.append("interrupted")

    thread = threading.Thread(target=step, daemon=True)
    thread.start()
    importing.wait()
    time.sleep(0.1)  # inside the slow import now
    assert interrupt_thread(thread) is True  # to be asked again: not interrupted inside the import
    deadline = time.monotonic() + 5
    while "imported" not in ended and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ended == ["imported"]
    assert sys.modules[name].slow is sys.modules[f"{name}.slow"]  # bound on its package
    assert interrupt_thread(thread) is True  # now the request is set: the busy loop ends
    thread.join(5)
    assert not thread.is_alive() and ended == ["imported", "interrupted"]
