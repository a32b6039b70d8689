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
