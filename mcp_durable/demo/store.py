"""The one way the stand-ins open their SQLite files: WAL, fsync on commit, schema ensured.

Every stand-in (ledger, outbox, warehouse) is shared by several processes in the crash tests, so
each write is one committed, fsynced transaction: an effect is fully recorded or not at all,
even when the caller is SIGKILLed mid-call.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

#: How long an opening or a write waits for another connection's lock (SQLite's busy timeout).
BUSY_TIMEOUT = 30.0


def connect(path: Path, schema: str) -> sqlite3.Connection:
    """Open `path` (creating its directory and `schema`) in autocommit mode; use BEGIN IMMEDIATE.

    Any number of processes and threads may open the same new file at once: each waits up to
    `BUSY_TIMEOUT` for the others' locks, none fails with `database is locked` before that.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT, isolation_level=None)
    try:
        _set_up(conn, schema)
    except BaseException:
        conn.close()
        raise
    return conn


def _set_up(conn: sqlite3.Connection, schema: str) -> None:
    """WAL mode, FULL sync and `schema`, run again while SQLite answers busy without waiting.

    The busy timeout does not cover the switch of a new file into WAL: SQLite reads page 1 under
    a shared lock, then needs the write lock to mark the file WAL, and a connection that holds a
    read lock while asking for the write lock gets SQLITE_BUSY at once, never the busy handler
    (waiting there could deadlock two such connections). Several processes opening a new ledger at
    once (three replicas' first calls) hit exactly that: one of them raised `database is locked`
    in about one burst in thirty. The failed statement has released its locks and every step here
    is idempotent, so the whole setup is run again, for as long as the busy timeout would wait.
    Once the file is WAL (its header says so), the pragma only reads and this never repeats.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.executescript(schema)
            return
        except sqlite3.OperationalError as exc:
            if not _busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _busy(exc: sqlite3.OperationalError) -> bool:
    """True for SQLITE_BUSY and its extended codes (`database is locked`)."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_BUSY


def read(path: Path, schema: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of one query, on a connection opened for it and closed after (a reader in any
    process sees every committed write)."""
    conn = connect(path, schema)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def rows_as_dicts(
    path: Path, schema: str, table: str, columns: dict[str, str], where: tuple[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Every row of `table` (only those whose column `where[0]` equals `where[1]`, when given),
    oldest first (by `seq`), as dicts: `columns` maps each column read to its key in the dict."""
    sql = f"SELECT {', '.join(columns)} FROM {table}"
    args: tuple[Any, ...] = ()
    if where is not None:
        sql += f" WHERE {where[0]}=?"
        args = (where[1],)
    rows = read(path, schema, sql + " ORDER BY seq", args)
    return [dict(zip(columns.values(), row, strict=True)) for row in rows]
