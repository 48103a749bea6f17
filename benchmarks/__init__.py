"""Benchmarks that return plain dicts (the CLI prints or logs them; nothing here prints).

A layer of its own: above ``tasks`` (the benchmarks drive the phases' step functions and pools),
below ``flows`` (``agentflow bench ...`` imports them inside its commands). No pipeline stage
depends on them.
"""
