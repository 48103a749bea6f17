"""The refund process's systems, outside the core: its business rules and a loopback HTTP service.

The process itself is data (configs/processes/refund.yaml), and so is its SQL channel
(configs/refund/envs/refund_db_v1.yaml on the core's generic SQL channel, which writes the rules of
``case`` as SQL). The service runs ``case``; its client env is registered through the ``agentflow.envs``
entry point ``refund_api``.
"""
