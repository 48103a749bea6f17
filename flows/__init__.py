"""The top floor: the Prefect training-cycle flow and the ``agentflow`` command line that runs each phase."""
