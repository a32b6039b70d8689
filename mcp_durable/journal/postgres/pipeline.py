"""One connection in libpq's pipeline mode: statements sent back to back, answered in order.

The Postgres journal sends its batches of process-entry appends here (journal.py). Those
statements hold the entries' lock up to their commit, so that `seq` order is commit order;
batches sent on connections of their own raced to that lock, and a batch sent second could
take it first (its entries then got the smaller seqs although they were appended later). On
one connection in pipeline mode the server runs the statements in the order they were sent,
each its own transaction, while the client goes on: the next batch is sent before the one in
front of it has committed, so the client's half of a round (waking the callers a commit
answered, building the next batch) overlaps the server's half instead of alternating with it
(docs/benchmarks.md, "Postgres appends through one pipelined connection").

Contract:

- `rows(sql, params)` sends `sql` (prepared once per connection; `$1`, `$2`… take `params`,
  as text) followed by a Sync, so each statement is a transaction of its own, committed before
  its rows come back. It returns the statement's rows, each value as the server's text (None
  for NULL). Statements run in the order their `rows` calls were made.
- A statement that fails raises the psycopg exception of its SQLSTATE (`psycopg.errors.lookup`)
  in its own caller only: the Sync after it ends the aborted part of the pipeline there.
- A lost connection raises `psycopg.OperationalError` in every statement still in flight (its
  transaction may or may not have committed, as for any statement whose answer is lost); the
  next `rows` connects again.
- `aclose()` waits for the statements in flight (a few seconds at most: the rest raise
  `psycopg.OperationalError`), then closes the connection; `rows` then raises too.

Only public psycopg API is used: `psycopg.AsyncConnection.connect` for the connection (its
conninfo, options, authentication) and the libpq wrapper `psycopg.pq` for pipeline mode
(`enter_pipeline_mode`, `send_prepare`, `send_query_prepared`, `pipeline_sync`, `flush`,
`consume_input`, `is_busy`, `get_result`), with the event loop's reader and writer callbacks on
the connection's socket. It needs an asyncio loop, as psycopg's async connections do.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import pq

_ExecStatus = pq.ExecStatus

#: A row as the server sent it: each value's text, None for NULL.
TextRow = tuple[bytes | None, ...]


class _Sent:
    """A statement sent and not yet answered: its caller's future and what its results say."""

    __slots__ = ("future", "rows", "error", "prepared")

    def __init__(self, future: asyncio.Future[list[TextRow]], prepared: str | None) -> None:
        self.future = future
        self.rows: list[TextRow] = []
        self.error: Exception | None = None
        #: The statement this one prepared on the way (its name is forgotten if that failed).
        self.prepared = prepared


