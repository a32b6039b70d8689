"""The journal contract for storage faults: every fault of the storage surfaces as `JournalError`.

A caller (the engine, and through it the MCP face) turns `JournalError` into the refusal
`journal_unavailable`; any other exception escaping a journal becomes an anonymous SDK error and
hides the cause. Each backend gets a real fault of its own storage after records were written:

- file: the segment files are removed under an open journal (a lost or unreadable segment);
- sqlite: a record is corrupted by another connection (a state no version wrote), and the
  database is locked by another connection's exclusive transaction;
- postgres: the journal's schema is dropped by another connection.

The memory journal is exempt: it is a dict in this process, with no storage that can fail.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallState, Journal
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0, pending

IDENTITY = CallIdentity("local", "refund", "k")


async def _written(journal_factory: JournalFactory) -> Journal:
    """A journal holding one completed call and a few process entries, closed and opened again (so
    nothing is answered from what the writing instance kept in memory)."""
    journal = journal_factory()
    await journal.open()
    _, record = await journal.claim(pending(), T0)
    await journal.swap(1, record.evolve(state=CallState.COMPLETED, result=b'{"content":[]}', owner=None))
    await journal.append("p-1", "state_transition", {"to": "running"}, T0)
    await journal.aclose()
    reopened = journal_factory()
    await reopened.open()
    return reopened


async def _is_journal_error(operation: Callable[[], Awaitable[Any]]) -> None:
    with pytest.raises(JournalError):
        await operation()


async def _reads_fail_with_journal_error(journal: Journal) -> None:
    await _is_journal_error(lambda: journal.get(IDENTITY))
    await _is_journal_error(lambda: journal.list_calls())
    await _is_journal_error(lambda: journal.claim(pending(owner="B"), T0 + 1))
    await _is_journal_error(lambda: journal.entries(process_id="p-1"))


async def _fault_file(journal: Journal, tmp_path: Path) -> None:
    segments = sorted((tmp_path / "journal").glob("seg-*.log"))
    assert segments
    for segment in segments:
        segment.unlink()
    await _reads_fail_with_journal_error(journal)


async def _fault_sqlite(journal: Journal, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "journal.db") as other:
        other.execute("UPDATE calls SET state = 'no-such-state'")
    await _is_journal_error(lambda: journal.get(IDENTITY))
    await _is_journal_error(lambda: journal.list_calls())
    await _is_journal_error(lambda: journal.claim(pending(owner="B"), T0 + 1))


async def _fault_sqlite_locked(tmp_path: Path) -> None:
    from mcp_durable.journal.sqlite import SQLiteJournal

    journal = SQLiteJournal(tmp_path / "journal.db", busy_timeout=0.05)  # a short wait for the lock
    await journal.open()
    other = sqlite3.connect(tmp_path / "journal.db", isolation_level=None)
    try:
        other.execute("BEGIN EXCLUSIVE")
        await _is_journal_error(lambda: journal.claim(pending("new"), T0))
        await _is_journal_error(lambda: journal.append("p-2", "state_transition", {}, T0))
    finally:
        other.execute("ROLLBACK")
        other.close()
        await journal.aclose()


async def _fault_postgres(journal: Journal, journal_factory: JournalFactory) -> None:
    import psycopg

    from tests.conftest import PG_URL

    schema = journal_factory.pg_schema  # type: ignore[attr-defined]
    with psycopg.connect(PG_URL, autocommit=True) as other:
        other.execute("SET lock_timeout = '10s'")
        other.execute(f'DROP SCHEMA "{schema}" CASCADE')
    await _reads_fail_with_journal_error(journal)


async def test_a_fault_of_the_storage_surfaces_as_journal_error(
    backend: str, journal_factory: JournalFactory, tmp_path: Path
) -> None:
    if backend == "memory":
        pytest.skip("the memory journal is a dict in this process: it has no storage that can fail")
    journal = await _written(journal_factory)
    try:
        if backend == "file":
            await _fault_file(journal, tmp_path)
        elif backend == "sqlite":
            await _fault_sqlite(journal, tmp_path)
        elif backend == "postgres":
            await _fault_postgres(journal, journal_factory)
        else:
            pytest.fail(f"no storage fault for backend {backend}: add one")
    finally:
        try:
            await journal.aclose()
        except JournalError:
            pass  # closing a faulty journal may fail too, with the same error


async def test_a_locked_sqlite_database_surfaces_as_journal_error(
    backend: str, journal_factory: JournalFactory, tmp_path: Path
) -> None:
    if backend != "sqlite":
        pytest.skip("a lock held by another connection: the sqlite journal's own fault")
    await (await _written(journal_factory)).aclose()
    await _fault_sqlite_locked(tmp_path)
