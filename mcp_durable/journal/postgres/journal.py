"""`postgresql://…`: one journal shared by several server replicas on several hosts.

- **Claim in one statement**: `INSERT … ON CONFLICT (principal, tool, key) DO UPDATE … WHERE
  calls.expires_at <= now`, in a CTE that also reads the existing row, so the usual claim or
  repeat is one round trip. Postgres's unique index makes it atomic across replicas.
- **swap / renew** are `UPDATE … WHERE version = expected` (resp. `state = 'pending' AND
  owner = …`): compare-and-set in the database.
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
  reconnects by itself when it is back.
- `single_writer = False`: a PENDING record of another replica is in doubt only once its
  lease has expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import orjson
import psycopg
import psycopg_pool
from psycopg.conninfo import conninfo_to_dict

from ...errors import JournalError
from ..base import (
    CHECKPOINT,
    SQL_LISTING_ORDER,
    CallCursor,
    ChangeSignals,
    RecoveryReport,
    sql_listing_filter,
    stored_decoder,
)
from ..model import CallIdentity, CallRecord, CallState, JournalEntry, JournalStats
from ..secrets import display_url
from .listener import Listener
from .schema import migrate, quote_ident
from .settings import PostgresSettings

Row = tuple[Any, ...]

_COLUMNS = (
    "principal, tool, key, fingerprint, state, version, run_id, attempts, created_at, updated_at, "
    "owner, lease_until, completed_at, expires_at, result, error, arguments, task_id"
)
_MUTABLE = [c.strip() for c in _COLUMNS.split(",")][3:]
_IDENTITY = "principal = %s AND tool = %s AND key = %s"


def _params(record: CallRecord) -> tuple[Any, ...]:
    i = record.identity
    return (
        i.principal, i.tool, i.key, record.fingerprint, record.state.value, record.version, record.run_id,
        record.attempts, record.created_at, record.updated_at, record.owner, record.lease_until,
        record.completed_at, record.expires_at, record.result, record.error, record.arguments, record.task_id,
    )  # fmt: skip


@stored_decoder("call record")
def _record(row: Row) -> CallRecord:
    return CallRecord(
        identity=CallIdentity(row[0], row[1], row[2]), fingerprint=row[3], state=CallState(row[4]),
        version=row[5], run_id=row[6], attempts=row[7], created_at=row[8], updated_at=row[9],
        owner=row[10], lease_until=row[11], completed_at=row[12], expires_at=row[13],
        result=None if row[14] is None else bytes(row[14]), error=row[15],
        arguments=None if row[16] is None else bytes(row[16]), task_id=row[17],
    )  # fmt: skip


@stored_decoder("process entry")
def _entry(row: Row) -> JournalEntry:
    return JournalEntry(row[0], row[1], orjson.loads(row[2]), row[3], row[4])


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
        placeholders = ", ".join(["%s"] * 18)
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _MUTABLE) + ", watched = false"
        # The claim: insert, or replace an expired record; else return the record that stands.
        # The second branch reads with the statement's snapshot, so a row committed by a
        # concurrent claim after that snapshot is not seen there: `claim` re-reads then.
        self._claim_sql = (
            f"WITH claimed AS (INSERT INTO {self._calls} ({_COLUMNS}) VALUES ({placeholders}) "
            f"ON CONFLICT (principal, tool, key) DO UPDATE SET {updates} "
            f"WHERE {self._calls}.expires_at IS NOT NULL AND {self._calls}.expires_at <= %s "
            f"RETURNING {_COLUMNS}, watched) "
            f"SELECT true, {_COLUMNS}, watched FROM claimed UNION ALL "
            f"SELECT false, {_COLUMNS}, watched FROM {self._calls} WHERE {_IDENTITY} "
            "AND NOT EXISTS (SELECT 1 FROM claimed)"
        )
        self._get_sql = f"SELECT {_COLUMNS}, watched FROM {self._calls} WHERE {_IDENTITY}"
        self._watch_sql = f"UPDATE {self._calls} SET watched = true WHERE {_IDENTITY} AND version = %s"
        sets = ", ".join(f"{c} = %s" for c in _MUTABLE)
        self._swap_sql = f"UPDATE {self._calls} SET {sets} WHERE {_IDENTITY} AND version = %s"

    @classmethod
    def from_url(cls, url: str) -> PostgresJournal:
        return cls(PostgresSettings.from_url(url), url=url)

    # -- plumbing ---------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Row]]:
        """A pooled connection; every driver failure becomes `JournalError` (cause attached)."""
        pool = self._pool
        if pool is None:
            raise JournalError(f"journal {self.settings.schema!r} is not open")
        try:
            async with pool.connection() as conn:
                yield conn
        except psycopg_pool.PoolTimeout as exc:
            self._check_pool()
            raise JournalError(
                f"postgres journal unavailable: no connection within {self.settings.pool_timeout:g}s"
            ) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError, OSError) as exc:
            self._check_pool()
            raise JournalError(f"postgres journal unavailable: {display_url(str(exc))}") from exc
        except psycopg.Error as exc:
            raise JournalError(f"postgres journal error: {display_url(str(exc))}") from exc

    def _check_pool(self) -> None:
        # After a lost connection the other idle ones are likely dead too (a database restart):
        # test them all in the background, so they fail here rather than in later calls.
        if self._pool is None or (self._check_task is not None and not self._check_task.done()):
            return

        async def check(pool: psycopg_pool.AsyncConnectionPool[Any]) -> None:
            with contextlib.suppress(Exception):  # best effort; the next call reports the failure
                await pool.check()

        self._check_task = asyncio.get_running_loop().create_task(check(self._pool))

    async def _fetchone(self, sql: str, params: tuple[Any, ...]) -> Row | None:
        async with self._connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchone()

    async def _fetchall(self, sql: str, params: tuple[Any, ...] | list[Any] = ()) -> list[Row]:
        async with self._connection() as conn:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()

    async def _rowcount(self, sql: str, params: tuple[Any, ...]) -> int:
        async with self._connection() as conn:
            cur = await conn.execute(sql, params)
            return cur.rowcount

    # -- lifecycle --------------------------------------------------------------------------------

    async def open(self) -> None:
        """Open the pool, migrate the schema, start listening. Raises `JournalError` if unreachable."""
        if self._pool is not None:
            return
        started = time.perf_counter()
        s = self.settings
        # Our statement_timeout joins any `options` the URL gives (kwargs would replace them).
        given = conninfo_to_dict(s.conninfo).get("options") or ""
        options = f"{given} -c statement_timeout={int(s.statement_timeout * 1000)}".strip()
        pool: psycopg_pool.AsyncConnectionPool[psycopg.AsyncConnection[Row]] = psycopg_pool.AsyncConnectionPool(
            s.conninfo, min_size=s.pool_min, max_size=s.pool_max, timeout=s.pool_timeout, open=False,
            # Give up a failing reconnection after a second instead of backing off for minutes:
            # the next call that needs a connection starts a fresh attempt at once, so the
            # pool is back within about a second of the database.
            reconnect_timeout=1.0,
            kwargs={"autocommit": True, "options": options},
            name=f"mcp-durable/{s.schema}",
        )  # fmt: skip
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
        self._listener = Listener(s.conninfo, s.channel, self._on_notify, self._on_listen_state)
        self._listener.start()
        # Not fatal if slow: waiters poll until the LISTEN is up.
        await self._listener.wait_connected(s.pool_timeout)
        self.migrations_applied = applied
        self.recovery = RecoveryReport("postgres", time.perf_counter() - started)

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        listener, self._listener = self._listener, None
        if self._check_task is not None:
            self._check_task.cancel()
            self._check_task = None
        if listener is not None:
            await listener.aclose()
        if pool is not None:
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
                marked = await self._rowcount(self._watch_sql, (identity.principal, identity.tool, identity.key,
                                                                seen[0]))  # fmt: skip
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

    async def claim(self, record: CallRecord, now: float) -> tuple[bool, CallRecord]:
        i = record.identity
        while True:
            self._note_read_started(i)
            rows = await self._fetchall(self._claim_sql, (*_params(record), now, i.principal, i.tool, i.key))
            if rows and rows[0][0]:
                self._signals.notify(i)
                return True, record
            if rows:
                existing = _record(rows[0][1:])
                self._note_read(existing, bool(rows[0][19]))
                return False, existing
            # Lost to a claim committed after this statement's snapshot: read it now.
            current = await self.get(i)
            if current is not None:
                return False, current
            # … and it was purged meanwhile: claim again.

    async def get(self, identity: CallIdentity) -> CallRecord | None:
        self._note_read_started(identity)
        row = await self._fetchone(self._get_sql, (identity.principal, identity.tool, identity.key))
        if row is None:
            return None
        record = _record(row)
        self._note_read(record, bool(row[18]))
        return record

    async def get_task(self, principal: str, task_id: str) -> CallRecord | None:
        row = await self._fetchone(
            f"SELECT {_COLUMNS} FROM {self._calls} WHERE principal = %s AND task_id = %s", (principal, task_id)
        )
        return None if row is None else _record(row)

    async def swap(self, expected_version: int, record: CallRecord) -> bool:
        i = record.identity
        swapped = await self._rowcount(self._swap_sql, (*_params(record)[3:], i.principal, i.tool, i.key,
                                                         expected_version)) == 1  # fmt: skip
        if swapped:
            self._signals.notify(i)
        return swapped

    async def renew(self, identity: CallIdentity, owner: str, lease_until: float) -> bool:
        count = await self._rowcount(
            f"UPDATE {self._calls} SET lease_until = %s WHERE {_IDENTITY} AND state = %s AND owner = %s",
            (lease_until, identity.principal, identity.tool, identity.key, CallState.PENDING.value, owner),
        )
        return count == 1

    async def list_calls(
        self,
        *,
        principal: str | None = None,
        tool: str | None = None,
        state: CallState | None = None,
        limit: int = 100,
        cursor: CallCursor | None = None,
        tasks_only: bool = False,
    ) -> list[CallRecord]:
        where, args = sql_listing_filter(principal=principal, tool=tool, state=state, cursor=cursor,
                                         placeholder="%s", tasks_only=tasks_only)  # fmt: skip
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM {self._calls} {where} {SQL_LISTING_ORDER} LIMIT %s", (*args, max(0, limit))
        )
        return [_record(row) for row in rows]

    async def purge_expired(self, now: float) -> int:
        return await self._rowcount(
            f"DELETE FROM {self._calls} WHERE expires_at IS NOT NULL AND expires_at <= %s", (now,)
        )

    async def stats(self) -> JournalStats:
        async with self._connection() as conn:
            cur = await conn.execute(f"SELECT state, count(*) FROM {self._calls} GROUP BY state")
            by_state = await cur.fetchall()
            cur = await conn.execute(f"SELECT tool, count(*) FROM {self._calls} GROUP BY tool")
            by_tool = await cur.fetchall()
            cur = await conn.execute(
                f"SELECT (SELECT count(*) FROM {self._entries}), (SELECT min(created_at) FROM {self._calls}), "
                "pg_total_relation_size(%s) + pg_total_relation_size(%s)",
                (self._calls, self._entries),
            )
            row = await cur.fetchone()
        assert row is not None
        return JournalStats("postgres", {k: int(v) for k, v in by_state}, {k: int(v) for k, v in by_tool},
                            int(row[0]), int(row[2]), row[1])  # fmt: skip

    # -- process entries --------------------------------------------------------------------------

    async def append(self, process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> JournalEntry:
        # One lock around the insert, held to commit: `seq` order is commit order, so a reader
        # tailing `entries(after=seq)` never skips an entry committed late with a smaller seq.
        row = await self._fetchone(
            f"WITH l AS (SELECT pg_advisory_xact_lock(hashtext(%s))) "
            f"INSERT INTO {self._entries} (process_id, entry_type, data, ts) "
            "SELECT %s, %s, %s::json, %s FROM l RETURNING seq",
            (f"mcp_durable.entries.{self.settings.schema}", process_id, entry_type, orjson.dumps(data).decode(), ts),
        )
        assert row is not None
        return JournalEntry(process_id, entry_type, data, ts, int(row[0]))

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

    async def last_checkpoint(self, process_id: str) -> JournalEntry | None:
        row = await self._fetchone(
            f"SELECT process_id, entry_type, data::text, ts, seq FROM {self._entries} "
            "WHERE process_id = %s AND entry_type = %s ORDER BY seq DESC LIMIT 1",
            (process_id, CHECKPOINT),
        )
        return None if row is None else _entry(row)
