"""File journal: reads while writers go on, and compaction while they do, never see a frame in flight.

The index points at a frame as soon as it is queued for the group commit, before its bytes are
in the segment; a listing that read such a position found zeros and raised JournalCorruptError.
"""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import pytest

from mcp_durable.journal import CallQuery
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.model import CallIdentity, CallRecord, CallState


async def churn(journal: FileJournal, writer: int, stop: anyio.Event) -> None:
    n = 0
    while not stop.is_set():
        now = time.time()
        record = CallRecord(
            CallIdentity("p", "t", f"{writer}-{n}"),
            "f",
            CallState.PENDING,
            1,
            f"run-{writer}-{n}",
            1,
            now,
            now,
            arguments=b'{"n":1}',
        )
        _, record = await journal.claim(record, now)
        await journal.swap(
            record.version, record.evolve(state=CallState.COMPLETED, result=b'"ok"', expires_at=time.time() + 0.2)
        )
        await journal.append(f"steps/run-{writer}-{n}", "step", {"index": 0, "name": "s", "result": n}, now)
        n += 1


@pytest.mark.parametrize("compact", [False, True], ids=["listing", "listing-and-compaction"])
async def test_listings_and_entries_read_while_writers_append_never_meet_a_frame_in_flight(
    tmp_path: Path, compact: bool
) -> None:
    journal = FileJournal(tmp_path / "journal")
    await journal.open()
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as group:
            for writer in range(4):
                group.start_soon(churn, journal, writer, stop)
            for _ in range(40):
                await anyio.sleep(0.02)
                if compact:
                    await journal.compact(time.time())
                records = await journal.list_calls(CallQuery(limit=100_000))
                assert all(r.identity.tool == "t" for r in records)
                await journal.entries(after=0)
            stop.set()
    finally:
        await journal.aclose()


async def test_compaction_leaves_purged_entries_out_for_good(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path / "journal")
    await journal.open()
    try:
        for i in range(50):
            await journal.append("steps/old", "step", {"index": i, "name": "s", "result": "x" * 200}, 1.0)
        kept = await journal.append("steps/new", "step", {"index": 0, "name": "s", "result": 1}, 2.0)
        assert await journal.purge_entries(["steps/old"]) == 50
        total, live = journal.live_bytes()
        assert total - live > 50 * 200  # the dropped entries are garbage until compaction
        report = await journal.compact(3.0)
        assert report.entries_kept == 1 and report.bytes_after < report.bytes_before
        after = await journal.append("steps/new", "step", {"index": 1, "name": "s", "result": 2}, 4.0)
        assert [e.seq for e in await journal.entries(process_id="steps/new")] == [kept.seq, after.seq]
    finally:
        await journal.aclose()
    reopened = FileJournal(tmp_path / "journal")
    await reopened.open()
    try:
        assert await reopened.entries(process_id="steps/old") == []
        assert [e.seq for e in await reopened.entries()] == [kept.seq, after.seq]
    finally:
        await reopened.aclose()
