"""Fencing across processes on the SQL journals: two journals on one database (two connections,
as two server processes or replicas would have) and a raw connection standing for a third.

A durable step is written by one of them only (first writer wins), and a take-over committed by
another process fences the old owner out, even when its step or renewal was already waiting for
the row the take-over held.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Fence, Journal, JournalEntry, create_journal
from mcp_durable.journal.postgres import PostgresSettings
from tests.backends.pg_cluster import scratch_schema
from tests.conftest import postgres_or_skip

T0 = 1_700_000_000.0

#: A take-over as another process commits it: owner B, the next attempt, the next version.
_TAKE_OVER = "UPDATE {calls} SET owner = 'B', attempts = attempts + 1, version = version + 1 WHERE key = 'k'"


def pending(key: str = "k") -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner="A",
        lease_until=T0 + 30,
    )


class Other:
    """Another process's connection to the journal's database, in one transaction until `commit`."""

    def __init__(self, conn: sqlite3.Connection | psycopg.Connection[Any], calls: str) -> None:
        self._conn = conn
        self.calls = calls  # the table of call records, as this connection names it

    def execute(self, sql: str) -> None:
        self._conn.execute(sql)

    def commit(self) -> None:
        if isinstance(self._conn, sqlite3.Connection):
            self._conn.execute("COMMIT")
        else:
            self._conn.commit()

    def close(self) -> None:
        self._conn.close()  # rolls back what is not committed


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Callable[[], Other]]]:
    """A journal URL, and how to open another process's connection to its database (closed at
    the end, before the Postgres schema is dropped)."""
    connections: list[Other] = []
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            path = tmp_path / "journal.db"
            url = f"sqlite:///{path}"

            def other() -> Other:
                conn = sqlite3.connect(path, isolation_level=None)
                conn.execute("BEGIN IMMEDIATE")  # the database's write lock, held until the commit
                connections.append(Other(conn, "calls"))
                return connections[-1]
        else:
            url = stack.enter_context(scratch_schema())
            calls = f'"{PostgresSettings.from_url(url).schema}".calls'

            def other() -> Other:
                connections.append(Other(psycopg.connect(postgres_or_skip()), calls))  # one transaction
                return connections[-1]

        try:
            yield url, other
        finally:
            for connection in connections:
                connection.close()


async def opened(url: str) -> Journal:
    journal = create_journal(url)
    await journal.open()
    return journal


async def test_of_two_processes_writing_one_step_exactly_one_writes_it(
    database: tuple[str, Callable[[], Other]],
) -> None:
    url, _ = database
    first, second = await opened(url), await opened(url)
    try:
        _, record = await first.claim(pending(), T0)
        fence = record.fence
        assert fence is not None
        written: list[JournalEntry | None] = []

        async def step(journal: Journal, index: int, writer: str) -> None:
            written.append(await journal.append_step(record.identity, fence, index, {"writer": writer}, T0))

        async with anyio.create_task_group() as tg:
            for index in range(20):
                for journal, writer in ((first, "first"), (second, "second")):
                    tg.start_soon(step, journal, index, writer)
        stored = await first.entries(process_id="steps/run-k")
        assert sorted(e.data["index"] for e in stored) == list(range(20))
        assert sorted(e.seq for e in written if e is not None) == [e.seq for e in stored]
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_take_over_committed_while_the_old_owner_waits_fences_it_out(
    database: tuple[str, Callable[[], Other]],
) -> None:
    url, other_process = database
    journal = await opened(url)
    try:
        _, record = await journal.claim(pending(), T0)
        fence = record.fence
        assert fence is not None
        other = other_process()
        other.execute(_TAKE_OVER.format(calls=other.calls))  # not committed yet: the row is held
        outcomes: dict[str, Any] = {}

        async def step() -> None:
            outcomes["step"] = await journal.append_step(record.identity, fence, 0, {"name": "late"}, T0)

        async def renew() -> None:
            outcomes["renew"] = await journal.renew(record.identity, fence, T0 + 60)

        async with anyio.create_task_group() as tg:
            tg.start_soon(step)
            tg.start_soon(renew)
            await anyio.sleep(0.5)  # both wait for the row (the database's write lock, or the row lock)
            assert outcomes == {}
            other.commit()
            other.close()
        assert outcomes == {"step": None, "renew": False}
        assert await journal.entries(process_id="steps/run-k") == []
        taken = await journal.get(record.identity)
        assert taken is not None and taken.fence == Fence("B", "run-k", 2) and taken.lease_until == T0 + 30
        assert await journal.append_step(record.identity, taken.fence, 0, {"name": "new owner"}, T0) is not None
    finally:
        await journal.aclose()
