"""``python -m flows.cli``: what ``bin/agentflow`` runs."""

from flows.cli.app import main

main()
