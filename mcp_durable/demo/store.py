"""The one way the stand-ins open their SQLite files: WAL, fsync on commit, schema ensured.

Every stand-in (ledger, outbox, warehouse) is shared by several processes in the crash tests, so
each write is one committed, fsynced transaction: an effect is fully recorded or not at all,
even when the caller is SIGKILLed mid-call.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def connect(path: Path, schema: str) -> sqlite3.Connection:
    """Open `path` (creating its directory and `schema`) in autocommit mode; use BEGIN IMMEDIATE."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, timeout=30, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.executescript(schema)
    return conn


def read(path: Path, schema: str, sql: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The rows of one query, on a connection opened for it and closed after (a reader in any
    process sees every committed write)."""
    conn = connect(path, schema)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def rows_as_dicts(path: Path, schema: str, table: str, columns: dict[str, str],
                  where: tuple[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every row of `table` (only those whose column `where[0]` equals `where[1]`, when given),
    oldest first (by `seq`), as dicts: `columns` maps each column read to its key in the dict."""
    sql = f"SELECT {', '.join(columns)} FROM {table}"
    args: tuple[Any, ...] = ()
    if where is not None:
        sql += f" WHERE {where[0]}=?"
        args = (where[1],)
    rows = read(path, schema, sql + " ORDER BY seq", args)
    return [dict(zip(columns.values(), row, strict=True)) for row in rows]
