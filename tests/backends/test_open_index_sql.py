"""The SQL journals' index of open records (`calls_open`: SQLite schema 5, Postgres migration 6).

The task watch, the start-up sweep, recovery and the in-doubt listings list PENDING or IN_DOUBT
records. Before this index SQLite answered them by walking every record newest first (`SCAN
calls USING INDEX calls_by_created`, filtering on `state`): on the one writer thread, once a
second for the watch alone. Here the plan of each such statement, as the journal sends it
(`listing`), is read from the database: a search of `calls_open` in listing order, with no
walk over the table and no sort, on SQLite (`EXPLAIN QUERY PLAN`) and on Postgres (`EXPLAIN`,
the plan for these parameters and the generic plan of a prepared statement). And a database of
the previous schema opens with this release: its records kept, the index added once.

The old databases are built as the previous release built them: SQLite from its DDL (copied
below), Postgres by applying the migrations that had shipped. Real files and a real Postgres.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql

from mcp_durable.journal import CallCursor, CallIdentity, CallQuery, CallRecord, CallState, CountQuery, create_journal
from mcp_durable.journal.base import each_call
from mcp_durable.journal.postgres import PostgresJournal, PostgresSettings
from mcp_durable.journal.postgres.schema import MIGRATIONS
from mcp_durable.journal.sql_rows import CALL_COLUMNS, call_row
from mcp_durable.journal.sqlite import SQLiteJournal
from mcp_durable.journal.sqlite_schema import SCHEMA_VERSION
from tests.backends.pg_cluster import scratch_schema
from tests.conftest import postgres_or_skip
from tests.contract.test_calls import T0
from tests.contract.test_open_calls import STATES, _moved, _queries, _record

#: The listings of open records the engine and the face send (one per caller), and a few more:
#: with a cursor (the second page on), a principal's, a tool's.
AFTER = CallCursor(T0 + 5, CallIdentity("bob", "ship", "k015"))
LISTINGS = (
    CallQuery(state=CallState.PENDING, tasks_only=True, limit=500),  # the task watch
    CallQuery(state=CallState.IN_DOUBT, tasks_only=True, limit=500, cursor=AFTER),  # … and resume_all
    CallQuery(state=CallState.PENDING, limit=500),  # the start-up sweep
    CallQuery(state=CallState.IN_DOUBT, limit=200, cursor=AFTER),  # background recovery
    CallQuery(state=CallState.IN_DOUBT, principal="alice", limit=500),  # a principal's in-doubt listing
    CallQuery(state=CallState.PENDING, principal="alice", tool="ship", limit=100, cursor=AFTER),
)

#: The SQLite schema of the release before `calls_open` (schema 4), as its `sqlite_schema.py` made it.
SQLITE_SCHEMA_4 = """
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
CREATE TABLE call_counts (
    principal TEXT NOT NULL, tool TEXT NOT NULL, state TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (principal, tool, state)
) WITHOUT ROWID;
CREATE TABLE tallies (name TEXT PRIMARY KEY, n INTEGER NOT NULL);
CREATE TRIGGER calls_counted_insert AFTER INSERT ON calls BEGIN INSERT INTO call_counts
    VALUES (NEW.principal, NEW.tool, NEW.state, 1) ON CONFLICT (principal, tool, state) DO UPDATE SET n = n + 1; END;
CREATE TRIGGER calls_counted_update AFTER UPDATE OF state ON calls WHEN OLD.state IS NOT NEW.state BEGIN
    UPDATE call_counts SET n = n - 1 WHERE principal = OLD.principal AND tool = OLD.tool AND state = OLD.state;
    INSERT INTO call_counts VALUES (NEW.principal, NEW.tool, NEW.state, 1)
    ON CONFLICT (principal, tool, state) DO UPDATE SET n = n + 1; END;
CREATE TRIGGER calls_counted_delete AFTER DELETE ON calls BEGIN
    UPDATE call_counts SET n = n - 1 WHERE principal = OLD.principal AND tool = OLD.tool AND state = OLD.state; END;
CREATE TRIGGER entries_counted_insert AFTER INSERT ON entries BEGIN
    UPDATE tallies SET n = n + 1 WHERE name = 'entries'; END;
CREATE TRIGGER entries_counted_delete AFTER DELETE ON entries BEGIN
    UPDATE tallies SET n = n - 1 WHERE name = 'entries'; END;
