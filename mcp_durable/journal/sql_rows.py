"""The SQL backends' shared row codec: a call record as a row of `calls` and back, a row of
`entries` as a process entry, and a `CallQuery` as SQL.

SQLite and Postgres store the same columns in the same order (only the types' names differ:
`BLOB`/`bytea`, `REAL`/`float8`), so one codec serves both; what differs per dialect is the
parameter marker, passed in. Also shared: `LEGACY_REASON_SQL`, the migrations' backfill of
`reason` from `error`, valid in both dialects.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import orjson

from .base import OPEN_STATES, CallCounts, CallQuery, CountQuery, CountTally, stored_decoder
from .model import CallIdentity, CallRecord, CallState, JournalEntry, Reason, legacy_reason

#: The columns of `calls`, in the order `call_row` gives and `call_record` reads them; the first
#: three are the identity (the primary key), the rest change with the record.
CALL_COLUMNS = (
    "principal, tool, key, fingerprint, state, version, run_id, attempts, created_at, updated_at, "
    "owner, lease_until, completed_at, expires_at, result, error, arguments, task_id, reason"
)
#: `legacy_reason(state, error)` as SQL, for the migrations that add `reason` to rows written
#: before it (SQLite schema 3, Postgres migration 4): the same prefixes in the same order, each
#: compared with `substr` (not LIKE: SQLite's is case-insensitive, and `_` would be a wildcard).
#: Shipped in those migrations: never change it (a test checks it against `legacy_reason`).
LEGACY_REASON_SQL = """CASE
    WHEN state = 'released' THEN CASE
        WHEN substr(error, 1, 33) = 'cancelled by the task''s requestor' THEN 'requestor_cancelled'
        WHEN substr(error, 1, 24) = 'cancelled by an operator' THEN 'operator_cancelled'
        WHEN substr(error, 1, 24) = 'forgotten by an operator' THEN 'forgotten'
        WHEN substr(error, 1, 31) = 're-run requested by an operator' THEN 'rerun'
        WHEN substr(error, 1, 35) = 'resolved not applied by an operator' THEN 'not_applied'
        WHEN substr(error, 1, 41) = 'reconciled in the background: not applied' THEN 'not_applied'
        WHEN substr(error, 1, 14) = 'interim result' THEN 'interim'
        WHEN substr(error, 1, 31) = 'tool error (released by policy)' THEN 'tool_error'
        ELSE 'exception' END
    WHEN state = 'in_doubt' THEN CASE
        WHEN substr(error, 1, 16) = 'reconcile failed' THEN 'hook_failed'
        WHEN substr(error, 1, 12) = 'parked after' THEN 'parked'
        WHEN coalesce(error, '') = '' THEN 'lost_owner'
        ELSE 'outcome_unknown' END
    END"""
#: The ORDER BY of a newest-first listing (matches `base.sort_key`, reversed).
LISTING_ORDER = "ORDER BY created_at DESC, principal DESC, tool DESC, key DESC"
#: The condition of the SQL backends' partial index of open records (`base.OPEN_STATES`:
#: `calls_open`, SQLite schema 5, Postgres migration 6). A listing of one of those states
#: repeats it word for word: SQLite uses a partial index only for a query whose WHERE holds the
#: index's own condition (`state = ?` alone proves nothing to it), and Postgres, for a plan made
#: for any parameter value (a prepared statement's generic plan), likewise. Shipped in those
#: indexes: never change it (a query naming another text would no longer find them).
OPEN_CALLS = "state IN ('pending', 'in_doubt')"


def call_row(record: CallRecord) -> tuple[Any, ...]:
    """The values of `record` in `CALL_COLUMNS` order (the state as its text, bytes as bytes)."""
    i = record.identity
    return (
        i.principal,
        i.tool,
        i.key,
        record.fingerprint,
        record.state.value,
        record.version,
        record.run_id,
        record.attempts,
        record.created_at,
        record.updated_at,
        record.owner,
        record.lease_until,
        record.completed_at,
        record.expires_at,
        record.result,
        record.error,
        record.arguments,
        record.task_id,
        None if record.reason is None else record.reason.value,
    )


@stored_decoder("call record")
def call_record(row: tuple[Any, ...]) -> CallRecord:
    """The record a row in `CALL_COLUMNS` order holds (further values after them are ignored);
    `JournalError` when it does not decode. A row without a `reason` (written by a release
    before it, e.g. a replica not yet upgraded) has `legacy_reason(state, error)`, as the file
    journal's frames of those releases do."""
    state = CallState(row[4])
    return CallRecord(
        identity=CallIdentity(row[0], row[1], row[2]),
        fingerprint=row[3],
        state=state,
        version=row[5],
        run_id=row[6],
        attempts=row[7],
        created_at=row[8],
        updated_at=row[9],
        owner=row[10],
        lease_until=row[11],
        completed_at=row[12],
        expires_at=row[13],
        # Drivers return a buffer type (memoryview, sqlite3's bytes-like): records hold bytes.
        result=None if row[14] is None else bytes(row[14]),
        error=row[15],
        arguments=None if row[16] is None else bytes(row[16]),
        task_id=row[17],
        reason=legacy_reason(state, row[15]) if row[18] is None else Reason(row[18]),
    )


