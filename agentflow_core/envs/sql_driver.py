"""The SQL channel's connection: SQLite in memory (the standard library) or a server through SQLAlchemy.

Both speak named parameters (``:name``), bound by the driver -- data is never formatted into a
statement. One episode is one transaction, rolled back at the next reset; one action is a savepoint
inside it, so a statement a constraint refuses undoes the whole action and nothing else.

On a server (``url: pgserver`` for the embedded PostgreSQL of
:mod:`agentflow_core.envs.order_db.postgres`, or a SQLAlchemy URL) every env works in a schema of its
own (``search_path``), created with the channel's tables when the env connects and dropped when it
closes, so envs sharing a server never see or lock each other's rows.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from agentflow_core.envs.order_db.postgres import EMBEDDED_POSTGRES, acquire_embedded, release_embedded

SQLITE = "sqlite"
Params = Mapping[str, Any]


class Refused(Exception):
    """A statement of an action was refused by the database (a constraint, a type): the action is undone."""


class SQLiteConnection:
    """A private in-memory SQLite database (no server, ~0.1 ms per statement)."""

    def __init__(self, schema: Sequence[str]) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        for statement in schema:
            self.conn.execute(statement)
        self._open = False

    def begin(self) -> None:
        """Roll back the open episode (if any) and start the next one's transaction."""
        if self._open:
            self.conn.execute("ROLLBACK")
        self.conn.execute("BEGIN")
        self._open = True

    def rows(self, statement: str, params: Params) -> list[tuple[Any, ...]]:
        """Run a query; its rows."""
        return self.conn.execute(statement, params).fetchall()

    def row(self, statement: str, params: Params) -> dict[str, Any] | None:
        """The first row of a query as column -> value (None without a row)."""
        cursor = self.conn.execute(statement, params)
        found = cursor.fetchone()
        return None if found is None else dict(zip((d[0] for d in cursor.description), found, strict=True))

    def action(self, statements: Sequence[str], params: Params) -> None:
        """Run an action's statements as one savepoint; a refused one undoes them all and raises Refused."""
        self.conn.execute("SAVEPOINT action")
        try:
            for statement in statements:
                self.conn.execute(statement, params)
        except sqlite3.Error as exc:
            self.conn.execute("ROLLBACK TO action")
            self.conn.execute("RELEASE action")
            raise Refused(str(exc)) from exc
        self.conn.execute("RELEASE action")

    def close(self) -> None:
        """Roll back and close."""
        if self._open:
            self.conn.execute("ROLLBACK")
            self._open = False
        self.conn.close()


class ServerConnection:
    """A connection to a SQL server through SQLAlchemy, working in a schema of its own."""

    def __init__(self, url: str, schema: Sequence[str]) -> None:
        from sqlalchemy import create_engine, text  # a channel driver: imported only for a server

        self._text = text
        self._cache: dict[str, Any] = {}
        self._embedded = url == EMBEDDED_POSTGRES
        self.engine = create_engine(acquire_embedded() if self._embedded else url)
        self.conn = self.engine.connect()
        self.namespace = f"agentflow_{uuid.uuid4().hex[:16]}"  # generated here, never from data
        with self.conn.begin():
            self.conn.execute(text(f"CREATE SCHEMA {self.namespace}"))
            self.conn.execute(text(f"SET search_path TO {self.namespace}"))
            for statement in schema:
                self.conn.execute(text(statement))
        self._txn: Any = None

    def _compiled(self, statement: str) -> Any:
        found = self._cache.get(statement)
        if found is None:
            found = self._cache[statement] = self._text(statement)
        return found

    def begin(self) -> None:
        """Roll back the open episode (if any) and start the next one's transaction."""
        if self._txn is not None:
            self._txn.rollback()
        self._txn = self.conn.begin()

    def rows(self, statement: str, params: Params) -> list[tuple[Any, ...]]:
        """Run a query; its rows."""
        return [tuple(r) for r in self.conn.execute(self._compiled(statement), dict(params)).fetchall()]

    def row(self, statement: str, params: Params) -> dict[str, Any] | None:
        """The first row of a query as column -> value (None without a row)."""
        found = self.conn.execute(self._compiled(statement), dict(params)).mappings().first()
        return None if found is None else dict(found)

    def action(self, statements: Sequence[str], params: Params) -> None:
        """Run an action's statements as one savepoint; a refused one undoes them all and raises Refused."""
        from sqlalchemy.exc import DBAPIError

        savepoint = self.conn.begin_nested()
        try:
            for statement in statements:
                self.conn.execute(self._compiled(statement), dict(params))
        except DBAPIError as exc:
            savepoint.rollback()
            raise Refused(str(exc.orig)) from exc
        savepoint.commit()

    def close(self) -> None:
        """Roll back, drop this env's schema, release the server."""
        try:
            if self._txn is not None:
                self._txn.rollback()
                self._txn = None
            with self.conn.begin():
                self.conn.execute(self._text(f"DROP SCHEMA {self.namespace} CASCADE"))
            self.conn.close()
        finally:
            self.engine.dispose()
            if self._embedded:
                release_embedded()


def connect(url: str, schema: Sequence[str]) -> SQLiteConnection | ServerConnection:
    """The connection ``url`` asks for (``sqlite``: private in-memory SQLite) with the channel's tables."""
    return SQLiteConnection(schema) if url == SQLITE else ServerConnection(url, schema)
