"""The SQL-database channel: the online order run as parameterised SQL against a real database.

Modules: ``schema`` (tables and the rules they enforce, the engine), ``statements`` (the SQL and the
driver that runs it), ``fixtures`` (seed rows and the template database), ``env`` (:class:`OrderDBEnv`),
``raw_states`` (the raw observation and the states the mapping audit checks).

The channel is a shop backend whose statements are written in SQLAlchemy Core (compiled once
per dialect and run on the DBAPI cursor, see :class:`~agentflow_core.envs.order_db.statements.Driver`). Business rules live where a real
backend keeps them -- in the schema: ``CHECK (stock >= 0)`` refuses to sell what is not there,
a partial ``UNIQUE`` index allows one pending order per user, ``CHECK (total > 0)`` refuses an
empty checkout, foreign keys tie rows together. A violated rule is an ``IntegrityError``, a held
write lock an ``OperationalError``; both become an ``error`` row in the observation and a step
``failure_reason``, never an exception.

Isolation ("SQL execution + transaction rollback", docs/design.md §2.1): every episode runs inside one transaction opened at
``reset`` and rolled back at the next ``reset``/``close``, each mutating op inside a SAVEPOINT so
a failed statement undoes only itself. The database therefore never changes across episodes.
By default each env owns a private in-memory SQLite (``sqlite://`` + ``StaticPool``); any
SQLAlchemy URL works, the schema and the env's seed rows (keyed by ``env_id``) are created there
when missing.

The DB link is simulated: each step is one round trip whose latency advances ``sim_time_s``
(no sleeping); ``packet_loss_5%`` drops the statement, and latency beyond the 1.0 s query timeout
cancels it -- in both cases the op is not applied and the previous rows are kept.
"""

from agentflow_core.envs.order_db.env import OrderDBEnv
from agentflow_core.envs.order_db.fixtures import dump_tables
from agentflow_core.envs.order_db.raw_states import RAW_STATES
from agentflow_core.envs.order_db.schema import FAMILY, OPS, VERSION, make_engine, metadata

__all__ = ["FAMILY", "OPS", "RAW_STATES", "VERSION", "OrderDBEnv", "dump_tables", "make_engine", "metadata"]
