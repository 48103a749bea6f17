"""The channels' physical envs (web checkout, order database, payment API) and the semantic env over them.

``base`` holds their contract and ``semantic_env`` turns any of them, through an adapter, into the
Gymnasium env with the shared token observation that the pool and the policy see.
"""
