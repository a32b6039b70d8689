"""The SQL journals' migrations to `reason` and `step_index`: a database written by the previous
release opens with this one, its RELEASED and IN_DOUBT rows given the reason `legacy_reason`
reads from their error text (SQL `LEGACY_REASON_SQL`, checked here against the Python function
on every known text), and its step entries indexed, first writer first, nothing dropped.

Each old database is built as that release built it: SQLite from its DDL (copied below), Postgres
by applying the migrations that had shipped. Real files and a real Postgres schema throughout.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import psycopg
import pytest

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallState, Fence, Journal, create_journal
from mcp_durable.journal.model import _LEGACY_RELEASED, legacy_reason
from mcp_durable.journal.postgres import PostgresJournal, PostgresSettings
from mcp_durable.journal.postgres.schema import MIGRATIONS
from mcp_durable.journal.record_json import step_index
from mcp_durable.journal.sqlite_schema import SCHEMA_VERSION, migrate
from tests.backends.pg_cluster import scratch_schema
from tests.conftest import postgres_or_skip

T0 = 1_700_000_000.0

#: The SQLite schema of the release before `reason` (schema 2), as its `sqlite.py` created it.
_SQLITE_SCHEMA_2 = """
CREATE TABLE meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE calls (
    principal TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL,
    run_id TEXT NOT NULL, attempts INTEGER NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    owner TEXT, lease_until REAL, completed_at REAL, expires_at REAL,
    result BLOB, error TEXT, arguments BLOB, task_id TEXT,
    PRIMARY KEY (principal, tool, key)
);
CREATE INDEX calls_by_created ON calls (created_at, principal, tool, key);
CREATE INDEX calls_by_expiry ON calls (expires_at) WHERE expires_at IS NOT NULL;
CREATE TABLE entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    process_id TEXT NOT NULL, entry_type TEXT NOT NULL, data BLOB NOT NULL, ts REAL NOT NULL
);
CREATE INDEX entries_by_process ON entries (process_id, seq);
CREATE INDEX calls_by_task ON calls (principal, task_id) WHERE task_id IS NOT NULL;
INSERT INTO meta VALUES ('schema_version', '2');
"""
#: Schema 1: the same without tasks.
_SQLITE_SCHEMA_1 = (
    _SQLITE_SCHEMA_2.replace(", task_id TEXT,", ",")
    .replace("CREATE INDEX calls_by_task ON calls (principal, task_id) WHERE task_id IS NOT NULL;", "")
    .replace("'schema_version', '2'", "'schema_version', '1'")
)


def _old_calls() -> list[tuple[str, str, str | None]]:
    """(key, state, error) of records as earlier releases wrote them: every error text
    `legacy_reason` knows, with and without a tail, near misses (one character short, another
    case), and texts it does not know."""
    rows: list[tuple[str, str, str | None]] = []
    released = [prefix for prefix, _ in _LEGACY_RELEASED]
    texts = [
        *released,
        *(f"{p}: and then some" for p in released),
        *(p[:-1] for p in released),
        *(p.upper() for p in released),
        None,
        "",
        "KeyError: 'x'",
        "interim_result",
    ]
    rows += [(f"released-{n}", "released", text) for n, text in enumerate(texts)]
    in_doubt = [
        None,
        "",
        "reconcile failed: the hook raised",
        "parked after 3 attempts",
        "reconcile faile",
        "parked afte",
        "the upstream died mid-call",
        "Parked after 3 attempts",
        "RECONCILE FAILED",
    ]
    rows += [(f"in-doubt-{n}", "in_doubt", text) for n, text in enumerate(in_doubt)]
    rows += [
        ("pending", "pending", None),
        ("completed", "completed", "cancelled by an operator"),
        ("failed", "failed", "parked after 1 attempt"),
    ]
    return rows


def _old_entries() -> list[tuple[str, str, bytes]]:
    """(process_id, entry_type, data) of entries as earlier releases wrote them, in seq order:
    steps (one index twice in one process), and entries that are not steps."""

    def entry(process: str, kind: str, data: Any) -> tuple[str, str, bytes]:
        return process, kind, orjson.dumps(data)

    return [
        entry("steps/run-pending", "step", {"index": 0, "name": "a", "result": 1}),
        entry("steps/run-pending", "step", {"index": 1, "name": "b", "result": 2}),
        entry("steps/run-pending", "step", {"index": 1, "name": "b", "result": 3}),  # a stale owner's
        entry("steps/run-pending", "step", {"index": "2", "name": "c"}),  # not an integer: no step
        entry("steps/run-pending", "checkpoint", {"index": 3}),  # not a step
        entry("steps/other", "step", {"index": 0, "name": "a", "result": 1}),
        entry("steps/other", "step", {"index": True, "name": "bool"}),
        entry("steps/other", "step", {"index": 4.0, "name": "float"}),
        entry("steps/other", "step", {"index": 1 << 63, "name": "past 64 bits"}),
        entry("steps/other", "step", {"index": -(1 << 63), "name": "the least"}),
        entry("steps/other", "step", {"name": "no index"}),
        entry("steps/other", "step", [1, 2]),
        entry("steps/other", "step", 7),
        entry("worker", "context_update", {"index": 0}),
    ]


def _expected_step_indexes() -> list[int | None]:
    """`step_index` of each of `_old_entries()` after the migration: `record_json.step_index`,
    and of two entries with one index in one process, the first."""
    seen: set[tuple[str, int]] = set()
    expected: list[int | None] = []
    for process, kind, data in _old_entries():
        index = step_index(kind, orjson.loads(data))
        if index is not None and (process, index) in seen:
            index = None
        if index is not None:
            seen.add((process, index))
        expected.append(index)
    return expected


def _expected_reasons() -> dict[str, str | None]:
    return {
        key: (None if (r := legacy_reason(CallState(state), error)) is None else r.value)
        for key, state, error in _old_calls()
    }


_FENCE = Fence("A", "run-pending", 1)


def _call_values(key: str, state: str, error: str | None) -> tuple[Any, ...]:
    owner = "A" if state == "pending" else None
    return ("local", "refund", key, "f" * 64, state, 2, f"run-{key}", 1, T0, T0, owner, T0 + 30, error)


_INSERT_CALL = (
    "INSERT INTO {calls} (principal, tool, key, fingerprint, state, version, run_id, attempts, "
    "created_at, updated_at, owner, lease_until, error) VALUES ({marks})"
)


async def _check_migrated(
    journal: Journal, reasons: dict[str, str | None], step_indexes: list[tuple[int, int | None]]
) -> None:
    """What every migrated journal shows: the stored reasons and step indexes (read raw, so
    the codec's reading of a missing reason does not hide a missing backfill), then the journal
    itself: records with their reasons, every entry kept, a stored step refused."""
    assert reasons == _expected_reasons()
    assert [index for _, index in step_indexes] == _expected_step_indexes()
    for key, state, error in _old_calls():
        record = await journal.get(CallIdentity("local", "refund", key))
        assert record is not None and record.reason == legacy_reason(CallState(state), error), key
    assert len(await journal.entries()) == len(_old_entries())
    pending = CallIdentity("local", "refund", "pending")
    assert await journal.append_step(pending, _FENCE, 1, {"name": "b"}, T0) is None  # stored: the first wins
    step = await journal.append_step(pending, _FENCE, 2, {"name": "c"}, T0)  # "2" was no step
    assert step is not None and step.seq > max(seq for seq, _ in step_indexes)


# -- SQLite -----------------------------------------------------------------------------------


def _sqlite_at(path: Path, schema: str) -> None:
    """A SQLite journal file as an earlier release left it: `schema`, then the old rows."""
    conn = sqlite3.connect(path)
    try:
        conn.executescript(schema)
        insert = _INSERT_CALL.format(calls="calls", marks=", ".join("?" * 13))
        conn.executemany(insert, [_call_values(*row) for row in _old_calls()])
        conn.executemany("INSERT INTO entries (process_id, entry_type, data, ts) VALUES (?, ?, ?, 1.0)", _old_entries())
        conn.commit()
    finally:
        conn.close()


def _sqlite_rows(path: Path) -> tuple[dict[str, str | None], list[tuple[int, int | None]], str]:
    conn = sqlite3.connect(path)
    try:
        reasons = dict(conn.execute("SELECT key, reason FROM calls").fetchall())
        steps = conn.execute("SELECT seq, step_index FROM entries ORDER BY seq").fetchall()
        (version,) = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        return reasons, steps, version
    finally:
        conn.close()


@pytest.mark.parametrize("schema", [_SQLITE_SCHEMA_1, _SQLITE_SCHEMA_2], ids=["schema-1", "schema-2"])
async def test_a_sqlite_journal_of_an_earlier_schema_gains_reasons_and_step_indexes(
    tmp_path: Path, schema: str
) -> None:
    path = tmp_path / "journal.db"
    _sqlite_at(path, schema)
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    try:
        reasons, steps, version = _sqlite_rows(path)
        assert version == str(SCHEMA_VERSION)
        await _check_migrated(journal, reasons, steps)
    finally:
        await journal.aclose()


async def test_reopening_a_migrated_sqlite_journal_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    _sqlite_at(path, _SQLITE_SCHEMA_2)
    for _ in range(2):
        journal = create_journal(f"sqlite:///{path}")
        await journal.open()
        await journal.aclose()
        reasons, steps, _ = _sqlite_rows(path)
        assert reasons == _expected_reasons()
        assert [index for _, index in steps] == _expected_step_indexes()


async def test_opening_a_current_sqlite_journal_runs_no_schema_statement_and_takes_no_write_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "journal.db"
    first = create_journal(f"sqlite:///{path}")
    await first.open()
    await first.aclose()
    conn = sqlite3.connect(path, isolation_level=None)
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        migrate(conn)
    finally:
        conn.close()
    assert statements and not any(s.lstrip().upper().startswith(("BEGIN", "CREATE", "INSERT")) for s in statements)


async def test_a_sqlite_journal_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    await journal.aclose()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(JournalError, match="newer"):
        await create_journal(f"sqlite:///{path}").open()
    with sqlite3.connect(path) as conn:  # … and left as it was
        assert conn.execute("SELECT value FROM meta").fetchone() == (str(SCHEMA_VERSION + 1),)


# -- Postgres ---------------------------------------------------------------------------------


@pytest.fixture
def schema_url() -> Iterator[str]:
    with scratch_schema() as url:
        yield url


def _postgres_at(url: str, base: str, version: int) -> None:
    """A Postgres journal schema as the release at migration `version` left it, then the old rows."""
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
        insert = _INSERT_CALL.format(calls=f"{s}.calls", marks=", ".join(["%s"] * 13))
        with conn.cursor() as cur:
            cur.executemany(insert, [_call_values(*row) for row in _old_calls()])
            for process, kind, data in _old_entries():
                cur.execute(
                    f"INSERT INTO {s}.entries (process_id, entry_type, data, ts) VALUES (%s, %s, %s::json, 1)",
                    (process, kind, data.decode()),
                )


def _postgres_rows(url: str, base: str) -> tuple[dict[str, str | None], list[tuple[int, int | None]]]:
    s = f'"{PostgresSettings.from_url(url).schema}"'
    with psycopg.connect(base) as conn:
        reasons: dict[str, str | None] = dict(conn.execute(f"SELECT key, reason FROM {s}.calls").fetchall())
        in_order = f"SELECT seq, step_index FROM {s}.entries ORDER BY seq"
        steps: list[tuple[int, int | None]] = conn.execute(in_order).fetchall()
    return reasons, steps


@pytest.mark.postgres
async def test_a_postgres_schema_of_the_previous_release_gains_reasons_and_step_indexes(schema_url: str) -> None:
    base = postgres_or_skip()
    previous = 3  # the last migration before `reason`
    _postgres_at(schema_url, base, previous)
    journal = create_journal(schema_url)
    await journal.open()
    try:
        assert isinstance(journal, PostgresJournal)
        assert journal.migrations_applied == [m.version for m in MIGRATIONS[previous:]]
        reasons, steps = _postgres_rows(schema_url, base)
        await _check_migrated(journal, reasons, steps)
    finally:
        await journal.aclose()


@pytest.mark.postgres
async def test_the_postgres_migration_wakes_no_waiter(schema_url: str) -> None:
    """The backfill changes no version, state or run_id: the NOTIFY trigger stays silent even for
    a record someone waits on (marked watched)."""
    base = postgres_or_skip()
    _postgres_at(schema_url, base, 3)
    settings = PostgresSettings.from_url(schema_url)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'UPDATE "{settings.schema}".calls SET watched = true')
        conn.execute(f'LISTEN "{settings.channel}"')
        journal = create_journal(schema_url)
        await journal.open()
        await journal.aclose()
        assert list(conn.notifies(timeout=0.5)) == []


def _calls_lock_waiters(base: str, schema: str) -> int:
    """Sessions waiting for a lock on `schema`'s `calls` (ungranted rows of `pg_locks`)."""
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
            "WHERE NOT l.granted AND c.relname = 'calls' AND c.relnamespace = %s::regnamespace",
            (f'"{schema}"',),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.postgres
async def test_a_postgres_migration_beside_a_writer_of_the_earlier_release_deadlocks_neither(
    schema_url: str,
) -> None:
    """A rolling upgrade: a replica of the earlier release (schema 4) is inside a transaction
    that has read `calls` (an ACCESS SHARE lock, as the first relation of its claim statement
    takes) when a replica of this release opens and migrates; the older one then writes
    `calls`. Taking its locks as its statements came, the migration held an index build's SHARE
    lock (which the write waits for) while waiting for ACCESS EXCLUSIVE (DROP INDEX, which
    waits for the reader): Postgres found the deadlock and aborted one side, here the newer
    replica's start (`deadlock detected`) or the older one's write. Both must go through."""
    base = postgres_or_skip()
    _postgres_at(schema_url, base, 4)
    schema = PostgresSettings.from_url(schema_url).schema
    s = f'"{schema}"'
    insert = _INSERT_CALL.format(calls=f"{s}.calls", marks=", ".join(["%s"] * 13))
    with psycopg.connect(base) as older:  # one transaction, as a statement of the older replica
        older.execute(f"SELECT count(*) FROM {s}.calls").fetchone()
        journal = create_journal(schema_url)
        opening = asyncio.create_task(journal.open())
        try:
            for _ in range(500):  # the newer replica's migration waits for the older one's lock
                waiting: int = await anyio.to_thread.run_sync(_calls_lock_waiters, base, schema)
                if opening.done() or waiting:
                    break
                await anyio.sleep(0.01)
            assert not opening.done(), "the migration did not wait for the open transaction on calls"
            await anyio.to_thread.run_sync(older.execute, insert, _call_values("written-meanwhile", "completed", None))
            older.commit()
            await opening
            assert isinstance(journal, PostgresJournal)
            assert journal.migrations_applied == [m.version for m in MIGRATIONS[4:]]
            record = await journal.get(CallIdentity("local", "refund", "written-meanwhile"))
            assert record is not None and record.state is CallState.COMPLETED
            assert (await journal.count_calls()).total == len(_old_calls()) + 1
        finally:
            if not opening.done():
                opening.cancel()
            await journal.aclose()


@pytest.mark.postgres
async def test_a_postgres_migration_is_not_cut_short_by_the_replicas_statement_timeout(schema_url: str) -> None:
    """A replica's `statement_timeout` guards its calls (15 s by default); a migration's index
    builds and counts over every record of a large journal take longer (minutes at 10^7), and
    a replica that starts while another migrates waits for it. With a timeout far below what
    the migration of 50,000 records takes, the journal still opens migrated."""
    base = postgres_or_skip()
    _postgres_at(schema_url, base, 4)
    s = f'"{PostgresSettings.from_url(schema_url).schema}"'
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {s}.calls (principal, tool, key, fingerprint, state, version, run_id, attempts, "
            "created_at, updated_at, result) SELECT 'local', 'bulk', 'k' || n, repeat('f', 64), 'completed', 2, "
            f"'run-' || n, 1, {T0} + n, {T0} + n, '\\x7b7d' FROM generate_series(1, 50000) AS n"
        )
    journal = create_journal(f"{schema_url}&statement_timeout=0.01")
    await journal.open()
    try:
        assert isinstance(journal, PostgresJournal)
        assert journal.migrations_applied == [m.version for m in MIGRATIONS[4:]]
    finally:
        await journal.aclose()
