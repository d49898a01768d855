"""Turns: runs that must not overlap take turns by the row lock of a row of ``{s}.turns``.

An advisory lock would do, but any role may take any advisory lock, and a key that follows from
public names (a topology's, an output's) can be taken by a producer to stall them. A row lock needs
UPDATE on the row's table, which only the owner and the run-time role have.

:func:`take` waits for a turn inside the caller's transaction (a decision's completions); :func:`hold`
takes one, if free, for as long as the caller keeps it: on a connection of its own, in a
transaction left open until :meth:`Held.release` -- or until the process dies and Postgres ends the
connection, which frees the turn the way a session advisory lock was freed.
"""

from __future__ import annotations

import psycopg2.extensions

from .connection import connect
from .rows import Cursor
from .statements import query


def take(cur: Cursor, schema: str, name: str) -> None:
    """Wait for the turn ``name`` in ``cur``'s transaction; held until that transaction ends."""
    cur.execute(query("turn_ensure", schema), {"name": name})
    cur.execute(query("turn_take", schema), {"name": name})


class Held:
    """A turn held on a connection of its own (see the module docstring)."""

    def __init__(self, conn: psycopg2.extensions.connection) -> None:
        self._conn: psycopg2.extensions.connection | None = conn

    def release(self) -> None:
        """Give the turn back (the connection's transaction rolled back, the connection closed)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.rollback()
            finally:
                conn.close()


def hold(dsn: str, schema: str, name: str) -> Held | None:
    """The turn ``name`` if no one holds it now (None otherwise), held until released."""
    conn = connect(dsn, application_name="airflow_transactional:turn")
    try:
        with conn.cursor() as cur:  # the row first, committed: a new row would be locked by its inserter alone
            cur.execute(query("turn_ensure", schema), {"name": name})
        conn.commit()
        with conn.cursor() as cur:
            cur.execute(query("turn_try", schema), {"name": name})
            got = cur.fetchone() is not None
    except BaseException:
        conn.close()
        raise
    if not got:
        conn.close()
        return None
    return Held(conn)
