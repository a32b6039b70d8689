"""`postgresql://…`: one journal shared by several server replicas on several hosts.

- **Claims, swaps, reads and process-entry appends are batched** (`batch.py`): those that
  arrive together go to the database as one multi-row statement (one round trip, one commit,
  the same statement text whatever the batch size, so the server plans it once per connection).
  The rows of a claim or swap batch travel as one JSON array (`json_to_recordset`, bytes in
  base64) rather than one array parameter per column (`unnest`): psycopg dumps array elements
  one by one in Python, so the array form cost the client about three times the CPU per row
  (docs/dev/performance-notebook.md).
- **Claim**: `INSERT … SELECT … FROM json_to_recordset(…) ON CONFLICT (principal, tool, key) DO NOTHING
  RETURNING …`, in a CTE that also returns the rows that stood, so a claim or a repeat is one
  round trip — the claim is also the read (`claim_reads = True`: the engine sends no read
  before it). A repeat writes nothing (DO NOTHING takes no row lock), so it costs no commit
  fsync. Postgres's unique index makes it atomic across replicas. The rare rest — a record
  that stood but has expired, a claim committed by another replica after the statement's
  snapshot, two claims of one identity in one batch — is decided one by one with the
  single-row claim (`INSERT … ON CONFLICT DO UPDATE … WHERE calls.expires_at <= now`).
- **swap / renew** are `UPDATE … WHERE version = expected` (resp. PENDING under the owner's
  fence: `state = 'pending' AND owner = … AND run_id = … AND attempts = …`): compare-and-set
  in the database, swaps per row also in a batch (`UPDATE … FROM json_to_recordset(…) …
  RETURNING` the rows that matched).
- **Durable steps** (`append_step`): one `INSERT … SELECT` that locks the record's row
  (`FOR SHARE`) only if it is PENDING under the fence, and inserts nothing on the unique
  `(process_id, step_index)` of a stored step (`ON CONFLICT DO NOTHING`).
- **Process entries** (`append`): a batch is one `INSERT … SELECT … FROM json_to_recordset(…)`
  under the entries' advisory lock, held to commit, so `seq` order is commit order; the rows go
  in batch order, so their seqs increase along the batch. A step entry is stored as its step
  (`step_index`) unless one is stored or came earlier in the batch: the outcome of appending the
  batch's entries one after the other. Every caller returns after the one commit. Every batch
  goes through one connection in libpq's pipeline mode (`pipeline.py`), in the order the
  batches opened: the server runs them in that order, so seqs follow the order the appends were
  made across batches too, and the next batch is sent while the one before it commits.
- **Wake-ups**: a trigger sends `pg_notify` in the transaction that changes a *watched* record;
  one LISTEN connection per journal (`Listener`) turns those into in-process `ChangeSignals`.
  A waiter marks the record watched first (`UPDATE … SET watched WHERE version = <read>`), so
  the common path (nobody waiting) sends no NOTIFY, which would serialise commits. Waiters
  also re-read every `poll` seconds (every 0.2 s while the LISTEN connection is down), so a
  lost notification costs latency, never correctness.
- **Pool**: `psycopg_pool.AsyncConnectionPool` (`pool_min`/`pool_max`), autocommit (each
  statement is its own transaction, committed durably before it returns), `connect_timeout`,
  `pool_timeout` and `statement_timeout` of a few seconds: a database that is down or
  unreachable gives `JournalError` (`journal_unavailable`) in seconds, and the pool
  reconnects by itself when it is back. The sessions join only through keys (no hash or
  merge joins, `_PLANNER`), so a batch never scans the table, however its plan was cached,
  and compile no statement (JIT off, `_PLANNER`).
- `single_writer = False`: a PENDING record of another replica is in doubt only once its
  lease has expired.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from typing import Any, NamedTuple, TypedDict, TypeVar

import anyio
import orjson
import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict

from ...errors import JournalError
from .. import callers
from ..base import (
    ALL_CALLS,
    AUDIT_ENTRY,
    AUDIT_PROCESS,
    CHECKPOINT,
    OPEN_STATES,
    RECENT_CALLS,
    STEP,
    CallCounts,
    CallQuery,
    ChangeSignals,
    CountQuery,
    PurgedCalls,
    RecoveryReport,
    step_process_id,
)
from ..masked_urls import display_url
from ..model import CallIdentity, CallRecord, CallState, Fence, JournalEntry, JournalStats
from ..record_json import step_data, step_index
from ..sql_rows import CALL_COLUMNS as _COLUMNS
from ..sql_rows import LISTING_ORDER, OPEN_CALLS, listing_clause
from ..sql_rows import call_record as _record
from ..sql_rows import call_row as _params
from ..sql_rows import process_entry as _entry
from .batch import Batcher
from .counts import KeptCounts
from .lane import Lane, Lanes
from .listener import Listener
from .pipeline import Pipeline
from .schema import COUNTED_BY_STATEMENT, COUNTED_SETTING, migrate, quote_ident
from .settings import PostgresSettings

Row = tuple[Any, ...]

_MUTABLE = [c.strip() for c in _COLUMNS.split(",")][3:]
_IDENTITY = "principal = %s AND tool = %s AND key = %s"
#: The record of an identity is PENDING under a fence (parameters: `_held`).
_HELD = f"{_IDENTITY} AND state = %s AND owner = %s AND run_id = %s AND attempts = %s"
#: An entry insert's tail: nothing inserted when the step it is stands already.
_STEP_CONFLICT = " ON CONFLICT (process_id, step_index) WHERE step_index IS NOT NULL DO NOTHING RETURNING seq"
#: The Postgres type of each column (in `_COLUMNS` order), for the JSON rows of a batch.
_TYPES = (
    "text",
    "text",
    "text",
    "text",
    "text",
    "bigint",
    "text",
    "integer",
    "float8",
    "float8",
    "text",
    "float8",
    "float8",
    "float8",
    "bytea",
    "text",
    "bytea",
    "text",
    "text",
)
_NAMES = tuple(c.strip() for c in _COLUMNS.split(","))
_BYTES = tuple(i for i, t in enumerate(_TYPES) if t == "bytea")
#: The columns of a batch's rows read from the JSON parameter (bytes arrive as base64 text).
_RECORDSET = ", ".join(f"{n} {'text' if t == 'bytea' else t}" for n, t in zip(_NAMES, _TYPES, strict=True))
_DECODED = ", ".join(
    f"decode(r.{n}, 'base64') AS {n}" if t == "bytea" else f"r.{n}" for n, t in zip(_NAMES, _TYPES, strict=True)
)
#: Batches of one kind (claims, swaps, reads) in flight at once, per journal. One: the calls
#: that arrive while a batch commits gather into the next, so statements and commits per call
#: fall where requests arrive spread out (over HTTP, 16 clients: 2.9 calls per statement against
#: 1.8 with two in flight, a third less Postgres CPU per call); where callers move in step (the
#: in-memory client) batches fill up, and full ones may go out side by side (below). Measured in
#: docs/dev/performance-notebook.md. The rest of the pool serves renewals, listings and entries.
BATCH_SLOTS = 1
#: At most this many items share a statement, and a full batch may run beside the one in flight
#: (`FULL_BATCH_SLOTS` more slots, for full batches only: batch.py). A wave of callers moving in
#: step (64 in process) then goes out as two statements side by side instead of one during which
#: the whole process waits (docs/dev/performance-notebook.md, "Waves of callers and full
#: batches"). Requests spread out (HTTP, 16 clients: ~3 calls per statement) never fill
#: a batch, so there one stays in flight as before.
BATCH_MAX_ITEMS = 32
FULL_BATCH_SLOTS = 1


class _Batching(TypedDict):
    slots: int
    max_items: int
    full_slots: int


#: How each batcher of the journal batches (above).
_BATCHING: _Batching = {"slots": BATCH_SLOTS, "max_items": BATCH_MAX_ITEMS, "full_slots": FULL_BATCH_SLOTS}
#: The columns of an append batch's rows (`_append_batch`): its place in the batch, the entry,
#: and the step index it may be stored as.
_APPEND_RECORDSET = "n integer, p text, t text, d json, ts float8, s bigint"
#: The connections kept between statements (`lane.py`): one per kind of batch (claims, swaps,
#: reads), shared by all. And the smallest pool that has them: three kept, at least two left for
#: renewals, listings and entries.
LANES = 3
LANES_MIN_POOL = 5
#: The journal's sessions join a batch to `calls` row by row through the primary key, never by
#: hashing or sorting the whole table. The planner estimates a batch at 100 rows (json_to_recordset's
#: default) and, while the table is small, prefers a hash join over a sequential scan; psycopg
#: prepares a statement after a few runs, and that generic plan then stays for the session (nothing
#: re-plans it until an ANALYZE), so a journal that started empty kept scanning the whole table for
#: every batch as it grew: Postgres CPU per call grew with the table (docs/dev/performance-notebook.md).
#: No statement of the journal needs either join method: its joins
#: are all batch-to-key lookups, and its other statements do not join.
#: Nor JIT compilation, which the server applies to a statement whose estimated cost passes
#: `jit_above_cost`: the journal's statements read a few rows through an index, and on a large
#: table the planner's guess of such a read (the console's count of the last hour) passed that
#: cost, so compiling took many times what running did (docs/benchmarks.md, "JIT off").
_PLANNER = "-c enable_hashjoin=off -c enable_mergejoin=off -c jit=off"
#: The journal's sessions count their own changes of `calls` (`count_moved`; migration 7).
_COUNTED = f"-c {COUNTED_SETTING}={COUNTED_BY_STATEMENT}"


#: A final state in SQL (the records the kept counts hold since migration 7; `base.OPEN_STATES`
#: are counted when read, from `calls_open`).
_OPEN_LITERALS = ", ".join(sorted(f"'{state.value}'" for state in OPEN_STATES))
_OPEN = f"IN ({_OPEN_LITERALS})"
_FINAL = f"NOT {_OPEN}"
_OPEN_ARRAY = f"[{_OPEN_LITERALS}]"


def count_moved(counts: str) -> str:
    """The statement, for a `WITH` of its own, that moves the kept counts (`counts`, the schema's
    `call_counts`) along the rows of a CTE `moved(principal, tool, state, was)`: each row's new
    state counted once more where it is final, the state it left (`was`) once less where that
    was final; one upsert per group into this session's row (`postgres/counts.py`). The
    journal's connections say they count so (`COUNTED_SETTING`): the update trigger of
    migration 7 leaves their changes to this."""
    return (
        f"INSERT INTO {counts} AS k (principal, tool, state, shard, n) "
        "SELECT principal, tool, state, pg_backend_pid(), sum(d) FROM ("
        f"SELECT principal, tool, state, 1 AS d FROM moved WHERE state {_FINAL} "
        f"UNION ALL SELECT principal, tool, was, -1 FROM moved WHERE was {_FINAL}) AS m "
        "GROUP BY principal, tool, state HAVING sum(d) <> 0 "
        "ON CONFLICT (principal, tool, state, shard) DO UPDATE SET n = k.n + excluded.n"
    )


class _Append(NamedTuple):
    """An `append` waiting for its batch: the entry, its data as JSON text, its step index (or None)."""

    process_id: str
    entry_type: str
    payload: str
    ts: float
    step: int | None


class _Swap(NamedTuple):
    """A `swap` waiting for its batch: the version and run id it expects (None: any run), and
    the record to store."""

    version: int
    run_id: str | None
    record: CallRecord


class _Alone:
    """A batch's answer for an item it could not decide: the item is decided alone, one row."""


