"""Stress validation and evaluation reports (Phase 3): pure functions over step/episode records.

Modules: ``records`` (the schema), ``stress`` (stratified sample + pool rollouts), ``policy_eval``
(stratified greedy evaluations during training and of the reference policies), ``consistency``,
``token_frequency``, ``root_causes``, ``hacking``, ``risk``, ``robustness`` (one analysis + the exit
metric), ``champion`` (the canary decision) and ``report`` (JSON document, tree, markdown, HTML).
"""
