"""The SQL journals' migration to kept counts (SQLite schema 4, Postgres migration 5): a database
of the previous release opens with this one, its records and entries counted once by the
migration (in its one transaction), and counted by the triggers from then on, whoever writes;
its calls found by tool and key, and its audit entries by call, through the new indexes.

Each old database is built as the previous release built it: SQLite from its DDL (copied
below), Postgres by applying the migrations that had shipped. Real files and a real Postgres.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from mcp_durable.journal import CallIdentity, CallQuery, CallState, CountQuery, Journal, create_journal
from mcp_durable.journal.base import AUDIT_PROCESS
from mcp_durable.journal.postgres import PostgresJournal, PostgresSettings
from mcp_durable.journal.postgres.schema import MIGRATIONS
from mcp_durable.journal.sqlite_schema import COUNT_CALLS_SQL, SCHEMA_VERSION
from tests.backends.pg_cluster import scratch_schema
from tests.conftest import postgres_or_skip
from tests.contract.test_calls import pending

T0 = 1_700_000_000.0

#: The SQLite schema of the release before kept counts (schema 3), as its `sqlite_schema.py` made it.
_SQLITE_SCHEMA_3 = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE calls (
    principal TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL,
    run_id TEXT NOT NULL, attempts INTEGER NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    owner TEXT, lease_until REAL, completed_at REAL, expires_at REAL,
    result BLOB, error TEXT, arguments BLOB, task_id TEXT, reason TEXT,
    PRIMARY KEY (principal, tool, key)
);
CREATE TABLE entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    process_id TEXT NOT NULL, entry_type TEXT NOT NULL, data BLOB NOT NULL, ts REAL NOT NULL,
    step_index INTEGER
);
CREATE INDEX calls_by_created ON calls (created_at, principal, tool, key);
CREATE INDEX calls_by_expiry ON calls (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX calls_by_task ON calls (principal, task_id) WHERE task_id IS NOT NULL;
CREATE INDEX entries_by_process ON entries (process_id, seq);
CREATE UNIQUE INDEX entries_by_step ON entries (process_id, step_index) WHERE step_index IS NOT NULL;
INSERT INTO meta VALUES ('schema_version', '3');
"""

_INSERT_CALL = (
    "INSERT INTO {calls} (principal, tool, key, fingerprint, state, version, run_id, attempts, "
    "created_at, updated_at) VALUES ({marks})"
)


def _old_calls() -> list[tuple[Any, ...]]:
    """Records of three principals, two tools and four states, created a minute apart."""
    states = ("completed", "failed", "pending", "in_doubt")
    return [
        (principal, tool, f"{principal}-{tool}-{n}", "f", states[n % 4], 1, f"run-{n}", 1, T0 + 60 * n, T0 + 60 * n)
        for n, (principal, tool) in enumerate(
            (p, t) for p in ("alice", "bob", "carol") for t in ("refund", "ship") for _ in range(3)
        )
    ]


def _old_entries() -> list[tuple[str, str, bytes]]:
    call = {"principal": "alice", "tool": "refund", "key": "alice-refund-0"}
    return [
        ("steps/run-0", "step", orjson.dumps({"index": 0, "name": "a"})),
        ("server/x", "state_transition", orjson.dumps({"to": "running"})),
        (AUDIT_PROCESS, "operator_action", orjson.dumps({**call, "action": "forget"})),
    ]


async def _check_counted(journal: Journal, opening: int) -> None:
    """Counts equal the records, before and after writes through the migrated journal (opened
    the `opening`th time: each writes records of its own)."""
    audited = CallIdentity("alice", "refund", "alice-refund-0")
    assert [e.data["action"] for e in await journal.audit_entries(audited)] == ["forget"]
    assert [r.identity for r in await journal.find_calls("refund", "alice-refund-0")] == [audited]
    for round in (2 * opening, 2 * opening + 1):
        records = await journal.list_calls(CallQuery(limit=1000))
        for query in (CountQuery(), CountQuery(principal="bob"), CountQuery(since=T0 + 100, bucket_s=60)):
            assert await journal.count_calls(query) == query.count(records)
        stats = await journal.stats()
        assert stats.entries == len(await journal.entries())
        assert stats.calls_by_state == (await journal.count_calls()).by_state
        # Writes after the migration are counted by the triggers.
        _, new = await journal.claim(pending(f"new-{round}", principal="bob", created=T0 + 10_000), T0 + 10_000)
        assert await journal.swap(new.version, new.evolve(state=CallState.COMPLETED, owner=None))
        await journal.append("p", "x", {}, T0)
        tool, n = (("refund", 1), ("refund", 2), ("ship", 3), ("ship", 4))[round]
        gone = await journal.get(CallIdentity("alice", tool, f"alice-{tool}-{n}"))
        assert gone is not None
        assert await journal.swap(gone.version, gone.evolve(expires_at=T0))
        assert await journal.purge_expired(T0 + 1) == 1
        await journal.claim(pending(f"dave-{round}", principal="dave", created=T0 + 20_000), T0 + 20_000)


# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_at(path: Path) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.executescript(_SQLITE_SCHEMA_3)
        conn.executemany(_INSERT_CALL.format(calls="calls", marks=", ".join("?" * 10)), _old_calls())
        conn.executemany("INSERT INTO entries (process_id, entry_type, data, ts) VALUES (?, ?, ?, 1.0)", _old_entries())
        conn.commit()
    finally:
        conn.close()