ALONE = _Alone()


def _broken_by_an_item(exc: JournalError) -> bool:
    """Whether a batch statement failed because of what one item holds (e.g. a NUL in a text),
    not because the database is away: then each item is retried alone, so only that one fails."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeEncodeError):
        return True
    # Not a statement the server cannot parse or plan (SQLSTATE class 42: a syntax error, an
    # unknown column, a missing privilege): no item causes that, and deciding every item alone
    # would hide a broken batch statement behind single-row ones.
    return isinstance(cause, psycopg.Error) and not isinstance(
        cause, (psycopg.OperationalError, psycopg.InterfaceError, psycopg.ProgrammingError)
    )


#: The rows a batch statement returns (`_batch_rows`): psycopg's rows, or the pipeline's text rows.
_R = TypeVar("_R")
#: A statement the database rolled back whole to break a deadlock or a serialisation conflict.
_ROLLED_BACK = (
    psycopg.errors.DeadlockDetected,
    psycopg.errors.SerializationFailure,
    psycopg.errors.TransactionRollback,
)


def _lock_order(record: CallRecord) -> tuple[str, str, str]:
    """The order a batch statement takes its rows' locks in: the same in every batch of every
    process, so two batches that share identities wait for each other one way round and never
    deadlock (one inserting k1 then k2 while another inserts k2 then k1 would). The statements
    read their rows in array order (`json_to_recordset`, joined by key only: `_PLANNER`)."""
    i = record.identity
    return (i.principal, i.tool, i.key)


def _rows_json(
    records: list[CallRecord], expected: list[int] | None = None, expected_runs: list[str | None] | None = None
) -> str:
    """The records as the JSON array a batch statement reads with `json_to_recordset` (bytes as
    base64; with `expected`, each row also carries the version its swap expects, and with
    `expected_runs` the run id, null for any)."""
    rows = []
    for index, record in enumerate(records):
        values = list(_params(record))
        for column in _BYTES:
            value = values[column]
            if value is not None:
                values[column] = binascii.b2a_base64(value, newline=False).decode()
        row = dict(zip(_NAMES, values, strict=True))
        if expected is not None:
            row["expected"] = expected[index]
        if expected_runs is not None:
            row["expected_run"] = expected_runs[index]
        rows.append(row)
    return orjson.dumps(rows).decode()


#: What runs a statement: a pooled connection, or a lane's cursor (`execute` returns the cursor).
_Executes = psycopg.AsyncConnection[Row] | psycopg.AsyncCursor[Row]


class PostgresJournal:
    """A `Journal` in a Postgres schema, shared by every replica that opens the same URL."""

    single_writer = False

    def __init__(self, settings: PostgresSettings, *, url: str | None = None) -> None:
        self.settings = settings
        self.url = url or settings.conninfo
        self.recovery: RecoveryReport | None = None
        #: Schema versions the last `open()` applied (empty: the schema was current).
        self.migrations_applied: list[int] = []
        self._signals = ChangeSignals()
        self._pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Row]] | None = None
        self._listener: Listener | None = None
        self._check_task: asyncio.Task[None] | None = None
        # Closes the gap between a waiter's read and its wait (see `wait_for_change`).
        self._read_at: dict[CallIdentity, float] = {}
        self._notified_at: dict[CallIdentity, float] = {}
        # PENDING records read here (version, watched): what a following wait marks watched.
        self._seen: dict[CallIdentity, tuple[int, bool]] = {}
        s = quote_ident(settings.schema)
        self._calls = f"{s}.calls"
        self._entries = f"{s}.entries"
        placeholders = ", ".join(["%s"] * len(_NAMES))
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _MUTABLE) + ", watched = false"
        counts = f"{s}.call_counts"
        typed = ", ".join(f"%s::{t}" for t in _TYPES)
        # The claim: insert, or replace an expired record; else return the record that stands.
        # The second branch reads with the statement's snapshot, so a row committed by a
        # concurrent claim after that snapshot is not seen there: `claim` re-reads then. The
        # expired record it replaces is locked first (`o`), so its state is the one replaced
        # and leaves the kept counts (`count_moved`; the replacement is PENDING, uncounted).
        self._claim_sql = (
            f"WITH o AS (SELECT principal, tool, state FROM {self._calls} WHERE {_IDENTITY} "
            "AND expires_at IS NOT NULL AND expires_at <= %s FOR UPDATE), "
            # The row comes from a SELECT that reads `o` first: the sub-statements of a WITH
            # run in no set order, and `o` read after the insert had replaced the row would
            # find nothing to lock (the row changed by this very statement) and count nothing.
            f"claimed AS (INSERT INTO {self._calls} ({_COLUMNS}) "
            f"SELECT {typed} FROM (SELECT count(*) FROM o) AS locked "
            f"ON CONFLICT (principal, tool, key) DO UPDATE SET {updates} "
            f"WHERE {self._calls}.expires_at IS NOT NULL AND {self._calls}.expires_at <= %s "
            f"RETURNING {_COLUMNS}, watched), "
            "moved AS (SELECT c.principal, c.tool, c.state, o.state AS was FROM claimed c, o), "
            f"counted AS ({count_moved(counts)}) "
            f"SELECT true, {_COLUMNS}, watched FROM claimed UNION ALL "
            f"SELECT false, {_COLUMNS}, watched FROM {self._calls} WHERE {_IDENTITY} "
            "AND NOT EXISTS (SELECT 1 FROM claimed)"
        )
        # A lone claim (see `Batcher`): the insert alone. Reading back the record that stood in
        # the same statement made every lone miss 13% slower (341 against 283 µs per statement,
        # interleaved), most of it the 20-column row a won claim returned; a lone claim that
        # meets a stored record (a repeat the engine has not cached) reads it with a plain
        # SELECT (`_get_sql`): a second insert took a write statement where a read suffices,
        # and fired the kept counts' statement trigger of migrations 5-6 once more for nothing
        # (docs/benchmarks.md, "Replays on the SQL journals").
        self._insert_one_sql = (
            f"INSERT INTO {self._calls} ({_COLUMNS}) VALUES ({placeholders}) "
            "ON CONFLICT (principal, tool, key) DO NOTHING RETURNING 1"
        )
        self._watch_sql = f"UPDATE {self._calls} SET watched = true WHERE {_IDENTITY} AND version = %s"
        sets = ", ".join(f"{c} = %s" for c in _MUTABLE)
        # A swap, in two statements (`_swap_one`; see `_swap_many_sql` for why and why it holds):
        # the update of a record left open, else the general one, which reads the state it
        # leaves from the record it replaces (`o`) for the kept counts.
        self._swap_open_sql = (
            f"WITH moved AS (UPDATE {self._calls} c SET {sets} "
            f"WHERE c.principal = %s AND c.tool = %s AND c.key = %s AND c.version = %s "
            f"AND c.run_id = coalesce(%s, c.run_id) AND c.state {_OPEN} "
            "RETURNING c.principal, c.tool, c.state, NULL::text AS was), "
            f"counted AS ({count_moved(counts)}) "
            "SELECT count(*) FROM moved"
        )
        self._swap_sql = (
            f"WITH moved AS (UPDATE {self._calls} c SET {sets} FROM {self._calls} o "
            "WHERE c.principal = %s AND c.tool = %s AND c.key = %s AND c.version = %s "
            "AND c.run_id = coalesce(%s, c.run_id) "
            "AND o.principal = c.principal AND o.tool = c.tool AND o.key = c.key AND o.version = c.version "
            "RETURNING c.principal, c.tool, c.state, o.state AS was), "
            f"counted AS ({count_moved(counts)}) "
            "SELECT count(*) FROM moved"
        )
        # The batch statements: the rows as one JSON parameter (`_rows_json`).
        c_cols = ", ".join(f"c.{n}" for n in _NAMES)
        on_identity = " AND ".join(f'c.{n} = v.{n} COLLATE "C"' for n in ("principal", "tool", "key"))
        # The records that stand (repeats) are read back only when some row was not inserted
        # (a one-time condition on the two counts): a batch of misses, every row inserted,
        # looked each one up again by its primary key to find nothing its snapshot shows
        # (docs/benchmarks.md, 2026-12-05). A row the statement returns nothing for is decided
        # alone (`claim`).
        self._claim_many_sql = (
            f"WITH v AS (SELECT {_DECODED} FROM json_to_recordset(%s::json) AS r({_RECORDSET})), "
            f"claimed AS (INSERT INTO {self._calls} ({_COLUMNS}) SELECT {_COLUMNS} FROM v "
            f"ON CONFLICT (principal, tool, key) DO NOTHING RETURNING principal, tool, key) "
            f"SELECT true, principal, tool, key, {', '.join(['NULL'] * (len(_NAMES) - 3))}, false "
            "FROM claimed UNION ALL "
            f"SELECT false, {c_cols}, c.watched FROM {self._calls} c JOIN v ON {on_identity} "
            "WHERE (SELECT count(*) FROM claimed) < (SELECT count(*) FROM v) "
            "AND NOT EXISTS (SELECT 1 FROM claimed d WHERE d.principal = c.principal AND d.tool = c.tool "
            "AND d.key = c.key)"
        )
        self._get_many_sql = (
            f"SELECT {c_cols}, c.watched FROM {self._calls} c JOIN unnest(%s::text[], %s::text[], %s::text[]) "
            f"AS v(principal, tool, key) ON {on_identity}"
        )
        # A swap counts the state it leaves in the same statement (`count_moved`). The batch
        # statement swaps only records left open (PENDING or IN_DOUBT at the expected version: a
        # completion, a take-over, a resolution — nearly every swap), which leave nothing
        # counted, so the update alone decides: nothing is read beside it. Any other row (a
        # record re-run or rewritten from a final state, or a swap that lost) is decided alone
        # (`_swap_one`) by the general statement, which reads the state it leaves from the
        # record as the statement's snapshot shows it at the expected version (`o`, without a
        # lock). Reading `o` for every row, or a second update for the rest in the same
        # statement, cost more than the statement trigger it replaced (docs/benchmarks.md,
        # 2026-12-05), as did locking `o`.
        # Why the state seen is the state left: a version-keeping write committed meanwhile (a
        # lease renewal, a waiter's mark) makes the update follow the row to its newest
        # version, which has the same version and so the same state (every change of state
        # moves the version; the open condition re-checked there holds as it did); one that
        # moved the version leaves the row unmatched.
        # The open states come from `v` (`v.open`, `v` materialized) so that the condition joins
        # the batch's rows: written as constants, or with `v` folded into the update, the
        # planner could drive the update from the open records (`calls_open`) or a scan of
        # `calls` instead of from each row's primary key, and keep that plan once prepared.
        swap_sets = ", ".join(f"{c} = v.{c}" for c in _MUTABLE)
        self._swap_many_sql = (
            f"WITH v AS MATERIALIZED (SELECT {_DECODED}, r.expected, r.expected_run, ARRAY{_OPEN_ARRAY} AS open "
            f"FROM json_to_recordset(%s::json) AS r({_RECORDSET}, expected bigint, expected_run text)), "
            f"moved AS (UPDATE {self._calls} c SET {swap_sets} FROM v "
            f"WHERE {on_identity} AND c.version = v.expected AND c.run_id = coalesce(v.expected_run, c.run_id) "
            "AND c.state = ANY (v.open) "
            "RETURNING c.principal, c.tool, c.key, c.state, NULL::text AS was), "
            f"counted AS ({count_moved(counts)}) "
            "SELECT principal, tool, key FROM moved"
        )
        self._get_sql = f"SELECT {_COLUMNS}, watched FROM {self._calls} WHERE {_IDENTITY}"
        held = f"SELECT 1 FROM {self._calls} WHERE {_HELD}"
        self._renew_sql = f"UPDATE {self._calls} SET lease_until = %s WHERE {_HELD}"
        # Entries are inserted under one lock, held to commit: `seq` order is commit order, so a
        # reader tailing `entries(after=seq)` never skips an entry committed late with a smaller seq.
        self._entries_lock = f"mcp_durable.entries.{settings.schema}"
        append = (
            f"WITH l AS (SELECT pg_advisory_xact_lock(hashtext(%s))) "
            f"INSERT INTO {self._entries} (process_id, entry_type, data, ts, step_index) "
            "SELECT %s, %s, %s::json, %s, %s::bigint FROM l"
        )
        self._append_sql = f"{append} RETURNING seq"
        self._append_first_sql = f"{append}{_STEP_CONFLICT}"  # a step, unless one is stored
        # Appends made together (`_append_batch`): one INSERT of the batch's rows, in batch order
        # under the same lock, so their seqs increase along the batch. A row marked as a step
        # (`s`: the first of its step in the batch) is stored as that step unless one is stored
        # already, else as a plain entry (step_index NULL), as `_append_first_sql` then
        # `_append_sql` would. No ON CONFLICT: a step committed by another transaction between
        # this statement's snapshot and its lock fails the statement whole (unique violation),
        # and each append is then made alone (`_batch_rows`), so no row is ever half-decided.
        # The batch's JSON is parsed before the lock is taken (`l` waits for the count of `v`):
        # the lock serialises every append statement up to its commit, so what runs under it
        # is what bounds appends per second; the parse need not.
        insert_batch = (
            "WITH k AS (SELECT hashtext($1) AS key), "
            f"v AS MATERIALIZED (SELECT * FROM json_to_recordset($2::json) AS r({_APPEND_RECORDSET})), "
            "l AS (SELECT pg_advisory_xact_lock(k.key) FROM k, (SELECT count(*) FROM v) AS parsed) "
            f"INSERT INTO {self._entries} (process_id, entry_type, data, ts, step_index) "
        )
        self._append_many_sql = (
            f"{insert_batch}SELECT v.p, v.t, v.d, v.ts, CASE WHEN x.stored IS NULL THEN v.s END FROM l, v "
            f"LEFT JOIN LATERAL (SELECT true AS stored FROM {self._entries} e "
            "WHERE e.process_id = v.p AND e.step_index = v.s LIMIT 1) x ON true ORDER BY v.n RETURNING seq"
        )
        # A batch without step entries (`s` NULL in every row, as for most process entries)
        # has no step to look up: the same statement without the lookup's join.
        self._append_plain_sql = f"{insert_batch}SELECT v.p, v.t, v.d, v.ts, NULL FROM l, v ORDER BY v.n RETURNING seq"
        # A durable step. The record's row is locked (FOR SHARE) while PENDING under the fence,
        # before the entries' lock: a take-over, resolve or cancel (an UPDATE of that row) then
        # waits for this insert to commit, or commits first and this statement, re-reading the row
        # it waited for, finds the fence gone and inserts nothing. A stored step (the unique
        # `entries_by_step`) also leaves nothing inserted.
        self._append_step_sql = (
            f"WITH held AS ({held} FOR SHARE), "
            "l AS (SELECT pg_advisory_xact_lock(hashtext(%s)) FROM held) "
            f"INSERT INTO {self._entries} (process_id, entry_type, data, ts, step_index) "
            f"SELECT %s, %s, %s::json, %s, %s::bigint FROM l{_STEP_CONFLICT}"
        )
        # Connections kept between the batches' statements (`lane.py`), when the pool is large
        # enough to leave others for renewals, listings and entries (`open`).
        self._lanes = Lanes(0)
        self._claims: Batcher[CallRecord, tuple[bool, CallRecord, bool] | _Alone] = Batcher(
            self._claim_batch, **_BATCHING, run_one=self._claim_one
        )
        self._swaps: Batcher[_Swap, bool | _Alone] = Batcher(self._swap_batch, **_BATCHING, run_one=self._swap_one)
        self._gets: Batcher[CallIdentity, tuple[CallRecord, bool] | None | _Alone] = Batcher(
            self._get_batch, **_BATCHING, run_one=self._get_one
        )
        # Appends batch as the other kinds (32 a statement, a full batch sent beside the one in
        # flight), in the order their batches opened (`ordered`), every batch, of one item or
        # many, through the one pipelined connection (`pipeline.py`). Their statements take the
        # entries' lock up to their commit, so only one commits at a time: on connections of
        # their own, a batch sent second could take the lock first, and batches of 64 (one in
        # flight for a wave of 64 writers) left the client and the server taking turns.
        # Pipelined, the second batch is sent while the first commits, and runs after it
        # (docs/benchmarks.md, "Postgres appends through one pipelined connection").
        self._appends: Batcher[_Append, int | _Alone] = Batcher(self._append_batch, **_BATCHING, ordered=True)
        self._pipeline: Pipeline | None = None

    @classmethod
    def from_url(cls, url: str) -> PostgresJournal:
        return cls(PostgresSettings.from_url(url), url=url)

    # -- plumbing ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connection(self, lane: Lane | None = None) -> AsyncIterator[_Executes]:
        """A pooled connection, or `lane`'s cursor when a free lane is given (either `execute`s a
        statement and returns the cursor to read); every driver failure becomes `JournalError`
        (cause attached)."""
        pool = self._pool
        if pool is None:
            raise JournalError(f"journal {self.settings.schema!r} is not open")
        try:
            if lane is None or lane.busy:
                async with pool.connection() as conn:
                    yield conn
            else:
                cursor = await lane.acquire(pool)
                failed = True
                try:
                    yield cursor
                    failed = False
                finally:
                    await lane.release(pool, failed=failed)
        except psycopg_pool.PoolTimeout as exc:
            self._check_pool()
            raise JournalError(
                f"postgres journal unavailable: no connection within {self.settings.pool_timeout:g}s"
            ) from exc
        except BaseException as exc:
            self._raise_driver_error(exc)
            raise

    async def _pipelined(self, sql: str, params: Sequence[bytes | None]) -> list[tuple[bytes | None, ...]]:
        """The rows of `sql` run through the appends' pipeline (`pipeline.py`), after every
        statement sent there before it; driver failures become `JournalError` as in `_connection`."""
        pipeline = self._pipeline
        if pipeline is None:
            raise JournalError(f"journal {self.settings.schema!r} is not open")
        try:
            return await pipeline.rows(sql, params)
        except BaseException as exc:
            self._raise_driver_error(exc)
            raise

    def _raise_driver_error(self, exc: BaseException) -> None:
        """Raise `exc` as the `JournalError` it means (cause attached), if it is a driver's failure."""
        if isinstance(exc, (psycopg.OperationalError, psycopg.InterfaceError, OSError)):
            self._check_pool()
            raise JournalError(f"postgres journal unavailable: {display_url(str(exc))}") from exc
        if isinstance(exc, psycopg.Error):
            raise JournalError(f"postgres journal error: {display_url(str(exc))}") from exc
        if isinstance(exc, UnicodeEncodeError):  # a text the driver cannot send (a lone surrogate)
            raise JournalError(f"postgres journal error: {exc}") from exc

    def _check_pool(self) -> None:
        # After a lost connection the other idle ones are likely dead too (a database restart):
        # test them all in the background, so they fail here rather than in later calls.
        if self._pool is None or (self._check_task is not None and not self._check_task.done()):
            return

        async def check(pool: psycopg_pool.AsyncConnectionPool[Any]) -> None:
            with contextlib.suppress(Exception):  # best effort; the next call reports the failure
                await pool.check()

        self._check_task = asyncio.get_running_loop().create_task(check(self._pool))

    async def _fetchone(self, sql: str, params: tuple[Any, ...], lane: Lane | None = None) -> Row | None:
        async with self._connection(lane) as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchone()

    async def _fetchall(
        self, sql: str, params: tuple[Any, ...] | list[Any] = (), lane: Lane | None = None
    ) -> list[Row]:
        async with self._connection(lane) as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

    async def _batch_rows(self, run: Callable[[], Awaitable[list[_R]]]) -> list[_R] | None:
        """The rows a batch statement returns (`run`: sent on a pooled connection or lane, or
        through the appends' pipeline; its parameters encoded inside it), or None when one of its
        items broke it (a text JSON or the database cannot carry, e.g. a lone surrogate or a
        NUL): the caller then answers ALONE for every item, each is decided by itself, and only
        the culprit fails."""
        try:
            return await run()
        except orjson.JSONEncodeError:
            return None
        except JournalError as exc:
            if _broken_by_an_item(exc) or isinstance(exc.__cause__, _ROLLED_BACK):
                # A deadlock the database broke (or a serialisation failure): the statement was
                # rolled back whole, so deciding each item alone, in single-row statements that
                # wait for at most one lock, loses nothing.
                return None
            raise

    async def _rowcount(self, sql: str, params: tuple[Any, ...], lane: Lane | None = None) -> int:
        async with self._connection(lane) as conn:
            cur = await conn.execute(sql, params)
            return cur.rowcount

    # -- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the pool, migrate the schema, start listening. Raises `JournalError` if unreachable."""
        if self._pool is not None:
            return
        started = time.perf_counter()
        s = self.settings
        # Our settings join any `options` the URL gives (kwargs would replace them).
        given = conninfo_to_dict(s.conninfo).get("options") or ""
        options = f"{given} -c statement_timeout={int(s.statement_timeout * 1000)} {_PLANNER} {_COUNTED}".strip()
        pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Row]] = psycopg_pool.AsyncConnectionPool(
            s.conninfo,
            min_size=s.pool_min,
            max_size=s.pool_max,
            timeout=s.pool_timeout,
            open=False,
            # Give up a failing reconnection after a second instead of backing off for minutes:
            # the next call that needs a connection starts a fresh attempt at once, so the
            # pool is back within about a second of the database.
            reconnect_timeout=1.0,
            kwargs={"autocommit": True, "options": options},
            name=f"mcp-durable/{s.schema}",
        )
        try:
            await pool.open(wait=True, timeout=s.pool_timeout)
            async with pool.connection() as conn:
                applied = await migrate(conn, s.schema, s.channel)
        except (psycopg.Error, OSError) as exc:
            await pool.close()
            raise JournalError(f"cannot open postgres journal (schema {s.schema!r}): {display_url(str(exc))}") from exc
        except BaseException:
            await pool.close()
            raise
        self._pool = pool
        # New lanes (a journal may be opened again after a close); none on a pool too small to
        # keep three connections out of it and still serve everything else.
        self._lanes = Lanes(LANES if s.pool_max >= LANES_MIN_POOL else 0)
        self._pipeline = Pipeline(s.conninfo, options=options)
        self._listener = Listener(s.conninfo, s.channel, self._on_notify, self._on_listen_state)
        self._listener.start()
        # Not fatal if slow: waiters poll until the LISTEN is up.
        await self._listener.wait_connected(s.pool_timeout)
        self.migrations_applied = applied
        self.recovery = RecoveryReport("postgres", time.perf_counter() - started)

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        listener, self._listener = self._listener, None
        pipeline, self._pipeline = self._pipeline, None
        if pipeline is not None:
            await pipeline.aclose()
        if self._check_task is not None:
            self._check_task.cancel()
            self._check_task = None
        if listener is not None:
            await listener.aclose()
        if pool is not None:
            for lane in self._lanes:
                await lane.close(pool)
            await pool.close()
        self._signals.notify_all()

    # -- wake-ups ---------------------------------------------------------------------------------

    def _on_notify(self, payload: str) -> None:
        if not payload:
            self._signals.notify_all()
            return
        principal, tool, key = orjson.loads(payload)
        identity = CallIdentity(principal, tool, key)
        if identity in self._read_at:
            if len(self._notified_at) > 10_000:
                self._notified_at.clear()
            self._notified_at[identity] = anyio.current_time()
        self._signals.notify(identity)

    def _on_listen_state(self, connected: bool) -> None:
        # Notifications may have been missed while the LISTEN was down: every waiter re-reads.
        self._signals.notify_all()

    async def wait_for_change(self, identity: CallIdentity, timeout: float) -> None:
        listening = self._listener is not None and self._listener.connected
        seen = self._seen.pop(identity, None)
        if seen is not None and not seen[1] and listening:
            # Ask for a NOTIFY: mark the record watched, if it is still the version we read.
            # If it is not, it changed since: return at once and let the caller re-read.
            try:
                marked = await self._rowcount(
                    self._watch_sql, (identity.principal, identity.tool, identity.key, seen[0])
                )
            except JournalError:
                marked = 1  # the database is away: fall back to re-reading below
            if marked == 0:
                self._read_at.pop(identity, None)
                return
        # Race: the owner completes the record and its NOTIFY is dispatched after our read (or
        # our mark) but before the event below is registered: that wake-up would be lost.
        #     read/mark starts ── commit+NOTIFY ── read/mark returns ── wait() registers
        # Reads note when they started; a notification after that means "re-read now".
        read_at = self._read_at.pop(identity, None)
        notified_at = self._notified_at.pop(identity, None)
        if read_at is not None and notified_at is not None and notified_at >= read_at:
            return
        await self._signals.wait(identity, min(timeout, self.settings.poll if listening else 0.2))

    def _note_read(self, record: CallRecord, watched: bool) -> None:
        if record.state == CallState.PENDING:
            if len(self._seen) > 10_000:
                self._seen.clear()  # reads never followed by a wait: only a NOTIFY lost, polled for
            self._seen[record.identity] = (record.version, watched)
        else:
            self._seen.pop(record.identity, None)

    def _note_read_started(self, identity: CallIdentity) -> None:
        if len(self._read_at) > 10_000:
            self._read_at.clear()
        self._read_at[identity] = anyio.current_time()

    # -- call records -----------------------------------------------------------------------------

    #: A claim answers a repeat with the record that stands, writing nothing (in the batch's one
    #: round trip; a lone claim that meets a record takes a second): a miss, the common case of
    #: a first call, is then one round trip, so the engine claims at once instead of reading first.
    claim_reads = True

    async def claim(self, record: CallRecord, now: float) -> tuple[bool, CallRecord]:
        i = record.identity
        self._note_read_started(i)
        outcome = await self._claims.submit(record)
        if not isinstance(outcome, _Alone):
            won, stood, watched = outcome
            if won:
                self._signals.notify(i)
                return True, record
            if not stood.is_expired(now):
                self._note_read(stood, watched)
                return False, stood
        # The rare rest, one by one: an expired record to replace, a claim committed after the
        # batch's snapshot, a second claim of one identity in the batch.
        while True:
            self._note_read_started(i)
            rows = await self._fetchall(
                self._claim_sql, (i.principal, i.tool, i.key, now, *_params(record), now, i.principal, i.tool, i.key)
            )
            if rows and rows[0][0]:
                self._signals.notify(i)
                return True, record
            if rows:
                existing = _record(rows[0][1:])
                self._note_read(existing, bool(rows[0][-1]))
                return False, existing
            # Lost to a claim committed after this statement's snapshot: read it now.
            current = await self.get(i)
            if current is not None:
                return False, current
            # … and it was purged meanwhile: claim again.

    async def _claim_batch(self, records: list[CallRecord]) -> list[tuple[bool, CallRecord, bool] | _Alone]:
        """Claim each record's identity; per record: (won, the record that stands, watched), or ALONE
        for "decide it alone" (a second claim of one identity in the batch, or no row seen)."""
        first: dict[CallIdentity, int] = {}
        sent: list[CallRecord] = []
        for index, record in enumerate(records):
            if first.setdefault(record.identity, index) == index:
                sent.append(record)
        sent.sort(key=_lock_order)
        lane = self._lanes.free()
        rows = await self._batch_rows(lambda: self._fetchall(self._claim_many_sql, (_rows_json(sent),), lane))
        if rows is None:
            return [ALONE] * len(records)
        found: dict[CallIdentity, tuple[bool, CallRecord | None, bool]] = {}
        for row in rows:
            identity = CallIdentity(row[1], row[2], row[3])
            found[identity] = (True, None, False) if row[0] else (False, _record(row[1:-1]), bool(row[-1]))
        outcomes: list[tuple[bool, CallRecord, bool] | _Alone] = []
        for index, record in enumerate(records):
            hit = found.get(record.identity)
            if hit is None or first[record.identity] != index:
                outcomes.append(ALONE)
            elif hit[0]:
                outcomes.append((True, record, False))
            else:
                assert hit[1] is not None
                outcomes.append((False, hit[1], hit[2]))
        return outcomes

    async def _claim_one(self, record: CallRecord) -> tuple[bool, CallRecord, bool] | _Alone:
        """`_claim_batch` for a lone record: a single-row insert, and when a record stands, a
        second statement that reads it (ALONE when it is gone meanwhile: `claim` decides then)."""
        lane = self._lanes.free()
        if await self._fetchall(self._insert_one_sql, _params(record), lane):
            return True, record, False
        i = record.identity
        row = await self._fetchone(self._get_sql, (i.principal, i.tool, i.key), lane)
        if row is None:
            return ALONE  # purged between the two statements
        return False, _record(row), bool(row[-1])  # watched: after the columns

    async def get(self, identity: CallIdentity) -> CallRecord | None:
        self._note_read_started(identity)
        outcome = await self._gets.submit(identity)
        if isinstance(outcome, _Alone):
            outcome = await self._get_one(identity)
        if outcome is None:
            return None
        record, watched = outcome
        self._note_read(record, watched)
        return record

    async def _get_batch(self, identities: list[CallIdentity]) -> list[tuple[CallRecord, bool] | None | _Alone]:
        unique = list(dict.fromkeys(identities))
        lane = self._lanes.free()
        rows = await self._batch_rows(
            lambda: self._fetchall(
                self._get_many_sql,
                ([i.principal for i in unique], [i.tool for i in unique], [i.key for i in unique]),
                lane,
            )
        )
        if rows is None:
            return [ALONE] * len(identities)
        found: dict[CallIdentity, tuple[CallRecord, bool] | None | _Alone] = {}
        for row in rows:
            record = _record(row)
            found[record.identity] = (record, bool(row[-1]))  # watched: after the columns
        return [found.get(identity) for identity in identities]

    async def _get_one(self, identity: CallIdentity) -> tuple[CallRecord, bool] | None:
        row = await self._fetchone(self._get_sql, (identity.principal, identity.tool, identity.key), self._lanes.free())
        return None if row is None else (_record(row), bool(row[-1]))  # watched: after the columns

    async def find_calls(self, tool: str, key: str) -> list[CallRecord]:
        # The principals with a record of the tool (the kept counts know those with a final one,
        # `calls_open` those with an open one), each looked up by the primary key: no index on
        # (tool, key) for every claim to keep.
        counts = f"{quote_ident(self.settings.schema)}.call_counts"
        sql = (
            f"SELECT {_COLUMNS} FROM {self._calls} WHERE principal = ANY(ARRAY("
            f"SELECT principal FROM {counts} WHERE tool = %s GROUP BY principal HAVING sum(n) > 0 "
            f"UNION SELECT principal FROM {self._calls} WHERE {OPEN_CALLS} AND tool = %s)) "
            f"AND tool = %s AND key = %s {LISTING_ORDER}"
        )
        return [_record(row) for row in await self._fetchall(sql, (tool, tool, tool, key))]

    async def get_task(self, principal: str, task_id: str) -> CallRecord | None:
        row = await self._fetchone(
            f"SELECT {_COLUMNS} FROM {self._calls} WHERE principal = %s AND task_id = %s", (principal, task_id)
        )
        return None if row is None else _record(row)

    async def swap(self, expected_version: int, record: CallRecord, expected_run_id: str | None = None) -> bool:
        i = record.identity
        item = _Swap(expected_version, expected_run_id, record)
        swapped = await self._swaps.submit(item)
        if isinstance(swapped, _Alone):  # a second swap of one identity in a batch, or a record not open: alone
            swapped = await self._swap_one(item)
        if swapped:
            self._signals.notify(i)
        return swapped

    async def _swap_batch(self, items: list[_Swap]) -> list[bool | _Alone]:
        first: dict[CallIdentity, int] = {}
        sent: list[_Swap] = []
        for index, item in enumerate(items):
            if first.setdefault(item.record.identity, index) == index:
                sent.append(item)
        sent.sort(key=lambda item: _lock_order(item.record))
        lane = self._lanes.free()
        rows = await self._batch_rows(
            lambda: self._fetchall(
                self._swap_many_sql,
                (_rows_json([s.record for s in sent], [s.version for s in sent], [s.run_id for s in sent]),),
                lane,
            )
        )
        if rows is None:
            return [ALONE] * len(items)
        swapped = {CallIdentity(*row) for row in rows}
        # A row not swapped (not open at the expected version) is decided alone.
        return [
            True if first[record.identity] == index and record.identity in swapped else ALONE
            for index, (_, _, record) in enumerate(items)
        ]

    async def _swap_one(self, item: _Swap) -> bool:
        expected_version, expected_run_id, record = item
        i = record.identity
        params = (*_params(record)[3:], i.principal, i.tool, i.key, expected_version, expected_run_id)
        row = await self._fetchone(self._swap_open_sql, params, self._lanes.free())
        if row is not None and row[0] == 1:
            return True
        row = await self._fetchone(self._swap_sql, params, self._lanes.free())
        return row is not None and row[0] == 1

    async def renew(self, identity: CallIdentity, fence: Fence, lease_until: float) -> bool:
        count = await self._rowcount(self._renew_sql, (lease_until, *_held(identity, fence)))
        return count == 1

    async def append_step(
        self, identity: CallIdentity, fence: Fence, index: int, data: dict[str, Any], ts: float
    ) -> JournalEntry | None:
        data = step_data(index, data)
        process_id = step_process_id(fence.run_id)
        row = await self._fetchone(
            self._append_step_sql,
            (*_held(identity, fence), self._entries_lock, process_id, STEP, orjson.dumps(data).decode(), ts, index),
        )
        return None if row is None else JournalEntry(process_id, STEP, data, ts, int(row[0]))

    async def list_calls(self, query: CallQuery = RECENT_CALLS) -> list[CallRecord]:
        sql, args = self.listing(query)
        return [_record(row) for row in await self._fetchall(sql, args)]

    def listing(self, query: CallQuery) -> tuple[str, list[Any]]:
        """The statement `list_calls(query)` runs, and its parameters. A listing of an open state
        names `calls_open`'s condition (`sql_rows.OPEN_CALLS`), so every plan of it, a prepared
        statement's generic one too, may read that index (migration 6)."""
        tail, args = listing_clause(query, "%s")
        return f"SELECT {_COLUMNS} FROM {self._calls} {tail}", args

    async def purge_expired(self, now: float) -> int:
        return await self._rowcount(
            f"DELETE FROM {self._calls} WHERE expires_at IS NOT NULL AND expires_at <= %s", (now,)
        )

    async def purge_expired_calls(self, now: float, limit: int = 1000) -> PurgedCalls:
        # One statement (one transaction): the earliest expired records that no transaction
        # holds (a claim replacing one, a swap: `SKIP LOCKED`, left for the next call), through
        # `calls_by_expiry`, and the step entries of their runs, through `entries_by_process`.
        steps = step_process_id("")
        rows = await self._fetchall(
            f"WITH gone AS (DELETE FROM {self._calls} WHERE ctid = ANY(ARRAY("
            f"SELECT ctid FROM {self._calls} WHERE expires_at IS NOT NULL AND expires_at <= %s "
            "ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED)) AND expires_at <= %s "
            "RETURNING principal, tool, key, run_id), "
            f"steps AS (DELETE FROM {self._entries} WHERE process_id = ANY(ARRAY("
            "SELECT %s || run_id FROM gone)) RETURNING 1) "
            "SELECT principal, tool, key, run_id, (SELECT count(*) FROM steps) FROM gone",
            (now, max(1, limit), now, steps),
        )
        if not rows:
            return PurgedCalls()
        return PurgedCalls(tuple((CallIdentity(p, t, k), run) for p, t, k, run, _ in rows), int(rows[0][4]))

    async def count_calls(self, query: CountQuery = ALL_CALLS) -> CallCounts:
        return await self.kept_counts().count(query)

    async def stats(self) -> JournalStats:
        return await self.kept_counts().stats()

    def kept_counts(self) -> KeptCounts:
        """The counting statements of this schema (`postgres/counts.py`)."""
        schema = quote_ident(self.settings.schema)
        return KeptCounts(schema, self._calls, self._entries, self._fetchall, self._rowcount)

    # -- process entries --------------------------------------------------------------------------

    async def append(self, process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> JournalEntry:
        item = _Append(process_id, entry_type, orjson.dumps(data).decode(), ts, step_index(entry_type, data))
        counted = callers.direct_write()  # a writer appending in a loop need not wait for others
        try:
            seq = await self._appends.submit(item)
        finally:
            callers.direct_done(counted)
        if isinstance(seq, _Alone):  # the batch's statement could not carry one of its appends
            seq = await self._append_one(item)
        return JournalEntry(process_id, entry_type, data, ts, seq)

    async def _append_batch(self, items: list[_Append]) -> Sequence[int | _Alone]:
        """Append each item, in one statement (`_append_many_sql`): their seqs, in batch order;
        ALONE for every item when the statement failed because of one of them."""
        steps: set[tuple[str, int]] = set()
        rows = []
        any_step = False
        for n, item in enumerate(items):
            step = item.step
            if step is not None:
                # The first of a step in the batch may be the step; a later one is stored as a
                # plain entry, as if it had been appended after it.
                if (item.process_id, step) in steps:
                    step = None
                else:
                    steps.add((item.process_id, step))
                    any_step = True
            rows.append(
                {
                    "n": n,
                    "p": item.process_id,
                    "t": item.entry_type,
                    "d": orjson.Fragment(item.payload),
                    "ts": item.ts,
                    "s": step,
                }
            )
        sql = self._append_many_sql if any_step else self._append_plain_sql
        result = await self._batch_rows(lambda: self._pipelined(sql, (self._entries_lock.encode(), orjson.dumps(rows))))
        if result is None:
            return [ALONE] * len(items)
        seqs = [int(seq) for seq, *_ in result if seq is not None]
        if len(seqs) != len(items):
            raise JournalError(f"postgres journal error: a batch of {len(items)} appends stored {len(seqs)}")
        # The rows were numbered as they were inserted, in batch order: the smallest seq is the first item's.
        return sorted(seqs)

    async def _append_one(self, item: _Append) -> int:
        """Append one item alone: as its step when it is one and none is stored, else as a plain entry."""
        lane = self._lanes.free()
        row = None
        if item.step is not None:
            # A step counts as that step unless one is stored; then it is stored all the same,
            # not as the step (`append` never refuses an entry), by the statement below.
            row = await self._fetchone(
                self._append_first_sql,
                (self._entries_lock, item.process_id, item.entry_type, item.payload, item.ts, item.step),
                lane,
            )
        if row is None:
            row = await self._fetchone(
                self._append_sql,
                (self._entries_lock, item.process_id, item.entry_type, item.payload, item.ts, None),
                lane,
            )
        assert row is not None
        return int(row[0])

    async def entries(
        self, *, process_id: str | None = None, after: int = 0, limit: int | None = None
    ) -> list[JournalEntry]:
        sql = f"SELECT process_id, entry_type, data::text, ts, seq FROM {self._entries} WHERE seq > %s"
        args: list[Any] = [after]
        if process_id is not None:
            sql += " AND process_id = %s"
            args.append(process_id)
        sql += " ORDER BY seq LIMIT %s"
        args.append(limit)
        return [_entry(row) for row in await self._fetchall(sql, args)]

    async def purge_entries(self, process_ids: Collection[str], *, before_seq: int | None = None) -> int:
        names = list(process_ids)
        if not names:
            return 0
        if before_seq is None:
            return await self._rowcount(f"DELETE FROM {self._entries} WHERE process_id = ANY(%s)", (names,))
        return await self._rowcount(
            f"DELETE FROM {self._entries} WHERE process_id = ANY(%s) AND seq < %s", (names, before_seq)
        )

    async def audit_entries(self, identity: CallIdentity) -> list[JournalEntry]:
        # The process spelled out, as `entries_by_audit`'s condition (a parameter would keep a
        # prepared statement's generic plan off the partial index).
        rows = await self._fetchall(
            f"SELECT process_id, entry_type, data::text, ts, seq FROM {self._entries} "
            f"WHERE process_id = '{AUDIT_PROCESS}' AND (data ->> 'principal') = %s AND (data ->> 'tool') = %s "
            "AND (data ->> 'key') = %s AND entry_type = %s ORDER BY seq",
            (*identity, AUDIT_ENTRY),
        )
        return [_entry(row) for row in rows]

    async def last_checkpoint(self, process_id: str) -> JournalEntry | None:
        row = await self._fetchone(
            f"SELECT process_id, entry_type, data::text, ts, seq FROM {self._entries} "
            "WHERE process_id = %s AND entry_type = %s ORDER BY seq DESC LIMIT 1",
            (process_id, CHECKPOINT),
        )
        return None if row is None else _entry(row)


def _held(identity: CallIdentity, fence: Fence) -> tuple[Any, ...]:
    """The parameters of `_HELD`: the record of `identity`, PENDING under `fence`."""
    return (
        identity.principal,
        identity.tool,
        identity.key,
        CallState.PENDING.value,
        fence.owner,
        fence.run_id,
        fence.attempts,
    )
