"""Lanes: pooled connections the journal keeps from one statement to the next.

Each kind of batch (claims, completions, reads) has one batch in flight at a time, so the
journal needs about one connection per kind at once. Taking one from the pool and giving it
back around every statement costs psycopg_pool's checkout, reset and return, twice per durable
miss (measured against a connection held across statements: docs/dev/performance-notebook.md).
A lane takes a connection on its first statement and keeps it, with one cursor, while
statements succeed (`AsyncConnection.execute` makes a new cursor per statement, which costs
more).

The lanes are shared by every kind, most recently taken first (`Lanes`): a statement takes the
first free one. So a lone caller's claim and its completion run on one connection, served by
one Postgres backend that has just run (faster than a lane per kind, whose two backends each
sleep between the calls: docs/dev/performance-notebook.md); concurrent
batches still each find a lane of their own. A lane in use by one statement is `busy`; a
statement that finds every lane busy takes a connection from the pool as usual, so a lane
never runs two statements at once.

A lane gives its connection back to the pool (which resets it, or discards a broken one and
opens another) after any failure, when the journal closes, and at least every `HOLD_S` seconds
(so the pool's `max_lifetime` and `drain` still reach it). The journal keeps lanes only on a
pool of at least `LANES_MIN_POOL` connections (journal.py): on a smaller one, three
connections held out of it would leave renewals and listings waiting for the pool.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anyio
import psycopg
import psycopg_pool
from psycopg.pq import TransactionStatus

#: How long a lane keeps one connection before handing it back to the pool.
HOLD_S = 60.0


class Lane:
    """One connection the journal keeps between statements (see the module docstring).

    The lane holds the cursor alone; its connection is the cursor's, so the two are taken and
    given back together and cannot disagree."""

    __slots__ = ("cursor", "busy", "closed", "_taken_at")

    def __init__(self) -> None:
        self.cursor: psycopg.AsyncCursor[Any] | None = None
        self.busy = False
        self.closed = False
        self._taken_at = 0.0

    @property
    def conn(self) -> psycopg.AsyncConnection[Any] | None:
        """The connection the lane holds (None: none now)."""
        return None if self.cursor is None else self.cursor.connection

    async def acquire(self, pool: psycopg_pool.AsyncConnectionPool[Any]) -> psycopg.AsyncCursor[Any]:
        """The lane's cursor (on a connection taken from `pool` if it holds none); the lane is busy
        until `release`."""
        self.busy = True
        cursor = self.cursor
        if cursor is None:
            try:
                conn = await pool.getconn()
            except BaseException:
                self.busy = False
                raise
            self._taken_at = time.monotonic()
            cursor = self.cursor = conn.cursor()
        return cursor

    async def release(self, pool: psycopg_pool.AsyncConnectionPool[Any], *, failed: bool) -> None:
        """End a statement: keep the connection, or give it back (after a failure, once closed, when held long)."""
        conn = self.conn
        self.busy = False
        if conn is None:
            return
        if (
            failed
            or self.closed
            or time.monotonic() - self._taken_at > HOLD_S
            or conn.pgconn.transaction_status != TransactionStatus.IDLE
        ):
            self.cursor = None
            with anyio.CancelScope(shield=True):  # handed back whole, even by a cancelled caller
                await pool.putconn(conn)  # reset or discarded by the pool; closed if the pool is

    async def close(self, pool: psycopg_pool.AsyncConnectionPool[Any]) -> None:
        """The journal closes: an idle lane gives its connection back now, a busy one after its statement."""
        self.closed = True
        conn = self.conn
        if not self.busy and conn is not None:
            self.cursor = None
            await pool.putconn(conn)


class Lanes:
    """The journal's lanes, most recently taken first (see the module docstring)."""

    __slots__ = ("_order",)

    def __init__(self, count: int) -> None:
        self._order = [Lane() for _ in range(count)]

    def __iter__(self) -> Iterator[Lane]:
        return iter(list(self._order))

    def free(self) -> Lane | None:
        """The most recently taken lane that is not running a statement now (None: all are busy,
        or there are none: the statement takes a connection from the pool)."""
        for index, lane in enumerate(self._order):
            if not lane.busy:
                if index:  # the most recently taken first: its backend ran last
                    del self._order[index]
                    self._order.insert(0, lane)
                return lane
        return None