async def test_a_sqlite_journal_of_schema_3_is_counted_by_its_migration_and_then_by_triggers(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _sqlite_at(path)
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    try:
        with sqlite3.connect(path) as conn:
            assert conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone() == (
                str(SCHEMA_VERSION),
            )
            # Kept: the final records only; the open ones are counted from `calls_open` (schema 6).
            kept = dict(conn.execute("SELECT state, sum(n) FROM call_counts GROUP BY state").fetchall())
            final = [row[4] for row in _old_calls() if row[4] not in ("pending", "in_doubt")]
            assert kept == {state: final.count(state) for state in set(final)}
        await _check_counted(journal, 0)
    finally:
        await journal.aclose()
    # Reopening migrates nothing again: the counts are not doubled.
    again = create_journal(f"sqlite:///{path}")
    await again.open()
    try:
        await _check_counted(again, 1)
    finally:
        await again.aclose()


def test_the_sqlite_migration_counts_by_reading_the_table_in_order_not_through_an_index(tmp_path: Path) -> None:
    """The migration's count reads every record inside the write lock that processes of the
    earlier release wait on: a scan of the table, not a walk of the primary key's index that
    looks each row up in the table again for its state (a random read a record)."""
    path = tmp_path / "journal.db"
    _sqlite_at(path)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE call_counts (principal TEXT NOT NULL, tool TEXT NOT NULL, state TEXT NOT NULL, "
            "n INTEGER NOT NULL, PRIMARY KEY (principal, tool, state))"
        )
        plan = [row[3] for row in conn.execute("EXPLAIN QUERY PLAN " + COUNT_CALLS_SQL)]
    scans = [step for step in plan if step.startswith("SCAN calls")]
    assert scans == ["SCAN calls"], plan


async def test_writes_of_another_sqlite_connection_are_counted_too(tmp_path: Path) -> None:
    """The triggers live in the database: a writer that is not this journal (another process,
    a release before this one) is counted as well."""
    path = tmp_path / "journal.db"
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    try:
        with sqlite3.connect(path) as conn:
            conn.executemany(_INSERT_CALL.format(calls="calls", marks=", ".join("?" * 10)), _old_calls())
            conn.execute("UPDATE calls SET state = 'released' WHERE principal = 'carol'")
            conn.execute("DELETE FROM calls WHERE principal = 'bob' AND tool = 'ship'")
            conn.executemany(
                "INSERT INTO entries (process_id, entry_type, data, ts) VALUES (?, ?, ?, 1.0)", _old_entries()
            )
        records = await journal.list_calls(CallQuery(limit=1000))
        assert await journal.count_calls() == CountQuery().count(records)
        assert (await journal.count_calls(CountQuery(principal="carol"))).by_state == {"released": 6}
        assert (await journal.stats()).entries == len(_old_entries())
    finally:
        await journal.aclose()


# -- Postgres ---------------------------------------------------------------------------------


@pytest.fixture
def schema_url() -> Iterator[str]:
    with scratch_schema() as url:
        yield url


def _postgres_at(url: str, base: str, version: int) -> None:
    settings = PostgresSettings.from_url(url)
    s = f'"{settings.schema}"'
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(
            f"CREATE TABLE {s}.schema_version (version integer PRIMARY KEY, description text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in MIGRATIONS[:version]:
            for statement in migration.statements:
                conn.execute(statement.format(s=s, channel=f"'{settings.channel}'"))
            conn.execute(
                f"INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
                (migration.version, migration.description),
            )
        with conn.cursor() as cur:
            cur.executemany(_INSERT_CALL.format(calls=f"{s}.calls", marks=", ".join(["%s"] * 10)), _old_calls())
            for process, kind, data in _old_entries():
                cur.execute(
                    f"INSERT INTO {s}.entries (process_id, entry_type, data, ts) VALUES (%s, %s, %s::json, 1)",
                    (process, kind, data.decode()),
                )


@pytest.mark.postgres
async def test_a_postgres_schema_of_migration_4_is_counted_by_migration_5_and_then_by_triggers(
    schema_url: str,
) -> None:
    base = postgres_or_skip()
    _postgres_at(schema_url, base, 4)
    journal = create_journal(schema_url)
    await journal.open()
    try:
        assert isinstance(journal, PostgresJournal) and journal.migrations_applied == [5, 6, 7]
        await _check_counted(journal, 0)
    finally:
        await journal.aclose()
    again = create_journal(schema_url)
    await again.open()
    try:
        assert isinstance(again, PostgresJournal) and again.migrations_applied == []
        await _check_counted(again, 1)
    finally:
        await again.aclose()


@pytest.mark.postgres
async def test_writes_of_another_postgres_session_are_counted_too(schema_url: str) -> None:
    base = postgres_or_skip()
    journal = create_journal(schema_url)
    await journal.open()
    try:
        s = f'"{PostgresSettings.from_url(schema_url).schema}"'
        with psycopg.connect(base, autocommit=True) as conn:
            conn.cursor().executemany(
                _INSERT_CALL.format(calls=f"{s}.calls", marks=", ".join(["%s"] * 10)), _old_calls()
            )
            conn.execute(f"UPDATE {s}.calls SET state = 'released' WHERE principal = 'carol'")
            conn.execute(f"DELETE FROM {s}.calls WHERE principal = 'bob' AND tool = 'ship'")
        records = await journal.list_calls(CallQuery(limit=1000))
        assert await journal.count_calls() == CountQuery().count(records)
        assert (await journal.count_calls(CountQuery(principal="carol"))).by_state == {"released": 6}
    finally:
        await journal.aclose()
