"""`sqlite:///PATH`: a journal in one SQLite database (WAL), shared by several processes on a host.

Atomicity across processes comes from SQLite itself: every write runs in a `BEGIN IMMEDIATE`
transaction, so of N processes claiming one identity exactly one inserts (the others see its
row). Durability: `synchronous=FULL` by default (each commit is fsynced); the URL query
`?synchronous=NORMAL` relaxes it for tests. Waiters in this process are woken at once; waiters
in other processes poll the row (`poll_interval`), since SQLite has no notifications. The
schema, and the migration of databases of earlier releases on open: `sqlite_schema.py`.

Fencing: `renew` and `append_step` check the owner's fence (owner, run_id, attempts) in the
statement that writes, inside the write transaction, so no other process writes between the
check and the write; a durable step's uniqueness per `(process_id, step_index)` is the
database's own (a unique index), whichever process writes it.

`?single_writer=1` declares that one server process owns the database: `open()` takes an
exclusive lock on `PATH.lock` (held until `aclose()` or the process dies, so a SIGKILL frees
it), a second writer gets `JournalLockedError`, and the engine marks PENDING records of a
previous boot IN_DOUBT at start without waiting for their lease.

Group commit: one thread owns the connection (`SQLiteWriter`); concurrent claims, swaps,
renewals and appends of this process are committed together, one transaction (one fsync) per
batch, each call in its own SAVEPOINT so it succeeds or fails alone, and nobody is answered
before their batch's COMMIT returned. A batch that cannot commit fails every call in it with
`JournalError` (`journal_unavailable`) and leaves nothing of it behind. A call that finds the
thread idle while commits are fast is committed by the event loop's own thread (cheaper than
the hop); the loop never waits for another process's lock, nor for a slow disk.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs

import orjson

from ..errors import ConfigError, JournalError
from . import callers
from .base import (
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
from .fsync import make_dirs
from .masked_urls import display_url
from .model import CallIdentity, CallRecord, CallState, Fence, JournalEntry, JournalStats
from .record_json import step_data, step_index
from .sql_rows import CALL_COLUMNS as _COLUMNS
from .sql_rows import LISTING_ORDER, OPEN_CALLS, counts_of, listing_clause, ranged_count_sql
from .sql_rows import call_record as _record
from .sql_rows import call_row as _row
from .sql_rows import process_entry as _entry
from .sqlite_schema import AUDIT_CALL, COUNTED_GROUPS, ENTRY_FOLD, ENTRY_TALLY, OPEN_INDEX, fold_entries, migrate
from .sqlite_writer import SQLiteWriter
from .writer_lock import WriterLock

T = TypeVar("T")

_PLACEHOLDERS = ", ".join("?" * len(_COLUMNS.split(", ")))
_SELECT_ONE = f"SELECT {_COLUMNS} FROM calls WHERE principal=? AND tool=? AND key=?"
#: A claim: the row inserted, or an expired one replaced (the parameters: the row, then `now`).
_CLAIM = (
    f"INSERT INTO calls ({_COLUMNS}) VALUES ({_PLACEHOLDERS}) ON CONFLICT (principal, tool, key) DO UPDATE SET "
    + ", ".join(f"{c}=excluded.{c}" for c in _COLUMNS.split(", ")[3:])
    + " WHERE calls.expires_at IS NOT NULL AND calls.expires_at <= ?"
)
_SWAP = (
    "UPDATE calls SET fingerprint=?, state=?, version=?, run_id=?, attempts=?, created_at=?, updated_at=?, owner=?, "
    "lease_until=?, completed_at=?, expires_at=?, result=?, error=?, arguments=?, task_id=?, reason=? "
    "WHERE principal=? AND tool=? AND key=? AND version=? AND run_id=coalesce(?, run_id)"
)
#: `_SWAP` where `created_at` and `task_id` stay as they are (so their indexes are not touched).
_SWAP_KEEPING = (
    "UPDATE calls SET fingerprint=?, state=?, version=?, run_id=?, attempts=?, updated_at=?, owner=?, "
    "lease_until=?, completed_at=?, expires_at=?, result=?, error=?, arguments=?, reason=? "
    "WHERE principal=? AND tool=? AND key=? AND version=? AND run_id=coalesce(?, run_id) "
    "AND created_at=? AND task_id IS ?"
)
#: The record of `identity` is PENDING under a fence (parameters: identity, state, owner, run_id, attempts).
_HELD = "principal=? AND tool=? AND key=? AND state=? AND owner=? AND run_id=? AND attempts=?"
_RENEW = f"UPDATE calls SET lease_until=? WHERE {_HELD}"
#: A durable step: inserted only while the fence holds and no entry is that step already (the
#: parameters: the entry's five columns, then `_HELD`'s).
_APPEND_STEP = (
    "INSERT INTO entries (process_id, entry_type, data, ts, step_index) SELECT ?, ?, ?, ?, ? "
    f"WHERE EXISTS (SELECT 1 FROM calls WHERE {_HELD}) "
    "ON CONFLICT (process_id, step_index) WHERE step_index IS NOT NULL DO NOTHING"
)
#: A plain append: an entry that is a step counts as that step unless one is stored already
#: (then it is stored all the same, but not as the step: `append` never refuses an entry).
_APPEND = (
    "INSERT INTO entries (process_id, entry_type, data, ts, step_index) SELECT ?1, ?2, ?3, ?4, "
    "CASE WHEN EXISTS (SELECT 1 FROM entries WHERE process_id = ?1 AND step_index = ?5) THEN NULL ELSE ?5 END"
)


#: Expired records, the earliest expiry first, through `calls_by_expiry` (parameters: now, limit).
_EXPIRED = (
    "SELECT rowid, principal, tool, key, run_id FROM calls INDEXED BY calls_by_expiry "
    "WHERE expires_at IS NOT NULL AND expires_at <= ? ORDER BY expires_at LIMIT ?"
)
#: The audit entries of one call through `entries_by_audit` (parameters: principal, tool, key,
#: entry type). The process is spelled out: SQLite uses a partial index only for a query whose
#: WHERE names the index's own condition, never for a parameter.
_AUDITS = (
    "SELECT process_id, entry_type, data, ts, seq FROM entries INDEXED BY entries_by_audit "
    f"WHERE process_id = '{AUDIT_PROCESS}' AND ({AUDIT_CALL}) = (?, ?, ?) AND entry_type = ? ORDER BY seq"
)
#: A call of every principal: the principals with a record of the tool (the kept counts know
#: those with a final one, `calls_open` those with an open one), each looked up by the primary
#: key (parameters: tool, tool, tool, key). `calls_open` is named: without statistics, SQLite
#: would answer "open records of the tool" from any index that leads with `tool` instead, which
#: walks every record of the tool (docs/benchmarks.md, 2026-12-07).
_FIND = (
    f"SELECT {_COLUMNS} FROM calls WHERE principal IN (SELECT principal FROM call_counts WHERE tool = ? AND n > 0 "
    f"UNION SELECT principal FROM calls INDEXED BY {OPEN_INDEX} WHERE {OPEN_CALLS} AND tool = ?) "
    f"AND tool = ? AND key = ? {LISTING_ORDER}"
)
#: Values per `IN (…)` list (SQLite allows 32,766 parameters; far fewer keep statements small).
_IN_CHUNK = 500


class SQLiteJournal:
    """A `Journal` in a SQLite database file (WAL mode)."""

    single_writer = False
    #: An append whose seq is a multiple of this folds the entries' count (`fold_entries`).
    entry_fold = ENTRY_FOLD

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "FULL",
        poll_interval: float = 0.02,
        busy_timeout: float = 5.0,
        url: str | None = None,
        single_writer: bool = False,
    ) -> None:
        self.path = Path(path)
        self.single_writer = single_writer
        self._lock: WriterLock | None = None
        self.url = url or f"sqlite:///{self.path}"
        if synchronous.upper() not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ConfigError(f"synchronous must be OFF, NORMAL, FULL or EXTRA, not {synchronous!r}")
        self._synchronous = synchronous.upper()
        self._poll_interval = poll_interval
        self._busy_timeout = busy_timeout
        self._writer: SQLiteWriter | None = None
        self._signals = ChangeSignals()
        self.recovery: RecoveryReport | None = None

    @classmethod
    def from_url(cls, url: str) -> SQLiteJournal:
        rest = url[len("sqlite://") :]
        path, _, query = rest.partition("?")
        # sqlite:///relative/path and sqlite:////absolute/path, as SQLAlchemy spells them.
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise ConfigError(f"sqlite journal URL needs a path: {display_url(url)!r} (e.g. sqlite:///journal.db)")
        params = {k: v[-1] for k, v in parse_qs(query).items()}
        single = params.get("single_writer", "0").lower() in ("1", "true", "yes", "on")
        return cls(path, synchronous=params.get("synchronous", "FULL"), url=url, single_writer=single)

    # -- plumbing ---------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        # The directory's entry made durable first: SQLite fsyncs the directory it creates its
        # journal files in, never the one above, so a power loss could take a new directory,
        # and every commit in it, away.
        make_dirs(self.path.parent, 0o700)
        # Owner-only before SQLite opens it: SQLite gives the -wal and -shm files (which hold the
        # same arguments and results) the database file's mode, not 0600.
        for path, flags in (
            (self.path, os.O_RDWR | os.O_CREAT),
            (Path(f"{self.path}-wal"), os.O_RDWR),
            (Path(f"{self.path}-shm"), os.O_RDWR),
        ):
            try:
                os.close(os.open(path, flags, 0o600))
                os.chmod(path, 0o600)
            except OSError:
                pass  # absent, or read-only: SQLite itself says what is wrong, if anything
        # Used by the writer thread and, for inline commits, the event loop's thread: never at once
        # (`SQLiteWriter` holds a lock around every use).
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
        try:
            migrate(conn)
        except BaseException:
            conn.close()  # rolls the transaction back
            raise
        try:
            os.chmod(self.path, 0o600)
        except OSError:
            pass
        return conn

    def _live_writer(self) -> SQLiteWriter:
        if self._writer is None:
            raise JournalError(f"journal {self.url} is not open")
        return self._writer

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(conn)` as a read, outside any transaction."""
        try:
            return await self._live_writer().read(fn)
        except (sqlite3.Error, OSError) as exc:  # the driver's and the files' faults alike
            raise JournalError(f"sqlite journal {self.path}: {exc}") from exc

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """`fn(conn)` in the next group-committed transaction, in a savepoint of its own."""
        try:
            return await self._live_writer().write(fn)
        except (sqlite3.Error, OSError) as exc:  # the driver's and the files' faults alike
            raise JournalError(f"sqlite journal {self.path}: {exc}") from exc

    # -- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        if self._writer is not None:
            return
        started = time.perf_counter()
        if self.single_writer and self._lock is None:
            lock_path = Path(f"{self.path}.lock")
            lock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            lock = WriterLock(lock_path, str(self.path))
            lock.acquire()
            self._lock = lock
        writer = SQLiteWriter(self._connect, str(self.path), wal_path=f"{self.path}-wal")
        try:
            await writer.start()
        except (sqlite3.Error, OSError) as exc:
            raise JournalError(f"cannot open sqlite journal {self.path}: {exc}") from exc
        self._writer = writer
        self.recovery = RecoveryReport("sqlite", time.perf_counter() - started)

    async def aclose(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.stop()  # what is queued is committed (or failed) first
        lock, self._lock = self._lock, None
        if lock is not None:
            lock.release()
        self._signals.notify_all()

    # -- call records -----------------------------------------------------------------------------

    #: A claim answers a repeat as a read would: a transaction that changes nothing writes no WAL
    #: frame and syncs nothing. So the engine claims at once instead of reading first, and a
    #: miss is two trips to the writer thread instead of three. A repeat rides in the next batch,
    #: so under load it may wait for that batch's sync; repeats of a completed call are mostly
    #: answered from the engine's memory.
    claim_reads = True

    async def claim(self, record: CallRecord, now: float) -> tuple[bool, CallRecord]:
        identity = record.identity

        def body(conn: sqlite3.Connection) -> tuple[bool, CallRecord]:
            # One statement for a miss (the common case): the insert, or the replacement of an
            # expired record, in the upsert's WHERE; a live record is left alone and read after.
            if conn.execute(_CLAIM, (*_row(record), now)).rowcount == 1:
                return True, record
            row = conn.execute(_SELECT_ONE, (identity.principal, identity.tool, identity.key)).fetchone()
            return False, _record(row)

        won, result = await self._write(body)
        if won:
            self._signals.notify(identity)
        return won, result

    async def get(self, identity: CallIdentity) -> CallRecord | None:
        row = await self._run(
            lambda conn: conn.execute(_SELECT_ONE, (identity.principal, identity.tool, identity.key)).fetchone()
        )
        return None if row is None else _record(row)

    async def find_calls(self, tool: str, key: str) -> list[CallRecord]:
        rows = await self._run(lambda conn: conn.execute(_FIND, (tool, tool, tool, key)).fetchall())
        return [_record(row) for row in rows]

    async def get_task(self, principal: str, task_id: str) -> CallRecord | None:
        row = await self._run(
            lambda conn: conn.execute(
                f"SELECT {_COLUMNS} FROM calls WHERE principal=? AND task_id=?", (principal, task_id)
            ).fetchone()
        )
        return None if row is None else _record(row)

    async def swap(self, expected_version: int, record: CallRecord, expected_run_id: str | None = None) -> bool:
        i = record.identity

        def body(conn: sqlite3.Connection) -> bool:
            row = _row(record)
            # Most swaps keep `created_at` and `task_id`: leaving them out of the SET spares the
            # two indexes on them (SQLite rewrites the entries of every column SET, changed or
            # not), one 4 KiB WAL page of the three a completion wrote. A swap that changes them
            # (or loses its race) finds no row so and tries again with every column.
            expected = (i.principal, i.tool, i.key, expected_version, expected_run_id)
            keeping = (*row[3:8], *row[9:17], row[18], *expected, row[8], row[17])
            if conn.execute(_SWAP_KEEPING, keeping).rowcount == 1:
                return True
            return conn.execute(_SWAP, (*row[3:], *expected)).rowcount == 1

        swapped = await self._write(body)
        if swapped:
            self._signals.notify(i)
        return swapped

    async def renew(self, identity: CallIdentity, fence: Fence, lease_until: float) -> bool:
        def body(conn: sqlite3.Connection) -> bool:
            return conn.execute(_RENEW, (lease_until, *_held(identity, fence))).rowcount == 1

        return await self._write(body)

    async def append_step(
        self, identity: CallIdentity, fence: Fence, index: int, data: dict[str, Any], ts: float
    ) -> JournalEntry | None:
        data = step_data(index, data)
        process_id = step_process_id(fence.run_id)
        payload = orjson.dumps(data)

        def body(conn: sqlite3.Connection) -> int | None:
            # One statement in the batch's write transaction: no other process writes between the
            # fence check and the insert (the transaction holds the database's write lock), and
            # `entries_by_step` answers "that step is stored" across processes.
            cursor = conn.execute(_APPEND_STEP, (process_id, STEP, payload, ts, index, *_held(identity, fence)))
            seq = cursor.lastrowid
            if cursor.rowcount != 1 or seq is None:
                return None
            if seq % self.entry_fold == 0:
                fold_entries(conn, seq)
            return seq

        seq = await self._write(body)
        return None if seq is None else JournalEntry(process_id, STEP, data, ts, seq)

    async def wait_for_change(self, identity: CallIdentity, timeout: float) -> None:
        # Another process's change is seen by the caller's re-read after at most one poll interval.
        await self._signals.wait(identity, min(timeout, self._poll_interval))

    async def list_calls(self, query: CallQuery = RECENT_CALLS) -> list[CallRecord]:
        sql, args = self.listing(query)
        rows = await self._run(lambda conn: conn.execute(sql, args).fetchall())
        return [_record(row) for row in rows]

    @staticmethod
    def listing(query: CallQuery) -> tuple[str, list[Any]]:
        """The statement `list_calls(query)` runs, and its parameters.

        A listing of an open state reads `calls_open` (schema 5), named: without statistics the
        planner takes it for a listing of every principal's, but for one principal's it would
        rather read all of that principal's records (`calls_by_principal_created`) than its few
        open ones. Named, the plan cannot fall back to a walk over the table: a database without
        the index fails the query."""
        tail, args = listing_clause(query, "?")
        calls = f"calls INDEXED BY {OPEN_INDEX}" if query.state in OPEN_STATES else "calls"
        return f"SELECT {_COLUMNS} FROM {calls} {tail}", args

    async def purge_expired(self, now: float) -> int:
        def body(conn: sqlite3.Connection) -> int:
            return conn.execute("DELETE FROM calls WHERE expires_at IS NOT NULL AND expires_at <= ?", (now,)).rowcount

        return await self._write(body)

    async def purge_expired_calls(self, now: float, limit: int = 1000) -> PurgedCalls:
        def body(conn: sqlite3.Connection) -> PurgedCalls:
            # One write transaction: the records and their runs' steps go together.
            began = time.perf_counter()
            rows = conn.execute(_EXPIRED, (now, max(1, limit))).fetchall()
            if not rows:
                return PurgedCalls()
            conn.executemany("DELETE FROM calls WHERE rowid = ?", [(row[0],) for row in rows])
            processes = sorted({step_process_id(row[4]) for row in rows})
            steps = 0
            for start in range(0, len(processes), _IN_CHUNK):
                chunk = processes[start : start + _IN_CHUNK]
                marks = ", ".join("?" * len(chunk))
                steps += conn.execute(f"DELETE FROM entries WHERE process_id IN ({marks})", chunk).rowcount
            gone = tuple((CallIdentity(p, t, k), run) for _, p, t, k, run in rows)
            return PurgedCalls(gone, steps, held_s=time.perf_counter() - began)

        return await self._write(body)

    async def count_calls(self, query: CountQuery = ALL_CALLS) -> CallCounts:
        if query.ranged:
            # Named: without statistics, SQLite would rather walk the primary key (in GROUP BY
            # order) than read the range of an index on `created_at`.
            index = "calls_by_created" if query.principal is None else "calls_by_principal_created"
            calls = f"calls INDEXED BY {index}"
            sql, args = ranged_count_sql(query, "?", calls, lambda x: f"CAST({x} AS INTEGER)")
            rows = await self._run(lambda conn: conn.execute(sql, args).fetchall())
            return counts_of(rows)
        mine, args = ("AND principal = ? ", [query.principal]) if query.principal is not None else ("", [])

        def read(conn: sqlite3.Connection) -> CallCounts:
            # One read transaction: the kept counts and the oldest record of one moment.
            conn.execute("BEGIN")
            try:
                groups = conn.execute(COUNTED_GROUPS.format(mine=mine), args * 2).fetchall()
                where = "WHERE principal = ?" if query.principal is not None else ""
                oldest = _first(conn.execute(f"SELECT created_at FROM calls {where} {_OLDEST}", args))
            finally:
                conn.execute("COMMIT")
            return counts_of(groups, oldest)

        return await self._run(read)

    async def stats(self) -> JournalStats:
        def read(conn: sqlite3.Connection) -> JournalStats:
            conn.execute("BEGIN")
            try:
                groups = conn.execute(COUNTED_GROUPS.format(mine=""))
                counts = counts_of(groups.fetchall())
                (entries,) = conn.execute(ENTRY_TALLY).fetchone()
                oldest = _first(conn.execute(f"SELECT created_at FROM calls {_OLDEST}"))
            finally:
                conn.execute("COMMIT")
            size = sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*") if p.is_file())
            return JournalStats("sqlite", counts.by_state, counts.by_tool, entries, size, oldest)

        return await self._run(read)

    # -- process entries --------------------------------------------------------------------------

    async def append(self, process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> JournalEntry:
        payload = orjson.dumps(data)
        step = step_index(entry_type, data)

        def body(conn: sqlite3.Connection) -> int:
            if step is not None:
                cursor = conn.execute(_APPEND, (process_id, entry_type, payload, ts, step))
            else:
                cursor = conn.execute(
                    "INSERT INTO entries (process_id, entry_type, data, ts) VALUES (?, ?, ?, ?)",
                    (process_id, entry_type, payload, ts),
                )
            seq = cursor.lastrowid
            assert seq is not None
            if seq % self.entry_fold == 0:  # the entries' count, kept without a statement per row
                fold_entries(conn, seq)
            return seq

        counted = callers.direct_write()  # a writer appending in a loop need not wait for others
        try:
            seq = await self._write(body)
        finally:
            callers.direct_done(counted)
        return JournalEntry(process_id, entry_type, data, ts, seq)

    async def entries(
        self, *, process_id: str | None = None, after: int = 0, limit: int | None = None
    ) -> list[JournalEntry]:
        sql = "SELECT process_id, entry_type, data, ts, seq FROM entries WHERE seq > ?"
        args: list[Any] = [after]
        if process_id is not None:
            sql += " AND process_id = ?"
            args.append(process_id)
        sql += " ORDER BY seq LIMIT ?"
        args.append(-1 if limit is None else limit)
        rows = await self._run(lambda conn: conn.execute(sql, args).fetchall())
        return [_entry(r) for r in rows]

    async def purge_entries(self, process_ids: Collection[str], *, before_seq: int | None = None) -> int:
        names = list(process_ids)
        if not names:
            return 0

        def body(conn: sqlite3.Connection) -> int:
            marks = ", ".join("?" * len(names))
            sql = f"DELETE FROM entries WHERE process_id IN ({marks})"
            args: list[Any] = list(names)
            if before_seq is not None:
                sql += " AND seq < ?"
                args.append(before_seq)
            return conn.execute(sql, args).rowcount

        return await self._write(body)

    async def audit_entries(self, identity: CallIdentity) -> list[JournalEntry]:
        args = (*identity, AUDIT_ENTRY)
        rows = await self._run(lambda conn: conn.execute(_AUDITS, args).fetchall())
        return [_entry(row) for row in rows]

    async def last_checkpoint(self, process_id: str) -> JournalEntry | None:
        row = await self._run(
            lambda conn: conn.execute(
                "SELECT process_id, entry_type, data, ts, seq FROM entries WHERE process_id=? AND entry_type=? "
                "ORDER BY seq DESC LIMIT 1",
                (process_id, CHECKPOINT),
            ).fetchone()
        )
        return None if row is None else _entry(row)


#: The oldest record: the first of an index in `created_at` order (`calls_by_created`, or for a
#: principal `calls_by_principal_created`), one row read.
_OLDEST = "ORDER BY created_at LIMIT 1"


def _first(cursor: sqlite3.Cursor) -> Any:
    """The first column of a query's one row, or None without a row."""
    row = cursor.fetchone()
    return None if row is None else row[0]


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
