"""The refund process's channels, outside the core: a SQL case store, a loopback HTTP service and its client env.

The process itself is data (configs/processes/refund.yaml); these modules are the channel adapters
it needs, registered through the ``agentflow.envs`` entry points ``refund_db`` and ``refund_api``.
"""
