"""A django-oscar storefront the project can start, reset and read: a real system nobody here wrote.

The package is a Django site around django-oscar 4.2.1 (Oscar ships apps and templates, no project):
:mod:`.settings` and :mod:`.urls` make the site, ``catalogue.json`` is its catalogue fixture (products
in and out of stock, a voucher, a test customer), :mod:`.store` builds a migrated and loaded SQLite
template once and restores it, :mod:`.control` adds the two loopback control endpoints the generic
browser channel uses (reset to a scenario, read the placed order from Oscar's database), and
:mod:`.serve` serves the site in its own process (``python -m agentflow_oscar.serve``).

Nothing here imports the project's core: the core's generic browser channel
(:mod:`agentflow_core.envs.web_site`) drives Oscar's own pages from the data in
``configs/oscar/site/site.json``.
"""