@stored_decoder("process entry")
def process_entry(row: tuple[Any, ...]) -> JournalEntry:
    """The entry a row `(process_id, entry_type, data, ts, seq)` holds (`data` as JSON text or bytes)."""
    return JournalEntry(row[0], row[1], orjson.loads(row[2]), row[3], row[4])


def listing_clause(query: CallQuery, placeholder: str) -> tuple[str, list[Any]]:
    """The `WHERE … ORDER BY … LIMIT` tail of a `SELECT … FROM calls` that lists `query`, and
    its arguments. `placeholder` is the driver's parameter marker (`?` for sqlite3, `%s` for
    psycopg). A query of an open state (`OPEN_STATES`) names `OPEN_CALLS`, the condition of the
    index that answers it."""
    clauses: list[str] = [OPEN_CALLS] if query.state in OPEN_STATES else []
    args: list[Any] = []
    state = query.state.value if query.state is not None else None
    for column, value in (("principal", query.principal), ("tool", query.tool), ("state", state)):
        if value is not None:
            clauses.append(f"{column} = {placeholder}")
            args.append(value)
    if query.tasks_only:
        clauses.append("task_id IS NOT NULL")
    if query.cursor is not None:
        c = query.cursor.identity
        marks = ", ".join([placeholder] * 4)
        clauses.append(f"(created_at, principal, tool, key) < ({marks})")
        args.extend((query.cursor.created_at, c.principal, c.tool, c.key))
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    args.append(max(0, query.limit))
    return f"{where}{LISTING_ORDER} LIMIT {placeholder}", args


def ranged_count_sql(
    query: CountQuery, placeholder: str, calls: str, whole: Callable[[str], str], principal: str = "principal"
) -> tuple[str, list[Any]]:
    """A `SELECT` of the groups `(principal, tool, state, bucket, n, oldest)` of the records a
    ranged `query` counts (read through the indexes on `created_at`), and its arguments.
    `whole(x)` is the dialect's `floor(x)` as an integer, for `x >= 0` (the range starts at
    `since`); `principal` the expression a principal's records are indexed by (with their time)."""
    p = placeholder
    args: list[Any] = []
    bucket = "NULL"
    if query.bucket_s is not None:
        bucket = whole(f"(created_at - {p}) / {p}")
        args += [query.since, query.bucket_s]
    clauses: list[str] = []
    for clause, value in (
        (f"{principal} = {p}", query.principal),
        (f"created_at >= {p}", query.since),
        (f"created_at < {p}", query.until),
    ):
        if value is not None:
            clauses.append(clause)
            args.append(value)
    where = f"WHERE {' AND '.join(clauses)} " if clauses else ""
    sql = (
        f"SELECT principal, tool, state, {bucket}, count(*), min(created_at) FROM {calls} {where}"
        "GROUP BY principal, tool, state, 4"
    )
    return sql, args


def counts_of(groups: Iterable[tuple[Any, ...]], oldest: float | None = None) -> CallCounts:
    """The `CallCounts` of groups `(principal, tool, state, bucket, n, oldest)` (bucket and
    oldest may be None), with `oldest` the oldest record's time when the groups do not give it."""
    tally = CountTally()
    for principal, tool, state, bucket, n, first in groups:
        tally.add(principal, tool, state, int(n), first, None if bucket is None else int(bucket))
    tally.oldest(oldest)
    return tally.counts()
