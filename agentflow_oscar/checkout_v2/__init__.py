"""The django-oscar store serving checkout_v2: Oscar's checkout with the services a real shop plugs in.

``python -m agentflow_oscar.serve --process checkout_v2 --machine <machine.yaml>`` runs it (settings
:mod:`agentflow_oscar.checkout_v2.settings`); docs/oscar.md says what is Oscar's and what is ours.
"""
