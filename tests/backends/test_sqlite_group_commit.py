"""The SQLite journal's group commit: many calls per transaction, each call still atomic alone.

Real SQLite files throughout; the other process is a real second connection holding the write
lock, as another server process on the same database would.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallRecord, CallState
from mcp_durable.journal.sqlite import SQLiteJournal
from mcp_durable.journal.sqlite_writer import SQLiteWriter

T0 = 1_700_000_000.0


def pending(key: str, owner: str = "A") -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner=owner,
        lease_until=T0 + 30,
        arguments=b'{"a":1}',
    )


async def test_concurrent_claims_and_completions_share_transactions(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    try:
        assert journal._writer is not None
        before = journal._writer.batches

        async def call(i: int) -> None:
            won, record = await journal.claim(pending(f"k{i}"), T0)
            assert won
            done = record.evolve(state=CallState.COMPLETED, result=b"{}", owner=None, lease_until=None)
            assert await journal.swap(1, done)

        async with anyio.create_task_group() as group:
            for i in range(64):
                group.start_soon(call, i)
        batches = journal._writer.batches - before
        # 128 writes; one transaction each would be 128 commits (and 128 fsyncs).
        assert batches < 64, batches
        for i in range(64):
            stored = await journal.get(CallIdentity("local", "refund", f"k{i}"))
            assert stored is not None and stored.state == CallState.COMPLETED and stored.version == 2
    finally:
        await journal.aclose()


async def test_one_failing_call_in_a_batch_leaves_the_others_committed(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    writer = journal._writer
    assert writer is not None

    def breaks_after_writing(conn: sqlite3.Connection) -> None:
        # Writes, then fails: its savepoint must take its row away again, and only its row.
        conn.execute("INSERT INTO meta VALUES ('half', 'written')")
        conn.execute("INSERT INTO meta VALUES ('schema_version', 'duplicate')")  # primary key: IntegrityError

    outcomes: dict[str, object] = {}

    async def claim(key: str) -> None:
        outcomes[key] = await journal.claim(pending(key), T0)

    async def broken() -> None:
        try:
            await writer.write(breaks_after_writing)
        except sqlite3.IntegrityError as exc:
            outcomes["broken"] = exc

    try:
        batches = writer.batches
        async with anyio.create_task_group() as group:
            group.start_soon(claim, "a")
            group.start_soon(broken)
            group.start_soon(claim, "b")
        assert writer.batches == batches + 1  # the three went in one transaction
        assert isinstance(outcomes["broken"], sqlite3.IntegrityError)
        assert outcomes["a"] == (True, pending("a")) and outcomes["b"] == (True, pending("b"))
        assert await journal.get(CallIdentity("local", "refund", "a")) == pending("a")
        assert await journal.get(CallIdentity("local", "refund", "b")) == pending("b")
        half = await journal._run(lambda conn: conn.execute("SELECT value FROM meta WHERE name='half'").fetchone())
        assert half is None
    finally:
        await journal.aclose()


async def test_of_two_claims_of_one_identity_in_a_batch_the_loser_sees_the_winner(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    try:
        assert journal._writer is not None
        batches = journal._writer.batches
        results: dict[str, tuple[bool, CallRecord]] = {}

        async def claim(owner: str) -> None:
            results[owner] = await journal.claim(pending("same", owner), T0)

        async with anyio.create_task_group() as group:
            for owner in "ABCD":
                group.start_soon(claim, owner)
        assert journal._writer.batches == batches + 1
        winners = [owner for owner, (won, _) in results.items() if won]
        assert len(winners) == 1
        assert all(record.owner == winners[0] for _, record in results.values())
    finally:
        await journal.aclose()


async def test_a_batch_that_cannot_commit_fails_every_call_and_writes_none(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = SQLiteJournal(path, busy_timeout=0.3)
    await journal.open()
    other = sqlite3.connect(path, isolation_level=None)  # another process's connection
    try:
        won, first = await journal.claim(pending("first"), T0)
        assert won
        other.execute("BEGIN IMMEDIATE")  # holds the write lock past our busy timeout
        errors: list[JournalError] = []

        async def call(coro_fn: Callable[..., Awaitable[object]], *args: object) -> None:
            try:
                await coro_fn(*args)
            except JournalError as exc:
                errors.append(exc)

        done = first.evolve(state=CallState.COMPLETED, result=b"{}")
        async with anyio.create_task_group() as group:
            for i in range(5):
                group.start_soon(call, journal.claim, pending(f"k{i}"), T0)
            group.start_soon(call, journal.swap, 1, done)
            group.start_soon(call, journal.renew, first.identity, "A", T0 + 99)
        assert len(errors) == 7 and all(e.code == "journal_unavailable" for e in errors)
        other.execute("ROLLBACK")
        for i in range(5):
            assert await journal.get(CallIdentity("local", "refund", f"k{i}")) is None
        assert await journal.get(first.identity) == first  # neither swapped nor renewed
        # The journal works again once the lock is free.
        assert (await journal.claim(pending("k0"), T0))[0]
    finally:
        other.close()
        await journal.aclose()


async def test_calls_after_close_are_refused_with_journal_unavailable(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    await journal.aclose()
    with pytest.raises(JournalError):
        await journal.claim(pending("k"), T0)


async def test_a_claim_that_finds_a_record_writes_nothing(tmp_path: Path) -> None:
    # The engine claims without reading first on SQLite (`claim_reads`): a repeat must cost what
    # a read does, no WAL frame (and so no sync).
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    try:
        assert journal.claim_reads
        won, first = await journal.claim(pending("k"), T0)
        assert won
        # Another connection's `data_version` changes with every commit that wrote a frame (the
        # WAL's size cannot tell: the writer extends it with zeros ahead of SQLite).
        other = sqlite3.connect(tmp_path / "j.db", isolation_level=None)
        version = other.execute("PRAGMA data_version").fetchone()[0]
        for owner in "BCDE":
            assert await journal.claim(pending("k", owner), T0) == (False, first)
        assert other.execute("PRAGMA data_version").fetchone()[0] == version
        assert (await journal.claim(pending("k2"), T0))[0]  # and a claim that writes does change it
        assert other.execute("PRAGMA data_version").fetchone()[0] != version
        other.close()
    finally:
        await journal.aclose()


async def test_calls_made_as_the_journal_closes_are_answered_never_left_waiting(tmp_path: Path) -> None:
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    outcomes: dict[int, object] = {}

    async def claim(i: int) -> None:
        try:
            outcomes[i] = await journal.claim(pending(f"k{i}"), T0)
        except JournalError as exc:
            outcomes[i] = exc

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for i in range(20):
                group.start_soon(claim, i)
            group.start_soon(journal.aclose)  # in the same turn as the claims: gathered, not sent
    assert len(outcomes) == 20
    reopened = SQLiteJournal(tmp_path / "j.db")
    await reopened.open()
    try:
        for i, outcome in outcomes.items():
            if isinstance(outcome, tuple):  # answered as claimed: it is there
                assert await reopened.get(pending(f"k{i}").identity) is not None
    finally:
        await reopened.aclose()


@pytest.fixture
async def fast_writer_journal(tmp_path: Path) -> AsyncIterator[tuple[SQLiteJournal, SQLiteWriter]]:
    """An open journal whose idle writer has seen fast commits (as on a quiet disk): its next
    lone write is eligible to commit inline, on the event loop's thread."""
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    writer = journal._writer
    assert writer is not None
    writer.commit_s = 0.0
    try:
        yield journal, writer
    finally:
        await journal.aclose()


