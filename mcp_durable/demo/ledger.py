"""A local stand-in for a payment provider that honours idempotency keys like Stripe.

Its ledger (a SQLite file; `$PAYMENTS_LEDGER`, default `.mcp-durable/payments-ledger.db`) keeps
every *request* and every *effect* apart, so duplicates and deduplications are both visible:

- `requests`: one row per API call received (`outcome` = `applied` or `deduplicated`);
- `effects`: one row per money movement actually made.

A request with an idempotency key already seen returns the first effect and makes no new one;
a request without a key always makes a new effect (which is how duplicate refunds happen).
Every write is one committed transaction, so the ledger is exact even when the caller is
killed mid-call: an effect is either fully recorded or not at all.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import config
from .store import connect, read

ENV_LEDGER = "PAYMENTS_LEDGER"
DEFAULT_LEDGER = ".mcp-durable/payments-ledger.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT, ts REAL NOT NULL, op TEXT NOT NULL, subject TEXT NOT NULL,
    amount_cents INTEGER NOT NULL, idempotency_key TEXT, outcome TEXT NOT NULL, effect_id TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS effects (
    id TEXT PRIMARY KEY, ts REAL NOT NULL, op TEXT NOT NULL, subject TEXT NOT NULL,
    amount_cents INTEGER NOT NULL, idempotency_key TEXT UNIQUE
);
"""


@dataclass(frozen=True)
class Effect:
    id: str
    op: str
    subject: str
    amount_cents: int
    idempotency_key: str | None
    deduplicated: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "op": self.op,
            "subject": self.subject,
            "amount_cents": self.amount_cents,
            "status": "succeeded",
        }


class PaymentProvider:
    """The stand-in provider over one ledger file. Safe for several processes (SQLite locking)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path or config.demo_path(ENV_LEDGER, DEFAULT_LEDGER))
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def _connect(self) -> sqlite3.Connection:
        return connect(self.path, _SCHEMA)

    def _move(self, op: str, subject: str, amount_cents: int, idempotency_key: str | None) -> Effect:
        prefix = {"refund": "re", "charge": "ch"}[op]
        conn = self._connect()
        try:
            conn.execute("BEGIN IMMEDIATE")
            row = None
            if idempotency_key is not None:
                row = conn.execute(
                    "SELECT id, subject, amount_cents FROM effects WHERE idempotency_key=?", (idempotency_key,)
                ).fetchone()
            if row is not None:
                effect = Effect(row[0], op, row[1], row[2], idempotency_key, deduplicated=True)
            else:
                effect = Effect(f"{prefix}_{uuid.uuid4().hex[:16]}", op, subject, amount_cents, idempotency_key, False)
                conn.execute(
                    "INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?)",
                    (effect.id, time.time(), op, subject, amount_cents, idempotency_key),
                )
            conn.execute(
                "INSERT INTO requests (ts, op, subject, amount_cents, idempotency_key, outcome, effect_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    time.time(),
                    op,
                    subject,
                    amount_cents,
                    idempotency_key,
                    "deduplicated" if effect.deduplicated else "applied",
                    effect.id,
                ),
            )
            conn.execute("COMMIT")
            return effect
        finally:
            conn.close()

    def refund(self, order_id: str, amount_cents: int, idempotency_key: str | None = None) -> Effect:
        """Refund `amount_cents` on `order_id`; a repeated key returns the first refund."""
        return self._move("refund", order_id, amount_cents, idempotency_key)

    def charge(self, customer_id: str, amount_cents: int, idempotency_key: str | None = None) -> Effect:
        """Charge `customer_id`; a repeated key returns the first charge."""
        return self._move("charge", customer_id, amount_cents, idempotency_key)

    def find(self, idempotency_key: str) -> Effect | None:
        """The effect made under a key, if any (what a reconcile hook asks)."""
        sql = "SELECT id, op, subject, amount_cents FROM effects WHERE idempotency_key=?"
        row = next(iter(read(self.path, _SCHEMA, sql, (idempotency_key,))), None)
        return None if row is None else Effect(row[0], row[1], row[2], row[3], idempotency_key, False)

    def effects(self, op: str | None = None, subject: str | None = None) -> list[dict[str, Any]]:
        """Every effect made (money actually moved), oldest first."""
        conn = self._connect()
        try:
            sql = "SELECT id, op, subject, amount_cents, idempotency_key FROM effects WHERE 1=1"
            args: list[Any] = []
            if op is not None:
                sql += " AND op=?"
                args.append(op)
            if subject is not None:
                sql += " AND subject=?"
                args.append(subject)
            rows = conn.execute(sql + " ORDER BY ts", args).fetchall()
        finally:
            conn.close()
        keys = ("id", "op", "subject", "amount_cents", "idempotency_key")
        return [dict(zip(keys, row, strict=True)) for row in rows]

    def requests(self) -> list[dict[str, Any]]:
        """Every request received, oldest first, with `outcome` applied or deduplicated."""
        conn = self._connect()
        try:
            rows = conn.execute(
                "SELECT op, subject, amount_cents, idempotency_key, outcome, effect_id FROM requests ORDER BY id"
            ).fetchall()
        finally:
            conn.close()
        keys = ("op", "subject", "amount_cents", "idempotency_key", "outcome", "effect_id")
        return [dict(zip(keys, row, strict=True)) for row in rows]