CREATE INDEX calls_by_created ON calls (created_at, principal, tool, key);
CREATE INDEX calls_by_expiry ON calls (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX calls_by_task ON calls (principal, task_id) WHERE task_id IS NOT NULL;
CREATE INDEX entries_by_process ON entries (process_id, seq);
CREATE UNIQUE INDEX entries_by_step ON entries (process_id, step_index) WHERE step_index IS NOT NULL;
CREATE INDEX calls_by_principal_created ON calls (principal, created_at);
CREATE INDEX entries_by_audit ON entries (json_extract(CAST(data AS TEXT), '$.principal'),
    json_extract(CAST(data AS TEXT), '$.tool'), json_extract(CAST(data AS TEXT), '$.key'), seq)
    WHERE process_id = 'mcp-durable/operator-actions';
INSERT INTO tallies VALUES ('entries', 0);
INSERT INTO meta VALUES ('schema_version', '4');
"""


def _records(count: int) -> list[CallRecord]:
    """`count` records in every state in turn (`STATES`), as a previous release stored them."""
    return [
        r if (state := STATES[n % len(STATES)]) == CallState.PENDING else _moved(r, state)
        for n, r in enumerate(_record(n) for n in range(count))
    ]


def _done(n: int) -> tuple[Any, ...]:
    """The row of a completed record: the many records the open listings must not read."""
    record = _record(1000 + n)
    return call_row(dataclasses.replace(_moved(record, CallState.COMPLETED), created_at=T0 + n / 100))


async def _check_open_listings(url: str, stored: list[CallRecord]) -> None:
    """The journal at `url` holds `stored` (and the completed `_done` rows), and lists the
    open ones as `CallQuery.page` selects them, page after page."""
    journal = create_journal(url)
    await journal.open()
    try:
        everything = await journal.list_calls(CallQuery(limit=100_000))
        kept = {r.identity: r for r in everything if len(r.identity.key) == 4}  # not a `_done` row
        assert kept == {r.identity: r for r in stored}
        assert await journal.count_calls() == CountQuery().count(everything)
        for query in _queries():
            expected = dataclasses.replace(query, limit=len(everything)).page(everything)
            assert [r async for r in each_call(journal, query)] == expected
    finally:
        await journal.aclose()


# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_plan(path: Path, query: CallQuery) -> list[str]:
    """`EXPLAIN QUERY PLAN` of the statement `list_calls(query)` runs: one line per step."""
    sql, args = SQLiteJournal.listing(query)
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", args)]


def _assert_searches_calls_open(plan: list[str], query: CallQuery) -> None:
    """The plan searches `calls_open` for the query's state, in listing order: nothing else is
    read. With a principal or a tool as well, SQLite (3.40) also sorts the records of one
    creation time among themselves (`RIGHT PART OF ORDER BY`: it does not see that the filter
    fixes a column in the middle of the index), still reading the index in order."""
    assert plan[0].startswith("SEARCH calls USING INDEX calls_open (state=?"), plan
    ties = ["USE TEMP B-TREE FOR RIGHT PART OF ORDER BY"] if query.principal or query.tool else []
    assert plan[1:] == ties, plan


def _fill_sqlite(path: Path, records: list[CallRecord], done: int) -> None:
    marks = ", ".join("?" * len(CALL_COLUMNS.split(", ")))
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executemany(f"INSERT INTO calls ({CALL_COLUMNS}) VALUES ({marks})", [call_row(r) for r in records])
        conn.executemany(f"INSERT INTO calls ({CALL_COLUMNS}) VALUES ({marks})", [_done(n) for n in range(done)])


async def test_every_sqlite_listing_of_open_records_searches_calls_open(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    await journal.aclose()
    _fill_sqlite(path, _records(50), 5000)
    for query in LISTINGS:
        _assert_searches_calls_open(_sqlite_plan(path, query), query)
    # Any other listing is left as it was (the index holds none of its records).
    assert "calls_open" not in " ".join(_sqlite_plan(path, CallQuery(state=CallState.COMPLETED)))
    await _check_open_listings(f"sqlite:///{path}", _records(50))


async def test_a_sqlite_journal_of_schema_4_gains_calls_open_and_keeps_its_records(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executescript(SQLITE_SCHEMA_4)
        conn.execute("INSERT INTO entries (process_id, entry_type, data, ts) VALUES ('p', 'x', '{}', 1.0)")
    records = _records(60)
    _fill_sqlite(path, records, 300)
    for reopening in range(2):  # the migration, then an open that finds nothing to do
        await _check_open_listings(f"sqlite:///{path}", records)
        with contextlib.closing(sqlite3.connect(path)) as conn:
            assert conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone() == (
                str(SCHEMA_VERSION),
            )
            assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'calls_open'").fetchone() == (1,)
            tallies = dict(conn.execute("SELECT name, n FROM tallies").fetchall())
            assert tallies == {"entries": 1, "entries_mark": 1}, reopening
        for query in LISTINGS:
            _assert_searches_calls_open(_sqlite_plan(path, query), query)


# -- Postgres ---------------------------------------------------------------------------------


@pytest.fixture
def schema_url() -> Iterator[str]:
    with scratch_schema() as url:
        yield url


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _plan_nodes(child)


def _assert_reads_calls_open(explained: Any, query: CallQuery) -> None:
    """An `EXPLAIN (FORMAT JSON)` answer reads `calls` through `calls_open` only, in its order."""
    nodes = list(_plan_nodes(explained[0]["Plan"]))
    reads = [n for n in nodes if n.get("Relation Name") == "calls"]
    assert [(n["Node Type"], n.get("Index Name")) for n in reads] == [("Index Scan", "calls_open")], (query, nodes)
    assert not any(n["Node Type"] in ("Seq Scan", "Sort", "Incremental Sort") for n in nodes), (query, nodes)


def _numbered(sql: str) -> str:
    """`sql` with psycopg's `%s` markers as Postgres's `$1`, `$2`, … (for `PREPARE`)."""
    numbers = itertools.count(1)
    return re.sub("%s", lambda _: f"${next(numbers)}", sql)


def _fill_postgres(base: str, schema: str, records: list[CallRecord], done: int) -> None:
    marks = ", ".join(["%s"] * len(CALL_COLUMNS.split(", ")))
    with psycopg.connect(base, autocommit=True) as conn, conn.cursor() as cur:
        insert = f'INSERT INTO "{schema}".calls ({CALL_COLUMNS}) VALUES ({marks})'
        cur.executemany(insert, [call_row(r) for r in records])
        cur.executemany(insert, [_done(n) for n in range(done)])
        conn.execute(f'ANALYZE "{schema}".calls')


@pytest.mark.postgres
async def test_every_postgres_listing_of_open_records_reads_calls_open_however_it_is_planned(
    schema_url: str,
) -> None:
    base = postgres_or_skip()
    schema = PostgresSettings.from_url(schema_url).schema
    journal = create_journal(schema_url)
    await journal.open()
    assert isinstance(journal, PostgresJournal)
    try:
        _fill_postgres(base, schema, _records(50), 5000)
        with psycopg.connect(base, autocommit=True) as conn:
            for n, query in enumerate(LISTINGS):
                sql, args = journal.listing(query)
                # The plan for these parameters (what a session plans first) …
                explained = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", args).fetchone()
                assert explained is not None
                _assert_reads_calls_open(explained[0], query)
                # … and the plan for any parameters (a prepared statement's, once reused).
                conn.execute("SET plan_cache_mode = force_generic_plan")
                conn.execute(f"PREPARE listing_{n} AS {_numbered(sql)}")
                literals = ", ".join(pgsql.Literal(a).as_string(conn) for a in args)
                explained = conn.execute(f"EXPLAIN (FORMAT JSON) EXECUTE listing_{n}({literals})").fetchone()
                assert explained is not None
                _assert_reads_calls_open(explained[0], query)
                conn.execute("RESET plan_cache_mode")
    finally:
        await journal.aclose()
    await _check_open_listings(schema_url, _records(50))


@pytest.mark.postgres
async def test_a_postgres_schema_of_migration_5_gains_calls_open_by_migration_6_and_keeps_its_records(
    schema_url: str,
) -> None:
    base = postgres_or_skip()
    settings = PostgresSettings.from_url(schema_url)
    s = f'"{settings.schema}"'
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {s}")
        conn.execute(
            f"CREATE TABLE {s}.schema_version (version integer PRIMARY KEY, description text NOT NULL, "
            "applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in MIGRATIONS[:5]:
            for statement in migration.statements:
                conn.execute(statement.format(s=s, channel=f"'{settings.channel}'"))
            conn.execute(
                f"INSERT INTO {s}.schema_version (version, description) VALUES (%s, %s)",
                (migration.version, migration.description),
            )
    records = _records(60)
    _fill_postgres(base, settings.schema, records, 300)
    for applied in ([6, 7], []):  # the migrations, then an open that finds nothing to do
        journal = create_journal(schema_url)
        await journal.open()
        try:
            assert isinstance(journal, PostgresJournal) and journal.migrations_applied == applied
        finally:
            await journal.aclose()
        await _check_open_listings(schema_url, records)
        with psycopg.connect(base, autocommit=True) as conn:
            rows = conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = %s", (settings.schema,))
            indexes = {name for (name,) in rows.fetchall()}
        assert "calls_open" in indexes and "calls_by_state" not in indexes
