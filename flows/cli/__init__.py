"""The ``agentflow`` command line: the main app (:mod:`flows.cli.app`) and one module per command group."""

from flows.cli.app import app, main

__all__ = ["app", "main"]
