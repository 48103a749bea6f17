"""Phase step functions: pure-ish work plus the phase's file I/O, called by the CLI, DVC and Prefect."""
