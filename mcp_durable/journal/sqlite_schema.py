"""The SQLite journal's schema, and its migration from every earlier one (`migrate`, run by
every process that opens the database).

Schema versions, kept in `meta` (`schema_version`):
1. `calls` and `entries`;
2. `calls.task_id`, found by `(principal, task_id)` (MCP tasks);
3. `calls.reason` (`Reason`; rows written before have `legacy_reason(state, error)`, computed by
   SQL: `sql_rows.LEGACY_REASON_SQL`), and `entries.step_index`, the index of a durable step
   (`record_json.step_index`, NULL on other entries) under a unique index per process: a run's
   step log holds each index once, whichever process writes it;
4. kept counts, so summaries read no records: `call_counts` (records by principal, tool and
   state) and `tallies` (`entries`: process entries), kept by triggers in the transaction of
   every change, whichever process (and release) writes (the principals of a tool, for a call of
   every principal, are read from it too); the indexes `calls_by_principal_created` (a
   principal's oldest record and time ranges) and `entries_by_audit` (the operator audit
   entries of one call);
5. `calls_open`: the PENDING and IN_DOUBT records only (a partial index, `sql_rows.OPEN_CALLS`),
   in listing order per state, with `task_id` for the task watch's filter: the start-up sweep,
   the task watch, recovery and the in-doubt listings read it instead of walking every record;
6. counts written only where they cannot be read off an index: `call_counts` keeps the final
   records only, the open ones counted from `calls_open` when read (`OPEN_COUNTS`); and the
   process entries counted without a statement per appended row (`ENTRY_TALLY`): the
   `entries` tally holds the entries up to the seq in `entries_mark`, and a reader adds the
   (few) entries past it. Since `seq` is `AUTOINCREMENT`, an entry past the mark is an entry no
   tally holds yet, whoever inserted it (a release before this one too).

What a database lacks is told by its columns (each is added once, in the migration that adds
it) and its indexes (`CREATE INDEX IF NOT EXISTS`); the version recorded refuses a database of a
newer release.
"""

from __future__ import annotations

import contextlib
import sqlite3

import orjson

from ..errors import JournalError
from .base import AUDIT_PROCESS, STEP
from .record_json import step_index
from .sql_rows import LEGACY_REASON_SQL, OPEN_CALLS

SCHEMA_VERSION = 6
#: The tables as this release creates them; a database of an earlier schema keeps its tables
#: and gains the columns `migrate` adds.
_TABLES = (
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    """CREATE TABLE IF NOT EXISTS calls (
    principal TEXT NOT NULL, tool TEXT NOT NULL, key TEXT NOT NULL,
    fingerprint TEXT NOT NULL, state TEXT NOT NULL, version INTEGER NOT NULL,
    run_id TEXT NOT NULL, attempts INTEGER NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL,
    owner TEXT, lease_until REAL, completed_at REAL, expires_at REAL,
    result BLOB, error TEXT, arguments BLOB, task_id TEXT, reason TEXT,
    PRIMARY KEY (principal, tool, key)
)""",
    """CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    process_id TEXT NOT NULL, entry_type TEXT NOT NULL, data BLOB NOT NULL, ts REAL NOT NULL,
    step_index INTEGER
)""",
    """CREATE TABLE IF NOT EXISTS call_counts (
    principal TEXT NOT NULL, tool TEXT NOT NULL, state TEXT NOT NULL, n INTEGER NOT NULL,
    PRIMARY KEY (principal, tool, state)
) WITHOUT ROWID""",
    "CREATE TABLE IF NOT EXISTS tallies (name TEXT PRIMARY KEY, n INTEGER NOT NULL)",
)
#: The counts (schema 4) as the triggers keep them, and `stats` and `count_calls` read them: a
#: group's row stays at 0 when its last record goes (readers skip it). Since schema 6 only the
#: final records (COMPLETED, FAILED, RELEASED, CANCELLED) are kept; the open ones, which a claim
#: makes and a completion ends, are counted when read from `calls_open` (`OPEN_COUNTS`), which
#: holds only them: a claim writes no count, a completion one (as Postgres since migration 7).
_COUNTED = """INSERT INTO call_counts VALUES (NEW.principal, NEW.tool, NEW.state, 1)
    ON CONFLICT (principal, tool, state) DO UPDATE SET n = n + 1"""
