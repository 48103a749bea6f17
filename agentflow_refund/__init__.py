"""The refund process's systems, outside the core: its business rules and a loopback HTTP service.

The process itself is data (configs/processes/refund.yaml), and so are both its channels: the SQL
channel (configs/refund/envs/refund_db_v1.yaml on the core's generic SQL channel, which writes the
rules of ``case`` as SQL) and the HTTP channel (configs/refund/envs/refund_api_v1.yaml on the core's
generic HTTP channel). The service runs ``case`` and is started in-process through the
``agentflow.services`` entry point ``refund``.
"""