async def test_a_lone_write_on_an_idle_writer_commits_inline_and_durably(
    tmp_path: Path, fast_writer_journal: tuple[SQLiteJournal, SQLiteWriter]
) -> None:
    journal, writer = fast_writer_journal
    inline = writer.inline_batches
    won, record = await journal.claim(pending("alone"), T0)
    assert won
    assert writer.inline_batches == inline + 1
    # Committed, not merely written: another connection (another process) reads it.
    other = sqlite3.connect(tmp_path / "j.db")
    try:
        assert other.execute("SELECT owner FROM calls WHERE key='alone'").fetchone() == ("A",)
    finally:
        other.close()


async def test_an_inline_commit_never_waits_for_another_process_on_the_event_loop(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = SQLiteJournal(path, busy_timeout=30)
    await journal.open()
    writer = journal._writer
    assert writer is not None
    other = sqlite3.connect(path, isolation_level=None)  # another process's connection
    try:
        writer.commit_s = 0.0
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        outcome: list[tuple[bool, CallRecord]] = []

        async def claim() -> None:
            outcome.append(await journal.claim(pending("waits"), T0))

        async with anyio.create_task_group() as group:
            group.start_soon(claim)
            # Had the loop's thread tried to commit with the connection's 30 s busy timeout, it
            # would be stuck in SQLite until the lock was released, and this task would never
            # run to release it: the claim went to the writer thread, which waits for the lock.
            for _ in range(5):
                await anyio.sleep(0.01)
            assert outcome == []
            other.execute("ROLLBACK")
        assert outcome[0][0]
        assert await journal.get(pending("waits").identity) == pending("waits")
    finally:
        other.close()
        await journal.aclose()


async def test_a_swap_that_changes_created_at_or_task_id_is_stored_whole(tmp_path: Path) -> None:
    # The common swap leaves `created_at` and `task_id` out of its UPDATE; one that changes them
    # must still store them, and a stale version must still lose.
    journal = SQLiteJournal(tmp_path / "j.db")
    await journal.open()
    try:
        _, first = await journal.claim(pending("k"), T0)
        moved = first.evolve(created_at=T0 + 5, task_id="task-1")
        assert await journal.swap(first.version, moved)
        stored = await journal.get(first.identity)
        assert stored is not None and (stored.created_at, stored.task_id, stored.version) == (T0 + 5, "task-1", 2)
        assert await journal.get_task("local", "task-1") == stored
        assert not await journal.swap(first.version, moved.evolve(state=CallState.COMPLETED))
        kept = stored.evolve(state=CallState.COMPLETED, result=b"{}")
        assert await journal.swap(stored.version, kept)
        assert await journal.get(first.identity) == kept
    finally:
        await journal.aclose()


async def test_the_wal_is_written_ahead_and_the_journal_reopens_intact(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    journal = SQLiteJournal(path)
    await journal.open()
    writer = journal._writer
    assert writer is not None
    try:
        for i in range(50):
            assert (await journal.claim(pending(f"k{i}"), T0))[0]
        with anyio.fail_after(30):
            while (tmp_path / "j.db-wal").stat().st_size < writer._wal_target:
                await anyio.sleep(0.01)
        for i in range(50, 100):
            assert (await journal.claim(pending(f"k{i}"), T0))[0]
        # The files as a crash would leave them (the commits still in the WAL, zeros after
        # them): SQLite's recovery of the copy must find every committed claim.
        for suffix in ("", "-wal"):
            shutil.copyfile(f"{path}{suffix}", tmp_path / f"copy.db{suffix}")
    finally:
        await journal.aclose()
    conn = sqlite3.connect(tmp_path / "copy.db")
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM calls").fetchone() == (100,)
    finally:
        conn.close()
