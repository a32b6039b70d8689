"""The stand-ins' SQLite opening (`mcp_durable.demo.store.connect`) when others hold the file.

Three replicas' first calls open a new ledger at the same moment; one opening used to fail with
`database is locked` at once (no wait for the busy timeout), which reached a caller as "Error
executing tool refund". These tests put one opening in exactly that position.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from mcp_durable.demo.ledger import PaymentProvider
from mcp_durable.demo.store import connect

SCHEMA = "CREATE TABLE IF NOT EXISTS notes (id INTEGER PRIMARY KEY, text TEXT NOT NULL);"


@contextmanager
def another_opener_writing(path: Path) -> Iterator[None]:
    """Another opener in the middle of writing the new file (its schema, say): it holds the write
    lock from before the block until shortly after the block has started, then commits."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Event()

    def commit_when_released() -> None:
        release.wait(0.2)  # long enough for the block to be asking for the file
        holder.execute("COMMIT")

    thread = threading.Thread(target=commit_when_released)
    thread.start()
    try:
        yield
    finally:
        release.set()
        thread.join()
        holder.close()


def test_opening_a_new_file_waits_for_another_openers_write_lock_instead_of_failing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    # The opening reads the new file, then needs the write lock to switch it to WAL: the case
    # SQLite answers busy at once for, without its busy timeout.
    with another_opener_writing(path):
        conn = connect(path, SCHEMA)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        conn.execute("INSERT INTO notes (text) VALUES ('written')")
        assert conn.execute("SELECT text FROM notes").fetchall() == [("written",)]
    finally:
        conn.close()


def test_a_refund_on_a_new_ledger_another_opener_is_writing_is_made_once(tmp_path: Path) -> None:
    ledger = PaymentProvider(tmp_path / "ledger.db")
    with another_opener_writing(ledger.path):
        effect = ledger.refund("O-1", 500, idempotency_key="k-1")
    assert [e["id"] for e in ledger.effects()] == [effect.id]
    assert [r["outcome"] for r in ledger.requests()] == ["applied"]