class Pipeline:
    """Statements over one pipelined connection, answered in the order sent (module docstring)."""

    def __init__(self, conninfo: str, *, options: str = "") -> None:
        self._conninfo = conninfo
        self._options = options
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._connecting = asyncio.Lock()
        #: The statements prepared on the current connection, by their text.
        self._names: dict[str, bytes] = {}
        self._prepares = 0
        self._sent: deque[_Sent] = deque()
        self._writing = False
        self._closed = False
        #: The connection's socket, kept: libpq closes it when it finds the connection lost.
        self._fd = -1
        #: Connections made (tests read it: a lost connection is replaced by the next statement).
        self.connections = 0

    @property
    def backend_pid(self) -> int | None:
        """The server process of the current connection (None: not connected)."""
        return None if self._conn is None else self._conn.pgconn.backend_pid

    async def rows(self, sql: str, params: Sequence[bytes | None]) -> list[TextRow]:
        """Run `sql` as a transaction of its own after every statement sent before it; its rows."""
        conn = self._conn
        if conn is None or self._closed:
            conn = await self._connect()
        # From here to the flush nothing awaits: statements go out in the order of these calls.
        pgconn = conn.pgconn
        future: asyncio.Future[list[TextRow]] = asyncio.get_running_loop().create_future()
        name = self._names.get(sql)
        prepared = None
        try:
            if name is None:
                self._prepares += 1  # never a name used before on this connection
                name = self._names[sql] = b"mcp_durable_%d" % self._prepares
                pgconn.send_prepare(name, sql.encode())
                prepared = sql
            pgconn.send_query_prepared(name, params)
            pgconn.pipeline_sync()
        except psycopg.Error as exc:
            self._lost(exc)
            raise
        self._sent.append(_Sent(future, prepared))
        self._flush()
        return await future

    async def aclose(self, timeout: float = 5.0) -> None:
        """Close the connection once the statements in flight are answered, or after `timeout`
        seconds (those still in flight then raise `psycopg.OperationalError`), as a pool's
        close waits for its connections in use."""
        self._closed = True
        pending = [sent.future for sent in self._sent]
        if pending:
            await asyncio.wait(pending, timeout=timeout)
        self._lost(psycopg.OperationalError("the journal is closed"))

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        async with self._connecting:  # one connection, however many statements wait for it
            if self._closed:
                raise psycopg.OperationalError("the journal is closed")
            if self._conn is None:
                conn = await psycopg.AsyncConnection.connect(self._conninfo, autocommit=True, options=self._options)
                pgconn = conn.pgconn
                pgconn.nonblocking = 1
                pgconn.enter_pipeline_mode()
                self._names = {}
                self._conn = conn
                self._fd = pgconn.socket
                self.connections += 1
                asyncio.get_running_loop().add_reader(self._fd, self._read)
            return self._conn

    def _flush(self) -> None:
        """Send what libpq holds; while some is left, again each time the socket takes more."""
        conn = self._conn
        if conn is None:
            return
        try:
            left = conn.pgconn.flush() == 1
        except psycopg.Error as exc:
            self._lost(exc)
            return
        if left != self._writing:
            loop = asyncio.get_running_loop()
            if left:
                loop.add_writer(self._fd, self._flush)
            else:
                loop.remove_writer(self._fd)
            self._writing = left

    def _read(self) -> None:
        """Take every result the server has sent; answer each statement at its Sync."""
        conn = self._conn
        if conn is None:
            return
        pgconn = conn.pgconn
        try:
            pgconn.consume_input()
            ended = False
            while self._sent and not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    if ended:
                        break  # nothing more yet (a second end in a row: wait for the socket)
                    ended = True  # the end of one command's results (the Prepare's, the Execute's)
                    continue
                ended = False
                sent = self._sent[0]
                status = result.status
                if status == _ExecStatus.PIPELINE_SYNC:
                    self._sent.popleft()
                    self._answer(sent)
                elif status == _ExecStatus.TUPLES_OK:
                    sent.rows = [
                        tuple(result.get_value(row, column) for column in range(result.nfields))
                        for row in range(result.ntuples)
                    ]
                elif status in (_ExecStatus.FATAL_ERROR, _ExecStatus.PIPELINE_ABORTED):
                    if sent.error is None:  # the first error is the cause; the rest were skipped for it
                        sent.error = _error(result, pgconn)
                # COMMAND_OK (a Prepare) carries nothing to keep.
        except psycopg.Error as exc:
            self._lost(exc)
            return
        if pgconn.status != pq.ConnStatus.OK:
            # Lost (the server ended the session, the socket closed): libpq has closed the
            # socket, so the loop would never call again. Fail what is in flight now.
            message = pgconn.error_message.decode(errors="replace").strip()
            self._lost(psycopg.OperationalError(message or "the connection to the journal was lost"))

    def _answer(self, sent: _Sent) -> None:
        if sent.error is not None and sent.prepared is not None:
            self._names.pop(sent.prepared, None)  # prepared in vain: prepare it again next time
        if sent.future.done():
            return
        if sent.error is not None:
            sent.future.set_exception(sent.error)
        else:
            sent.future.set_result(sent.rows)

    def _lost(self, exc: psycopg.Error) -> None:
        """The connection is gone (or closing): fail what is in flight, connect afresh next time."""
        conn, self._conn = self._conn, None
        sent, self._sent = self._sent, deque()
        if conn is not None:
            loop = asyncio.get_running_loop()
            loop.remove_reader(self._fd)
            if self._writing:
                loop.remove_writer(self._fd)
            conn.pgconn.finish()
        self._writing = False
        error = exc if isinstance(exc, psycopg.OperationalError) else psycopg.OperationalError(str(exc))
        for each in sent:
            if not each.future.done():
                each.future.set_exception(error)


def _error(result: pq.abc.PGresult, pgconn: pq.abc.PGconn) -> Exception:
    """The psycopg exception for a failed statement's result (its SQLSTATE's class)."""
    message = (result.error_message or pgconn.error_message).decode(errors="replace").strip()
    if result.status == _ExecStatus.PIPELINE_ABORTED:
        return psycopg.OperationalError(f"pipeline aborted: {message}")
    state = result.error_field(pq.DiagnosticField.SQLSTATE)
    try:
        cls = psycopg.errors.lookup(state.decode()) if state else psycopg.DatabaseError
    except KeyError:
        cls = psycopg.DatabaseError
    return cls(message)
