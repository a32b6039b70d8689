"""The file journal's step index (`EntryIndex.steps`): which step indexes of a run are taken,
rebuilt at open from the segments or a snapshot, kept right by `purge_entries` and compaction,
and exact when two step processes' hashes collide."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Fence, JournalEntry
from mcp_durable.journal.base import STEP, step_process_id
from mcp_durable.journal.file import FileJournal, verify
from mcp_durable.journal.file.index import CallIndex, EntryIndex
from mcp_durable.journal.file.snapshot import capture, list_snapshots, load, publish, write_temp

T0 = 1_700_000_000.0


def pending(key: str) -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner="A",
        lease_until=T0 + 30,
    )


FENCE_A = Fence("A", "run-a", 1)
FENCE_B = Fence("A", "run-b", 1)
A, B = pending("a").identity, pending("b").identity


async def opened(path: Path, **kwargs: Any) -> FileJournal:
    journal = FileJournal(path, **kwargs)
    await journal.open()
    return journal


async def write_steps(path: Path, **kwargs: Any) -> FileJournal:
    """Records a and b held under FENCE_A and FENCE_B, each with steps 0 and 1 (step 1 of b
    written by a plain `append`, as an operator's re-run copies steps)."""
    journal = await opened(path, **kwargs)
    for key in ("a", "b"):
        assert (await journal.claim(pending(key), T0))[0]
    for index in (0, 1):
        assert await journal.append_step(A, FENCE_A, index, {"v": index}, T0) is not None
    assert await journal.append_step(B, FENCE_B, 0, {"v": 0}, T0) is not None
    await journal.append(step_process_id("run-b"), STEP, {"index": 1, "v": 1}, T0)
    return journal


async def taken(journal: FileJournal, identity: CallIdentity, fence: Fence, index: int) -> bool:
    """Whether step `index` is taken: an `append_step` of it writes nothing (and then, when it
    was free, that step is taken by this very check)."""
    return await journal.append_step(identity, fence, index, {"probe": True}, T0 + 1) is None


async def steps_of(journal: FileJournal, run_id: str) -> list[int]:
    return [e.data["index"] for e in await journal.entries(process_id=step_process_id(run_id))]


@pytest.mark.parametrize("snapshot", [False, True], ids=["from-segments", "from-a-snapshot"])
async def test_the_taken_step_indexes_are_found_again_after_reopening(tmp_path: Path, snapshot: bool) -> None:
    path = tmp_path / "j"
    journal = await write_steps(path)
    if snapshot:
        assert await journal.snapshot() is not None
    assert await journal.append_step(A, FENCE_A, 2, {}, T0) is not None  # after the snapshot: the tail
    await journal.aclose()
    again = await opened(path)
    try:
        assert again.recovery is not None and (again.recovery.snapshot_used is not None) == snapshot
        for identity, fence, index in [
            (A, FENCE_A, 0),
            (A, FENCE_A, 1),
            (A, FENCE_A, 2),
            (B, FENCE_B, 0),
            (B, FENCE_B, 1),
        ]:
            assert await taken(again, identity, fence, index), (fence.run_id, index)
        assert not await taken(again, A, FENCE_A, 3) and not await taken(again, B, FENCE_B, 2)
        assert await steps_of(again, "run-a") == [0, 1, 2, 3]
        assert await steps_of(again, "run-b") == [0, 1, 2]
    finally:
        await again.aclose()


async def test_compaction_keeps_the_steps_it_keeps_taken_and_frees_the_purged(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = await write_steps(path, segment_bytes=600)  # a few frames a segment: several segments
    assert await journal.purge_entries([step_process_id("run-b")]) == 2
    assert not await taken(journal, B, FENCE_B, 1)  # freed at once (and taken again by the check)
    assert await journal.purge_entries([step_process_id("run-b")]) == 1
    # The purges gave back the counts of b's steps (the index keeps no memory of them).
    b_hash = journal._process_hash(step_process_id("run-b"))
    assert not any(journal._entries.may_have_step(b_hash, index) for index in (0, 1))
    report = await journal.compact(T0)
    assert report.segments_before > 1
    assert await taken(journal, A, FENCE_A, 0) and await taken(journal, A, FENCE_A, 1)
    assert not await taken(journal, B, FENCE_B, 0)
    await journal.aclose()
    assert verify(path).ok
    again = await opened(path, segment_bytes=600)
    try:
        assert await taken(again, A, FENCE_A, 1) and await taken(again, B, FENCE_B, 0)
        assert not await taken(again, B, FENCE_B, 1)  # the purged entries are gone from the segments
        assert await steps_of(again, "run-b") == [0, 1]
    finally:
        await again.aclose()


def strip_step_sections(snapshot: Path) -> None:
    """Rewrite `snapshot` as a release before step indexes wrote it: no `entry.steps.*` sections."""
    raw = snapshot.read_bytes()
    line_end = raw.index(b"\n") + 1
    header = orjson.loads(raw[:line_end])
    at, kept, blobs = line_end, [], []
    for name, code, nbytes in header["sections"]:
        if not name.startswith("entry.steps."):
            kept.append([name, code, nbytes])
            blobs.append(raw[at : at + nbytes])
        at += nbytes
    crc = 0
    for blob in blobs:
        crc = zlib.crc32(blob, crc)
    header.update(sections=kept, crc=crc)
    snapshot.write_bytes(orjson.dumps(header) + b"\n" + b"".join(blobs))


async def test_a_snapshot_of_an_earlier_release_is_passed_over_quietly_and_the_segments_read(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j"
    journal = await write_steps(path)
    assert await journal.snapshot() is not None
    await journal.aclose()
    [snapshot] = list_snapshots(path)
    strip_step_sections(snapshot)
    assert verify(path).ok  # not damage: a snapshot without step counts is sound
    again = await opened(path)
    try:
        assert again.recovery is not None
        assert again.recovery.snapshot_used is None and again.recovery.problems == ()
        assert await taken(again, A, FENCE_A, 1) and await taken(again, B, FENCE_B, 1)
        assert not await taken(again, A, FENCE_A, 5)
    finally:
        await again.aclose()


async def test_step_processes_whose_hashes_collide_keep_their_own_step_indexes(tmp_path: Path) -> None:
    journal = await opened(tmp_path / "j")
    try:
        for key in ("a", "b"):
            assert (await journal.claim(pending(key), T0))[0]
        # Two processes sharing a 64-bit hash: made so by seeding the journal's hash cache.
        journal._process_hashes[step_process_id("run-b")] = journal._process_hash(step_process_id("run-a"))
        assert await journal.append_step(A, FENCE_A, 0, {}, T0) is not None
        assert await journal.append_step(B, FENCE_B, 0, {}, T0) is not None  # a's step 0 is not b's
        assert await taken(journal, B, FENCE_B, 0) and await taken(journal, A, FENCE_A, 0)
        assert await journal.purge_entries([step_process_id("run-a")]) == 1
        assert await taken(journal, B, FENCE_B, 0)  # b's step stays taken
        assert not await taken(journal, A, FENCE_A, 0)
        assert await steps_of(journal, "run-a") == [0] and await steps_of(journal, "run-b") == [0]
    finally:
        await journal.aclose()


async def test_concurrent_steps_each_in_a_segment_not_created_yet_are_written_once(tmp_path: Path) -> None:
    # Frames bigger than a segment: every frame rotates to a new segment, created by its flush,
    # so a step that is checked against one still queued reads it from the group commit's batch.
    journal = await opened(tmp_path / "j", segment_bytes=100)
    try:
        assert (await journal.claim(pending("a"), T0))[0]
        written: list[JournalEntry] = []

        async def step(n: int) -> None:
            entry = await journal.append_step(A, FENCE_A, n % 3, {"writer": n}, T0 + n)
            if entry is not None:
                written.append(entry)

        async with anyio.create_task_group() as tg:
            for n in range(30):
                tg.start_soon(step, n)
        assert sorted(e.data["index"] for e in written) == [0, 1, 2]
        assert sorted(await steps_of(journal, "run-a")) == [0, 1, 2]
    finally:
        await journal.aclose()


async def test_a_step_is_refused_once_its_record_is_released_even_by_an_old_fence(tmp_path: Path) -> None:
    journal = await opened(tmp_path / "j")
    try:
        _, record = await journal.claim(pending("a"), T0)
        assert await journal.swap(1, record.evolve(state=CallState.RELEASED))
        assert await journal.append_step(A, FENCE_A, 0, {}, T0) is None
        assert await journal.entries() == []
        assert journal._next_seq == 3  # no frame was queued for it
    finally:
        await journal.aclose()


def test_step_counts_round_trip_through_a_snapshot_file(tmp_path: Path) -> None:
    entries = EntryIndex()
    # Negative, largest and repeated indexes; a process hash with its top bit set.
    for n, step in enumerate((0, 5, -3, 5, (1 << 63) - 1)):
        entries.add(n + 1, 0, 1, (1 << 64) - 1 - n % 2, False, step)
    assert len(entries.steps) == 4 and 2 in entries.steps.values()
    loaded = load(publish(write_temp(tmp_path, capture(CallIndex(), entries, 5, (1,), 0))))
    assert loaded.has_steps and loaded.entries.steps == entries.steps