_UNCOUNTED = (
    "UPDATE call_counts SET n = n - 1 WHERE principal = OLD.principal AND tool = OLD.tool AND state = OLD.state"
)
_FINAL_NEW, _FINAL_OLD = (f"NOT {row}.{OPEN_CALLS}" for row in ("NEW", "OLD"))
_MOVED = "OLD.state IS NOT NEW.state"
#: The seq up to which the `entries` tally holds the process entries (schema 6, `ENTRY_TALLY`).
_MARK = "(SELECT n FROM tallies WHERE name = 'entries_mark')"
_TRIGGERS = (
    f"CREATE TRIGGER IF NOT EXISTS calls_counted_insert AFTER INSERT ON calls WHEN {_FINAL_NEW} BEGIN {_COUNTED}; END",
    "CREATE TRIGGER IF NOT EXISTS calls_uncounted_update AFTER UPDATE OF state ON calls "
    f"WHEN {_MOVED} AND {_FINAL_OLD} BEGIN {_UNCOUNTED}; END",
    "CREATE TRIGGER IF NOT EXISTS calls_counted_update AFTER UPDATE OF state ON calls "
    f"WHEN {_MOVED} AND {_FINAL_NEW} BEGIN {_COUNTED}; END",
    f"CREATE TRIGGER IF NOT EXISTS calls_counted_delete AFTER DELETE ON calls WHEN {_FINAL_OLD} "
    f"BEGIN {_UNCOUNTED}; END",
    # Schema 6: an entry leaves the tally only if the tally holds it (it is at or below the mark).
    "CREATE TRIGGER IF NOT EXISTS entries_counted_delete AFTER DELETE ON entries "
    f"WHEN OLD.seq <= {_MARK} "
    "BEGIN UPDATE tallies SET n = n - 1 WHERE name = 'entries'; END",
)
#: The triggers of schemas 4 and 5 that schema 6 replaces: the calls' counted every record,
#: open ones included; the entries' counted every appended entry (one more statement, and one
#: more page written, per row: the lone append's share of issue 34's bookkeeping).
_DROPPED_TRIGGERS = (
    "calls_counted_insert",
    "calls_counted_update",
    "calls_counted_delete",
    "entries_counted_insert",
    "entries_counted_delete",
)

#: The number of process entries (schema 6), as `stats` reads it: the tally, and the entries
#: past its mark. An index range of the entries' rowid, at most about `ENTRY_FOLD` long while
#: this release writes.
ENTRY_TALLY = (
    f"SELECT (SELECT n FROM tallies WHERE name = 'entries') + (SELECT count(*) FROM entries WHERE seq > {_MARK})"
)
#: An append whose seq is a multiple of this folds the entries past the mark into the tally
#: (`fold_entries`). A seq that no append returns (an insert that found its step stored, an
#: entry another release wrote) only delays the fold to the next multiple.
ENTRY_FOLD = 256
_FOLD = (
    f"UPDATE tallies SET n = n + (SELECT count(*) FROM entries WHERE seq > {_MARK} AND seq <= ?) "
    "WHERE name = 'entries'",
    "UPDATE tallies SET n = ? WHERE name = 'entries_mark' AND n < ?",
)


def fold_entries(conn: sqlite3.Connection, seq: int) -> None:
    """Add the entries past the tally's mark, up to `seq`, to the tally, and move the mark to
    `seq`: two statements in the appending write transaction, which holds the database's write
    lock, so no entry is counted twice or missed whichever process folds."""
    conn.execute(_FOLD[0], (seq,))
    conn.execute(_FOLD[1], (seq, seq))


