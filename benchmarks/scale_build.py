"""Journals of N call records for the scale case (case 12), built once and cached.

What a journal of N records holds (`scale_record(i, n)`, the same on every backend):

- four principals: `local` 40 % (tool `noop`, the key derived from `{"n": i}` exactly as the
  benchmark server derives it, so a call of `noop(n=i)` replays the stored record), `alice`
  30 %, `bob` 20 %, `carol` 10 % (tools `refund`, `lookup`, `send_email`, caller keys);
- mostly COMPLETED, 1 % FAILED, 0.5 % RELEASED, 1 % of the calls MCP tasks (completed);
- a constant few open records whatever N: `OPEN_PENDING` PENDING and `OPEN_IN_DOUBT` IN_DOUBT
  tasks of `bob`'s tool `report` (no benchmark server has it: the task watch reads them and
  leaves them be), spread over the journal;
- created one every `SPACING_S` seconds up to `T_END` (a server that has served at a constant
  rate: the last hour holds the same number of records at every N); every record expires
  `KEPT_S` after its creation, so a retention pass finds nothing to delete.

Built with relaxed durability through each journal's bulk path: the file journal through
`claim` from many concurrent writers (group commit, no fsync), SQLite by `executemany` into the
journal's own schema and row layout (`sql_rows.call_row`; its triggers keep the counts), and
Postgres by `COPY` into the journal's own table (its kept counts written once after the copies,
as the journal keeps them). A finished build is marked `READY` (Postgres: a table `scale_ready`
in its schema); a half-built one is rebuilt. The cache lives in `Settings.cache_dir`
(`$MCP_DURABLE_BENCH_CACHE`, default `<tmp>/mcp-durable-bench-cache`), Postgres builds in
schemas `scale_<N>_<tag>` of the benchmark database, which `cleanup_postgres` does not drop.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import orjson

from mcp_durable.journal import create_journal
from mcp_durable.journal.base import OPEN_STATES
from mcp_durable.journal.model import CallIdentity, CallRecord, CallState, Reason
from mcp_durable.journal.sql_rows import CALL_COLUMNS, call_row

from .build import format_tag as file_format_tag
from .common import PG_BASE

BUILD_FORMAT = 1  # bump when what is built changes
T_END = 1_796_000_000.0  # 2026-11-30 UTC: the newest built record
SPACING_S = 3.6  # 1,000 records an hour
KEPT_S = 5 * 365 * 86400.0  # none expires while the cache is in use
OPEN_PENDING = 10
OPEN_IN_DOUBT = 10
#: Principals by `i % 10`: local 0-3, alice 4-6, bob 7-8, carol 9.
PRINCIPAL_BY_DIGIT = ("local",) * 4 + ("alice",) * 3 + ("bob",) * 2 + ("carol",)
OTHER_TOOLS = ("refund", "lookup", "send_email")
NOOP = "noop"
OPEN_TOOL = "report"
RESULT = orjson.dumps(
    {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"result": "ok"}, "isError": False}
)
FAILED_RESULT = orjson.dumps({"content": [{"type": "text", "text": "card declined"}], "isError": True})


def created_at(i: int, n: int) -> float:
    return T_END - (n - 1 - i) * SPACING_S


def noop_key(i: int) -> str:
    """The key the benchmark server derives for `noop(n=i)` (`keys.policy_fingerprint`)."""
    return "sha256:" + hashlib.sha256(b'{"n":%d}' % i).hexdigest()


def open_slots(n: int) -> dict[int, CallState]:
    """Which indexes hold the open records, spread over the journal (none on a replay target)."""
    count = OPEN_PENDING + OPEN_IN_DOUBT
    slots: dict[int, CallState] = {}
    for k in range(count):
        i = (n * k // count) // 10 * 10 + 7  # digit 7: a `bob` index, never `local`'s
        slots[min(i, n - 3)] = CallState.PENDING if k < OPEN_PENDING else CallState.IN_DOUBT
    return slots


def is_replay_target(i: int) -> bool:
    """A `local` `noop` record that is COMPLETED (`scale_record`): a call of `noop(n=i)` replays it."""
    return i % 10 == 2 and i % 100 not in (11, 13)


def scale_record(i: int, n: int, open_state: CallState | None = None) -> CallRecord:
    """The i-th record of a journal of `n` (`open_state`: one of the open records, `open_slots`)."""
    principal = PRINCIPAL_BY_DIGIT[i % 10]
    created = created_at(i, n)
    if principal == "local":
        tool, key, arguments = NOOP, noop_key(i), b'{"n":%d}' % i
        fingerprint = key[7:]
    else:
        tool, key = OTHER_TOOLS[(i // 10) % 3], f"order-{i:09d}"
        arguments = b'{"amount":%d,"order_id":"O-%09d"}' % (i % 9973, i)
        fingerprint = hashlib.sha256(arguments).hexdigest()
    run_id = hashlib.md5(b"%d/%d" % (n, i)).hexdigest()
    done = created + 0.05
    if open_state is not None:
        lease = created + 30.0  # long run out: the owner is gone
        pending = open_state is CallState.PENDING
        return CallRecord(
            CallIdentity("bob", OPEN_TOOL, f"report-{i:09d}"),
            fingerprint,
            open_state,
            1 if pending else 2,
            run_id,
            1,
            created,
            created if pending else lease,
            owner="bench-builder" if pending else None,
            lease_until=lease if pending else None,
            expires_at=created + KEPT_S,
            arguments=arguments,
            task_id=f"task-{run_id}",
            reason=None if pending else Reason.LOST_OWNER,
        )
    state, error, reason = CallState.COMPLETED, None, None
    result: bytes | None = RESULT
    if i % 100 == 11:
        state, result = CallState.FAILED, FAILED_RESULT
    elif i % 200 == 13:
        state, result, error, reason = CallState.RELEASED, None, "ValueError: bad input", Reason.EXCEPTION
    return CallRecord(
        CallIdentity(principal, tool, key),
        fingerprint,
        state,
        2,
        run_id,
        1,
        created,
        done,
        completed_at=done if result is not None else None,
        expires_at=created + KEPT_S,
        result=result,
        error=error,
        arguments=arguments,
        task_id=f"task-{run_id}" if i % 100 == 17 else None,
        reason=reason,
    )


def scale_records(n: int, start: int = 0, stop: int | None = None) -> Iterator[CallRecord]:
    opened = open_slots(n)
    for i in range(start, n if stop is None else stop):
        yield scale_record(i, n, opened.get(i))


# -- the cache ----------------------------------------------------------------------------------------


def tag(backend: str) -> str:
    return f"s{BUILD_FORMAT}-" + file_format_tag(backend)


def _root(backend: str, count: int, cache: Path) -> Path:
    return cache / f"scale-{backend}-{count}-{tag(backend)}"


def postgres_schema(count: int) -> str:
    return f"scale_{count}_{tag('postgres').replace('-', '_')}"


def journal_url(backend: str, count: int, cache: Path) -> str:
    if backend == "file":
        return f"file://{_root(backend, count, cache)}/file"
    if backend == "sqlite":
        return f"sqlite:///{_root(backend, count, cache)}/journal.db"
    return f"{PG_BASE}?schema={postgres_schema(count)}"


async def ensure(backend: str, count: int, cache: Path) -> tuple[str, float | None]:
    """The URL of a journal of `count` records (`scale_record`) on `backend`, and the seconds the
    build took (None: it came from the cache)."""
    url = journal_url(backend, count, cache)
    if backend == "postgres":
        if await anyio.to_thread.run_sync(_pg_ready, count):
            return url, None
    elif (_root(backend, count, cache) / "READY").exists():
        return url, None
    began = time.perf_counter()
    if backend == "file":
        root = _root(backend, count, cache)
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        await _build_file(url + "?durability=relaxed", count)
        (root / "READY").write_text(f"{count} calls\n")
    elif backend == "sqlite":
        root = _root(backend, count, cache)
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        await _build_sqlite(url, root / "journal.db", count)
        (root / "READY").write_text(f"{count} calls\n")
    else:
        await _build_postgres(url, count)
    return url, time.perf_counter() - began


async def _build_file(url: str, count: int, writers: int = 256) -> None:
    journal = create_journal(url)
    await journal.open()
    records = scale_records(count)
    try:

        async def writer() -> None:
            for record in records:  # one shared iterator: each record claimed once
                await journal.claim(record, float("-inf"))

        async with anyio.create_task_group() as group:
            for _ in range(writers):
                group.start_soon(writer)
    finally:
        await journal.aclose()


async def _build_sqlite(url: str, path: Path, count: int) -> None:
    journal = create_journal(url)  # creates the schema, exactly as the journal does
    await journal.open()
    await journal.aclose()
    await anyio.to_thread.run_sync(_fill_sqlite, path, count)


def _fill_sqlite(path: Path, count: int, batch: int = 50_000) -> None:
    placeholders = ", ".join("?" * len(CALL_COLUMNS.split(", ")))
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA cache_size=-1000000")  # 1 GB: the primary key's pages stay cached
        for start in range(0, count, batch):
            conn.execute("BEGIN")
            conn.executemany(
                f"INSERT INTO calls ({CALL_COLUMNS}) VALUES ({placeholders})",
                (call_row(r) for r in scale_records(count, start, min(count, start + batch))),
            )
            conn.execute("COMMIT")
        # No ANALYZE: the journal never runs one, so its planner works without statistics here too.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _pg_ready(count: int) -> bool:
    import psycopg

    schema = postgres_schema(count)
    with psycopg.connect(PG_BASE, connect_timeout=5) as conn:
        found = conn.execute(
            "SELECT 1 FROM information_schema.tables WHERE table_schema = %s AND table_name = 'scale_ready'",
            (schema,),
        ).fetchone()
    return found is not None


async def _build_postgres(url: str, count: int) -> None:
    import psycopg

    schema = postgres_schema(count)
    with psycopg.connect(PG_BASE, connect_timeout=5, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    journal = create_journal(url)  # the schema, migrated exactly as the journal does
    await journal.open()
    await journal.aclose()
    await anyio.to_thread.run_sync(_fill_postgres, schema, count)


def _fill_postgres(schema: str, count: int, batch: int = 100_000) -> None:
    import psycopg

    with psycopg.connect(PG_BASE, connect_timeout=5) as conn:
        conn.execute("SET synchronous_commit = off")
        # The row trigger that counts final records inserted by any session (an import; migration
        # 7) would run one upsert per copied row: the build's counts are written once at the end
        # instead, as the journal keeps them (shard 0, final states only). The trigger is
        # enabled again in the same transaction as those counts; a build cut before is rebuilt.
        conn.execute(f'ALTER TABLE "{schema}".calls DISABLE TRIGGER calls_counted_insert')
        conn.commit()
        for start in range(0, count, batch):
            with conn.cursor() as cursor, cursor.copy(f'COPY "{schema}".calls ({CALL_COLUMNS}) FROM STDIN') as copy:
                for record in scale_records(count, start, min(count, start + batch)):
                    copy.write_row(call_row(record))
            conn.commit()
        final = [state.value for state in CallState if state not in OPEN_STATES]
        conn.execute(
            f'INSERT INTO "{schema}".call_counts (principal, tool, state, shard, n) '
            f'SELECT principal, tool, state, 0, count(*) FROM "{schema}".calls WHERE state = ANY(%s) '
            "GROUP BY principal, tool, state",
            (final,),
        )
        conn.execute(f'ALTER TABLE "{schema}".calls ENABLE TRIGGER calls_counted_insert')
        conn.commit()
    with psycopg.connect(PG_BASE, connect_timeout=5, autocommit=True) as conn:
        conn.execute(f'VACUUM ANALYZE "{schema}".calls')
        conn.execute(f'CREATE TABLE "{schema}".scale_ready (n bigint NOT NULL)')
        conn.execute(f'INSERT INTO "{schema}".scale_ready VALUES (%s)', (count,))
