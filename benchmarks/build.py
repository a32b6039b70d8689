"""Building large journals for the recovery case, once, cached under a temp directory.

A journal of N call records (each COMPLETED, as the durable no-op leaves them) or N process
entries (context updates, a checkpoint every 1,000) is built through the journal's own API
with relaxed durability (`file://DIR?durability=relaxed`: no fsync) and many concurrent
writers, then closed cleanly (which writes its snapshot), or, for SQLite, by its bulk path:
`executemany` into the journal's own schema with its own row layout, in large transactions. A
finished build is marked `READY`; a half-built one is rebuilt.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import time
from pathlib import Path

import anyio
import orjson

from mcp_durable.journal import create_journal
from mcp_durable.journal.model import CallIdentity, CallRecord, CallState

BUILD_FORMAT = 1  # bump when what is built changes
PROCESS = "bench/worker"
TOOL = "noop"
CHECKPOINT_EVERY = 1000
RESULT = orjson.dumps(
    {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"result": "ok"}, "isError": False}
)
T0 = 1_780_000_000.0


def call_identity(i: int) -> CallIdentity:
    """The identity of the i-th built record: a derived key, as the no-op tool's calls get."""
    return CallIdentity("local", TOOL, "sha256:" + hashlib.sha256(b'{"n":%d}' % i).hexdigest())


def call_record(i: int) -> CallRecord:
    identity = call_identity(i)
    created = T0 + i * 0.001
    return CallRecord(
        identity=identity,
        fingerprint=identity.key[7:],
        state=CallState.COMPLETED,
        version=2,
        run_id=hashlib.md5(identity.key.encode()).hexdigest(),
        attempts=1,
        created_at=created,
        updated_at=created,
        completed_at=created,
        expires_at=None,
        result=RESULT,
        arguments=b'{"n":%d}' % i,
    )


def entry(i: int) -> tuple[str, dict[str, object]]:
    """The i-th process entry (1-based): a context update, or every 1,000th a checkpoint."""
    context = {"step": i, "order_id": f"O-{i:08d}", "note": "refund issued; provider reference attached"}
    if i % CHECKPOINT_EVERY == 0:
        return "checkpoint", {"context_state": context, "lifecycle_state": "running"}
    return "context_update", context


def format_tag(backend: str) -> str:
    tag = f"b{BUILD_FORMAT}"
    if backend == "file":
        try:
            from mcp_durable.journal.file import segments, snapshot

            # The snapshot's format too: a journal cached with an earlier one would be measured
            # converting it (its first open), not opening.
            tag += f"-f{segments.FORMAT}-s{snapshot.FORMAT}"
        except (ImportError, AttributeError):
            pass
    return tag


def journal_url(backend: str, root: Path) -> str:
    return f"file://{root}/file" if backend == "file" else f"sqlite:///{root}/journal.db"


async def ensure(backend: str, kind: str, count: int, cache: Path) -> tuple[str, float | None]:
    """The URL of a journal holding `count` records of `kind`, and the seconds a build took
    (None when it came from the cache)."""
    root = cache / f"{backend}-{kind}-{count}-{format_tag(backend)}"
    if (root / "READY").exists():
        return journal_url(backend, root), None
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    began = time.perf_counter()
    if backend == "sqlite":
        await _build_sqlite(root, kind, count)
    else:
        # Relaxed durability (no fsync) while building: the build is not what is measured.
        await _build_api(journal_url(backend, root) + "?durability=relaxed", kind, count)
    (root / "READY").write_text(f"{count} {kind}\n")
    return journal_url(backend, root), time.perf_counter() - began


def discard(backend: str, kind: str, count: int, cache: Path) -> None:
    shutil.rmtree(cache / f"{backend}-{kind}-{count}-{format_tag(backend)}", ignore_errors=True)


async def _build_api(url: str, kind: str, count: int, writers: int = 256) -> None:
    journal = create_journal(url)
    await journal.open()
    next_index = 0
    try:

        async def writer() -> None:
            nonlocal next_index
            while next_index < count:
                i = next_index
                next_index += 1
                if kind == "calls":
                    await journal.claim(call_record(i), T0)
                else:
                    # Concurrent appends land in about index order; recovery does not depend on it.
                    entry_type, data = entry(i + 1)
                    await journal.append(PROCESS, entry_type, data, T0 + i * 0.001)

        async with anyio.create_task_group() as group:
            for _ in range(writers):
                group.start_soon(writer)
    finally:
        await journal.aclose()


async def _build_sqlite(root: Path, kind: str, count: int) -> None:
    url = journal_url("sqlite", root)
    journal = create_journal(url)  # creates the schema, exactly as the journal does
    await journal.open()
    await journal.aclose()
    await anyio.to_thread.run_sync(_fill_sqlite, root / "journal.db", kind, count)


def _fill_sqlite(path: Path, kind: str, count: int, batch: int = 50_000) -> None:
    from mcp_durable.journal.sqlite import _COLUMNS, _PLACEHOLDERS, _row
    from mcp_durable.journal.sqlite_schema import fold_entries

    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        for start in range(0, count, batch):
            stop = min(count, start + batch)
            conn.execute("BEGIN")
            if kind == "calls":
                conn.executemany(
                    f"INSERT INTO calls ({_COLUMNS}) VALUES ({_PLACEHOLDERS})",
                    (_row(call_record(i)) for i in range(start, stop)),
                )
            else:
                conn.executemany(
                    "INSERT INTO entries (process_id, entry_type, data, ts) VALUES (?, ?, ?, ?)",
                    ((PROCESS, *_entry_row(i + 1)) for i in range(start, stop)),
                )
            conn.execute("COMMIT")
        if kind != "calls" and count:  # count the entries once, as the journal's appends would have
            conn.execute("BEGIN IMMEDIATE")
            fold_entries(conn, conn.execute("SELECT max(seq) FROM entries").fetchone()[0])
            conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def _entry_row(i: int) -> tuple[str, bytes, float]:
    entry_type, data = entry(i)
    return entry_type, orjson.dumps(data), T0 + i * 0.001