#: An audit entry's call, as `entries_by_audit` indexes it and `audit_entries` asks for it (the
#: same expressions, or SQLite would not use the index). `data` is stored as a BLOB of JSON text.
AUDIT_CALL = ", ".join(f"json_extract(CAST(data AS TEXT), '$.{name}')" for name in ("principal", "tool", "key"))
#: The partial index of open records (schema 5): what a listing of PENDING or IN_DOUBT records
#: reads (`SQLiteJournal.listing`).
OPEN_INDEX = "calls_open"
#: The open records by principal, tool and state, counted from `calls_open` (schema 6), in the
#: groups' shape of `sql_rows.counts_of`; `{mine}` is empty or `AND principal = ?`. The index is
#: named: for a principal's, SQLite would rather walk all of the principal's records by the
#: primary key.
OPEN_COUNTS = (
    f"SELECT principal, tool, state, NULL, count(*), NULL FROM calls INDEXED BY {OPEN_INDEX} WHERE {OPEN_CALLS} "
    "{mine} GROUP BY principal, tool, state"
)
#: Every group's count, as `stats` and `count_calls` read them: the kept ones (final records) and
#: the open ones (`OPEN_COUNTS`). `{mine}` as there; its parameter, if any, is given twice.
COUNTED_GROUPS = (
    "SELECT principal, tool, state, NULL, n, NULL FROM call_counts WHERE n > 0 {mine} UNION ALL " + OPEN_COUNTS
)
#: The indexes, created once their columns exist. `entries_by_step` holds the durable steps
#: (`step_index` is NULL on every other entry): first writer wins, across processes.
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS calls_by_created ON calls (created_at, principal, tool, key)",
    "CREATE INDEX IF NOT EXISTS calls_by_expiry ON calls (expires_at) WHERE expires_at IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS calls_by_task ON calls (principal, task_id) WHERE task_id IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS entries_by_process ON entries (process_id, seq)",
    "CREATE UNIQUE INDEX IF NOT EXISTS entries_by_step ON entries (process_id, step_index) "
    "WHERE step_index IS NOT NULL",
    "CREATE INDEX IF NOT EXISTS calls_by_principal_created ON calls (principal, created_at)",
    f"CREATE INDEX IF NOT EXISTS entries_by_audit ON entries ({AUDIT_CALL}, seq) WHERE process_id = '{AUDIT_PROCESS}'",
    # `task_id` last: the task watch's `task_id IS NOT NULL` is decided on the index entry, so a
    # PENDING call that is not a task costs no read of its row.
    f"CREATE INDEX IF NOT EXISTS {OPEN_INDEX} ON calls (state, created_at, principal, tool, key, task_id) "
    f"WHERE {OPEN_CALLS}",
)


