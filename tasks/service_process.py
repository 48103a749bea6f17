"""An installed service as its own process: ``python -m tasks.service_process NAME``.

``NAME`` is an entry point of group ``agentflow.services`` (a package's callable that starts its service
in this process and returns it -- an object with a ``url`` -- or its URL): names, never code, travel
from a process file to here. Like :mod:`tasks.payment_api_process`, the process prints the service's
base URL on the first line of stdout, then serves until its stdin closes (the parent exited or closed
the pipe) or it receives SIGTERM. The sim-to-real run talks to it over TCP like to any deployed service.
"""

from __future__ import annotations

import signal
import sys
import threading
from importlib.metadata import entry_points

SERVICE_GROUP = "agentflow.services"


def start_service(name: str) -> str:
    """Start the installed service ``name`` in this process; its base URL."""
    found = {ep.name: ep for ep in entry_points(group=SERVICE_GROUP)}
    if name not in found:
        raise SystemExit(f"service {name!r} is not an installed {SERVICE_GROUP} entry point: {sorted(found)}")
    service = found[name].load()()
    return str(service if isinstance(service, str) else service.url)


def main(argv: list[str]) -> int:
    """Start the named service, announce its URL, serve until stdin closes."""
    if len(argv) != 1:
        raise SystemExit("usage: python -m tasks.service_process NAME")
    url = start_service(argv[0])
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    print(url, flush=True)
    stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
