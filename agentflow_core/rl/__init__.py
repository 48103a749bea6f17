"""The learner: PPO with action masking, reward shaping and normalisation, coverage, checkpoints.

It steps an :class:`~agentflow_core.contracts.EnvPool` and never builds envs itself, so the same code
trains on an in-process pool in tests and on Ray actors in the cycle.
"""
