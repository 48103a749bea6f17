"""The edge between the core and the stack: Prefect tasks, file I/O, MLflow tracking, DVC step functions.

The core returns records; the modules here read configs, write artefacts and log them, so the same
step runs from the CLI, a DVC stage or the Prefect flow.
"""