def migrate(conn: sqlite3.Connection) -> None:
    """Create the schema, or bring a database of an earlier schema up to `SCHEMA_VERSION`.

    One `BEGIN IMMEDIATE` transaction: processes opening at once migrate one after the other
    (the later ones find nothing to do), and a crash leaves the whole migration or none of it
    (statement by statement, it could leave `calls` without `entries`, which `journal verify`
    rejects). A database of a newer schema is refused, not written with an older idea of it.
    A database at `SCHEMA_VERSION` is left as it is, without the write lock or a statement of
    the schema's (`_current`).
    """
    if _current(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        counted = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'call_counts'").fetchone()
        for statement in _TABLES:
            conn.execute(statement)
        stored = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        version = int(stored[0]) if stored is not None and str(stored[0]).isdigit() else None
        if version is not None and version > SCHEMA_VERSION:
            raise JournalError(
                f"sqlite journal schema is at version {version}, newer than this mcp-durable "
                f"understands ({SCHEMA_VERSION}): upgrade mcp-durable"
            )
        _add_columns(conn)
        _count(conn, counted is not None, version)
        for statement in (*_TRIGGERS, *_INDEXES):
            conn.execute(statement)
        if version != SCHEMA_VERSION:
            conn.execute("INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):  # closing the connection rolls it back too
                conn.execute("ROLLBACK")
        raise


def _add_columns(conn: sqlite3.Connection) -> None:
    """The columns of schemas 2 and 3, added to a database that lacks them (and filled)."""
    calls = {row[1] for row in conn.execute("PRAGMA table_info(calls)")}
    if "task_id" not in calls:  # schema 1
        conn.execute("ALTER TABLE calls ADD COLUMN task_id TEXT")
    if "reason" not in calls:  # schema 1 or 2
        conn.execute("ALTER TABLE calls ADD COLUMN reason TEXT")
        conn.execute(f"UPDATE calls SET reason = {LEGACY_REASON_SQL} WHERE state IN ('released', 'in_doubt')")
    if "step_index" not in {row[1] for row in conn.execute("PRAGMA table_info(entries)")}:
        conn.execute("ALTER TABLE entries ADD COLUMN step_index INTEGER")
        _index_steps(conn)


#: The counts a migration to schema 4 or later makes of what a database holds, read from the
#: table in its own order (`NOT INDEXED`): left to itself, the planner walked the primary key's
#: index for its (principal, tool) order and looked each row up in the table for its state, one
#: random read a record, several times as long as the scan (docs/benchmarks.md, "Upgrading a
#: journal of the release before"), the whole of it inside the write lock that processes of the
#: earlier release wait on.
COUNT_CALLS_SQL = (
    "INSERT INTO call_counts SELECT principal, tool, state, count(*) FROM calls NOT INDEXED "
    "GROUP BY principal, tool, state"
)


def _count(conn: sqlite3.Connection, counted: bool, version: int | None) -> None:
    """The kept counts of schemas 4 and 6, made from what the database holds (inside the
    migration's lock, so no writer changes it meanwhile)."""
    if not counted:  # schema 3 or earlier, or new: count what is there
        conn.execute(COUNT_CALLS_SQL)
        conn.execute("INSERT INTO tallies VALUES ('entries', (SELECT count(*) FROM entries))")
    if version is None or version < 6:  # the entries' tally was exact to here: it holds them all
        for name in _DROPPED_TRIGGERS:
            conn.execute(f"DROP TRIGGER IF EXISTS {name}")
        conn.execute(f"DELETE FROM call_counts WHERE {OPEN_CALLS}")  # counted from `calls_open` now
        conn.execute(
            "INSERT OR IGNORE INTO tallies VALUES ('entries_mark', (SELECT coalesce(max(seq), 0) FROM entries))"
        )


def _current(conn: sqlite3.Connection) -> bool:
    """Whether the database is at `SCHEMA_VERSION`: the version is written in the transaction
    that made the schema so, so every table, trigger and index of it is there. (Checked
    without a lock: a database is never migrated down.) Running the schema's `CREATE … IF NOT
    EXISTS` statements and taking the write lock at every open roughly doubled the migration
    step of an open (docs/benchmarks.md, 2026-12-05)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    except sqlite3.OperationalError:  # no `meta` table: a new database
        return False
    return row is not None and row[0] == str(SCHEMA_VERSION)


def _index_steps(conn: sqlite3.Connection) -> None:
    """Fill `step_index` of the step entries a database of schema 2 or earlier holds, with the
    rule `append` applies (`record_json.step_index`). If one process holds a step index twice
    (no release refused that), the first entry is the step; the later ones are kept, not as it."""
    seen: set[tuple[str, int]] = set()
    found: list[tuple[int, int]] = []
    for seq, process_id, data in conn.execute(
        "SELECT seq, process_id, data FROM entries WHERE entry_type = ? ORDER BY seq", (STEP,)
    ):
        try:
            index = step_index(STEP, orjson.loads(data))
        except orjson.JSONDecodeError:
            index = None  # `journal verify` reports it; the migration leaves it as it is
        if index is not None and (process_id, index) not in seen:
            seen.add((process_id, index))
            found.append((index, seq))
    conn.executemany("UPDATE entries SET step_index = ? WHERE seq = ?", found)
