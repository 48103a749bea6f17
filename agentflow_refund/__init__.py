"""The refund process's systems, outside the core: a SQL case store (a hand-written env) and a loopback HTTP service.

The process itself is data (configs/processes/refund.yaml). The SQL channel is registered through the
``agentflow.envs`` entry point ``refund_db``; the HTTP service is driven by the core's generic HTTP
channel (configs/refund/envs/refund_api_v1.yaml) and started in-process through the
``agentflow.services`` entry point ``refund``.
"""
