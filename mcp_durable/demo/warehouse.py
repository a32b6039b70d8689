"""A local stand-in for a warehouse and a carrier, honouring idempotency keys per operation.

Its database (a SQLite file; `$WAREHOUSE_DB`, default `.mcp-durable/warehouse.db`) holds stock,
reservations, shipping labels and customer notifications. Every operation takes a key: a
repeat with a key already seen returns the first result and changes nothing, so a durable step
that is re-run after a crash in its own danger window does not reserve, buy or notify twice.
`operations` logs every request (`applied` or `deduplicated`), so tests can count both.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from .. import config
from .store import connect, rows_as_dicts

ENV_WAREHOUSE = "WAREHOUSE_DB"
DEFAULT_WAREHOUSE = ".mcp-durable/warehouse.db"
DEFAULT_STOCK = 1_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS stock (sku TEXT PRIMARY KEY, available INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY, op TEXT NOT NULL, order_id TEXT NOT NULL, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS operations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, op TEXT NOT NULL, order_id TEXT NOT NULL,
    key TEXT NOT NULL, outcome TEXT NOT NULL
);
"""


class OutOfStock(Exception):
    """No unit of the SKU is left to reserve."""


class Warehouse:
    """The stand-in over one SQLite file. Safe for several processes (SQLite locking)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path or config.demo_path(ENV_WAREHOUSE, DEFAULT_WAREHOUSE))

    def _connect(self) -> sqlite3.Connection:
        return connect(self.path, _SCHEMA)

    def _once(self, op: str, order_id: str, key: str, make: Any) -> str:
        """Run `make(conn)` once per key in one transaction; a repeat returns the first value."""
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                row = conn.execute("SELECT value FROM results WHERE key=?", (key,)).fetchone()
                if row is not None:
                    value, outcome = str(row[0]), "deduplicated"
                else:
                    value, outcome = make(conn), "applied"
                    conn.execute("INSERT INTO results VALUES (?, ?, ?, ?)", (key, op, order_id, value))
                conn.execute(
                    "INSERT INTO operations (ts, op, order_id, key, outcome) VALUES (?, ?, ?, ?, ?)",
                    (time.time(), op, order_id, key, outcome),
                )
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return value
        finally:
            conn.close()

    def reserve(self, order_id: str, sku: str, *, key: str) -> str:
        """Reserve one unit of `sku` for the order; returns the reservation id."""

        def make(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT OR IGNORE INTO stock VALUES (?, ?)", (sku, DEFAULT_STOCK))
            left = conn.execute("SELECT available FROM stock WHERE sku=?", (sku,)).fetchone()[0]
            if left <= 0:
                raise OutOfStock(sku)
            conn.execute("UPDATE stock SET available = available - 1 WHERE sku=?", (sku,))
            return f"res_{uuid.uuid4().hex[:12]}"

        return self._once("reserve", order_id, key, make)

    def buy_label(self, order_id: str, *, key: str) -> str:
        """Buy a shipping label from the carrier; returns its tracking number."""
        return self._once("label", order_id, key, lambda conn: f"TRK{uuid.uuid4().hex[:10].upper()}")

    def notify(self, order_id: str, tracking: str, *, key: str) -> str:
        """Tell the customer the order shipped; returns the notification id."""
        return self._once("notify", order_id, key, lambda conn: f"ntf_{uuid.uuid4().hex[:12]}")

    def available(self, sku: str) -> int:
        conn = self._connect()
        try:
            row = conn.execute("SELECT available FROM stock WHERE sku=?", (sku,)).fetchone()
        finally:
            conn.close()
        return DEFAULT_STOCK if row is None else int(row[0])

    def operations(self, order_id: str | None = None) -> list[dict[str, Any]]:
        """Every request received (optionally for one order), oldest first."""
        columns = {"op": "op", "order_id": "order_id", "key": "key", "outcome": "outcome"}
        where = None if order_id is None else ("order_id", order_id)
        return rows_as_dicts(self.path, _SCHEMA, "operations", columns, where)
