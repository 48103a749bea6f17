"""The payment HTTP API as its own process: ``python -m tasks.payment_api_process``.

Prints the server's base URL on the first line of stdout, then serves until its stdin closes (the
parent exited or closed the pipe) or it receives SIGTERM -- so a killed parent never leaves it behind.
The sim-to-real run of the stress phase talks to it over TCP like to any deployed service.
"""

from __future__ import annotations

import signal
import sys
import threading

from agentflow_core.envs.payment_api_server import PaymentAPIServer


def main() -> int:
    """Start the server on a free loopback port, announce its URL, serve until stdin closes."""
    server = PaymentAPIServer(port=0).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    print(server.url, flush=True)
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
