"""A local stand-in for a mail service that does NOT deduplicate: every send is a new mail.

Its outbox (a SQLite file; `$MAILER_OUTBOX`, default `.mcp-durable/outbox.db`) records each mail
with the key the sender passed, but never uses the key to refuse a repeat: sending twice with
one key delivers two mails, like most SMTP relays and e-mail APIs. That is why the mailer tool
needs reconciliation rather than a plain retry: after a crash in the danger window, its
reconcile hook asks `find(key)` whether the mail went out.

Every send is one committed transaction, so the outbox is exact even when the sender is killed
mid-call: a mail is either fully recorded or not at all.
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
from .store import connect, read, rows_as_dicts

ENV_OUTBOX = "MAILER_OUTBOX"
DEFAULT_OUTBOX = ".mcp-durable/outbox.db"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS mails (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL, ts REAL NOT NULL, key TEXT,
    recipient TEXT NOT NULL, subject TEXT NOT NULL, body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS mails_by_key ON mails (key);
"""


class OutboxUnavailable(Exception):
    """The outbox could not be read (so nobody can tell whether a mail went out)."""


@dataclass(frozen=True, slots=True)
class Mail:
    """One mail as the outbox delivered it."""

    id: str
    to: str
    subject: str
    key: str | None

    def as_dict(self) -> dict[str, Any]:
        """What the mailer tool returns for this mail (and what its reconcile hook returns)."""
        return {"id": self.id, "to": self.to, "subject": self.subject, "status": "sent"}


class Outbox:
    """The outbox over one SQLite file. Safe for several processes (SQLite locking)."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = Path(path or config.demo_path(ENV_OUTBOX, DEFAULT_OUTBOX))

    def _connect(self) -> sqlite3.Connection:
        return connect(self.path, _SCHEMA)

    def send(self, to: str, subject: str, body: str, *, key: str | None = None) -> Mail:
        """Deliver a mail. Always a new mail: `key` is recorded, never used to deduplicate."""
        mail = Mail(f"msg_{uuid.uuid4().hex[:16]}", to, subject, key)
        conn = self._connect()
        try:
            conn.execute(
                "INSERT INTO mails (id, ts, key, recipient, subject, body) VALUES (?, ?, ?, ?, ?, ?)",
                (mail.id, time.time(), key, to, subject, body),
            )
        finally:
            conn.close()
        return mail

    def find(self, key: str) -> Mail | None:
        """The first mail sent under `key`, or None. Raises `OutboxUnavailable` when it cannot tell."""
        try:
            sql = "SELECT id, recipient, subject, key FROM mails WHERE key=? ORDER BY seq LIMIT 1"
            row = next(iter(read(self.path, _SCHEMA, sql, (key,))), None)
        except (sqlite3.Error, OSError) as exc:
            raise OutboxUnavailable(f"outbox {self.path}: {exc}") from exc
        return None if row is None else Mail(row[0], row[1], row[2], row[3])

    def mails(self, key: str | None = None) -> list[dict[str, Any]]:
        """Every mail delivered (optionally under one key), oldest first."""
        columns = {"id": "id", "key": "key", "recipient": "to", "subject": "subject", "body": "body"}
        return rows_as_dicts(self.path, _SCHEMA, "mails", columns, None if key is None else ("key", key))
