"""The ``agentflow`` command line: the main app (:mod:`flows.cli.app`) and one module per command group.

Importing the package imports no command module (``flows.reproduce`` and the phase commands import
``flows.cli.common``; the app imports them), so :func:`main` loads the app when called.
"""


def main() -> None:
    """The ``agentflow`` console script: run the app."""
    from flows.cli.app import main as run_app

    run_app()
