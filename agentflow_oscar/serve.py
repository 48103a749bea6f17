"""The Oscar store as its own process: ``python -m agentflow_oscar.serve [--workdir DIR] [--process P --machine F]``.

Builds (first time) or reuses the template database, restores it into ``<workdir>/live.sqlite3``, serves
Django on a free loopback port and prints the base URL on the first line of stdout; serves until stdin
closes (the parent exited or closed the pipe) or SIGTERM -- a killed parent never leaves it behind.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
        """No access log on stderr (one line per request would flood the parent's output)."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def main(argv: list[str] | None = None) -> int:
    """Prepare the database, serve on 127.0.0.1:<free port>, announce the URL, stop when stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m agentflow_oscar.serve")
    parser.add_argument("--workdir", type=Path, default=None, help="where the live database goes (default: a temp dir)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the template database is kept")
    parser.add_argument("--process", choices=("checkout", "checkout_v2"), default="checkout", help="the process served")
    parser.add_argument("--machine", type=Path, default=None, help="checkout_v2: the state machine of its world")
    args = parser.parse_args(argv)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="agentflow-oscar-"))
    workdir.mkdir(parents=True, exist_ok=True)
    live_db = workdir / "live.sqlite3"
    os.environ["AGENTFLOW_OSCAR_DB"] = str(live_db)
    if args.process == "checkout_v2":
        if args.machine is None:
            parser.error("--process checkout_v2 needs --machine (the process's machine.yaml)")
        os.environ["DJANGO_SETTINGS_MODULE"] = "agentflow_oscar.checkout_v2.settings"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "agentflow_oscar.settings")

    import django

    django.setup()
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.wsgi import get_wsgi_application

    from agentflow_oscar import control, store

    template = store.ensure_template(live_db, args.cache_dir or store.default_cache_dir())
    store.restore(template, live_db)
    control.configure(template, live_db)
    if args.process == "checkout_v2":
        from agentflow_oscar.checkout_v2 import world

        world.configure(args.machine)
    server = make_server(
        "127.0.0.1", 0, StaticFilesHandler(get_wsgi_application()), _ThreadingServer, handler_class=_QuietHandler
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    print(f"http://127.0.0.1:{server.server_port}", flush=True)
    stop.wait()
    server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
