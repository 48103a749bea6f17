"""Run ``agentflow`` invocations in forked children of one warm interpreter, each under limits.

Importing the CLI and what its commands import (torch) takes seconds; the cost of a hostile input
is what the command does after that. So this harness imports them once, then forks one child per
case with ``RLIMIT_AS`` set to its current address space plus ``--memory-mb`` (an allocation past
it fails in the child) and kills a child still running after ``--timeout-s``. Usage::

    python cli_harness.py cases.json results.json --memory-mb 500 --timeout-s 5

``cases.json`` is a list of ``{"cwd": dir, "argv": [...], "out": dir}``; each result holds the
exit code (or ``"timeout"``), wall seconds and the captured stdout/stderr. A child that needs more
memory than allowed fails its allocation: a MemoryError the CLI turns into its generic one line
(which names no file or key, so no case's expectations match it), or a traceback, exit 70.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")


def _address_space() -> int:
    return int(Path("/proc/self/statm").read_text().split()[0]) * PAGE


def _child(case: dict[str, Any], memory_bytes: int) -> None:
    from flows.cli.app import main

    out = Path(case["out"])
    for fd, name in ((1, "stdout"), (2, "stderr")):
        handle = os.open(out / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(handle, fd)
        os.close(handle)
    os.chdir(case["cwd"])
    limit = _address_space() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.argv = ["agentflow", *case["argv"]]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # a traceback is exactly the failure the corpus looks for
        traceback.print_exc()
        code = 70
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_case(case: dict[str, Any], memory_bytes: int, timeout_s: float) -> dict[str, Any]:
    """Fork, run one CLI invocation, wait at most ``timeout_s``; the child's exit code and costs."""
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        _child(case, memory_bytes)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() - started > timeout_s:
            os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.005)
    seconds = time.perf_counter() - started
    out = Path(case["out"])
    exit_code: int | str = os.waitstatus_to_exitcode(status)
    if seconds > timeout_s:
        exit_code = "timeout"
    return {
        "exit_code": exit_code,
        "seconds": seconds,
        "stdout": (out / "stdout").read_text(errors="replace"),
        "stderr": (out / "stderr").read_text(errors="replace"),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument("--memory-mb", type=int, default=500)
    parser.add_argument("--timeout-s", type=float, default=5.0)
    args = parser.parse_args()
    # Warm the imports once, before any fork: the CLI's own, and the heavy ones its commands import
    # when they run (the CLI starts without them): the limits then weigh the input's cost alone.
    import torch  # noqa: F401

    import flows.cli.app  # noqa: F401
    import tasks.steps.explore  # noqa: F401
    import tasks.steps.variants  # noqa: F401

    cases = json.loads(args.cases.read_text())
    results = [run_case(case, args.memory_mb << 20, args.timeout_s) for case in cases]
    args.results.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
