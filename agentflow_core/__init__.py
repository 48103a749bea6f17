"""AgentFlow's library: semantic envs, adapters, env pools, PPO and evaluation, free of the stack.

Nothing here imports Prefect, MLflow, DVC or YAML, reads environment variables or prints: the
orchestration, tracking and file formats live in ``tasks`` and ``flows``, which call into this package.
"""
