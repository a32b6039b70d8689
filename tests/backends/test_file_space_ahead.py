"""Space allocated ahead of the file journal's data (journal/file/writer.py).

A running journal's active segment ends in zero bytes (space for the next frames, so a sync
changes no file size). Those zeros are free space, never damage: a journal that stopped without
closing (a crash) reopens without a problem and the next frame goes right after the data; a
clean close and a rotation trim the space away; zeros *between* frames are still damage.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from mcp_durable.journal.file import FileJournal, verify
from mcp_durable.journal.file.writer import PREALLOCATE, data_end

SEGMENT = "seg-00000001.log"


async def opened(path: Path, **kwargs: object) -> FileJournal:
    journal = FileJournal(path, **kwargs)  # type: ignore[arg-type]
    await journal.open()
    return journal


async def append(journal: FileJournal, start: int, count: int) -> None:
    for i in range(start, start + count):
        await journal.append("p", "context_update", {"i": i}, float(i))


def frames_in(path: Path) -> bytes:
    return path.read_bytes().rstrip(b"\0")


async def test_a_running_journal_has_zeros_ahead_and_a_clean_close_trims_them(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = await opened(path)
    await append(journal, 0, 20)
    segment = path / SEGMENT
    data = frames_in(segment)
    assert data.endswith(b"\n") and data.count(b"\n") == 20
    assert segment.stat().st_size >= len(data) + PREALLOCATE // 2  # allocated ahead, zero-filled
    with open(segment, "rb") as f:
        assert data_end(f.fileno(), segment.stat().st_size) == len(data)
    assert not verify(path).problems  # verify beside the writer: the zeros are not damage
    await journal.aclose()
    assert segment.stat().st_size == len(data)  # trimmed to exactly its frames


async def test_a_crash_image_with_zeros_ahead_reopens_cleanly_and_appends_after_the_data(tmp_path: Path) -> None:
    path, crashed = tmp_path / "j", tmp_path / "crashed"
    journal = await opened(path)
    await append(journal, 0, 30)
    # What a SIGKILL leaves: the files as they are while the journal runs (lock aside).
    shutil.copytree(path, crashed, ignore=shutil.ignore_patterns("LOCK"))
    await journal.aclose()
    assert (crashed / SEGMENT).stat().st_size > len(frames_in(crashed / SEGMENT))

    again = await opened(crashed)
    try:
        assert again.recovery is not None
        assert again.recovery.problems == () and again.recovery.bytes_truncated == 0
        await append(again, 30, 5)
        assert [e.data["i"] for e in await again.entries()] == list(range(35))
    finally:
        await again.aclose()
    data = (crashed / SEGMENT).read_bytes()
    assert b"\0" not in data and data.count(b"\n") == 35  # the new frames follow the old ones
    report = verify(crashed)
    assert report.records == 35 and not report.problems


async def test_zeros_between_frames_are_still_damage_and_every_later_frame_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = await opened(path)
    await append(journal, 0, 10)
    await journal.aclose()
    segment = path / SEGMENT
    data = segment.read_bytes()
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == 0x0A][:-1]
    hole = slice(starts[4], starts[5])  # frame 4 never reached the disk: zeros where it was
    segment.write_bytes(data[: hole.start] + b"\0" * (hole.stop - hole.start) + data[hole.stop :])

    assert [p.offset for p in verify(path).problems] == [starts[4]]
    again = await opened(path)
    try:
        assert again.recovery is not None
        assert any(f"offset {starts[4]}" in p for p in again.recovery.problems)
        assert [e.data["i"] for e in await again.entries()] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    finally:
        await again.aclose()


async def test_rotation_seals_the_old_segment_at_its_data(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = await opened(path, segment_bytes=2_000)
    await append(journal, 0, 60)  # ~60 bytes of payload a frame: several segments
    segments = sorted(path.glob("seg-*.log"))
    assert len(segments) >= 3
    for sealed in segments[:-1]:
        data = sealed.read_bytes()
        assert data.endswith(b"\n") and b"\0" not in data
    assert [e.data["i"] for e in await journal.entries()] == list(range(60))
    await journal.aclose()


async def test_a_slow_disk_moves_the_flush_to_a_thread_and_a_fast_one_brings_it_back(tmp_path: Path) -> None:
    """Where the flush runs follows its measured duration (journal/file/commit.py)."""
    import threading

    import anyio

    from mcp_durable.journal.file import commit

    # Relaxed (no fsync): a flush is a pwrite, fast on any machine, so the average falls for sure.
    journal = await opened(tmp_path / "j", durability="relaxed")
    group = journal._commit
    assert group is not None
    flushed_on: list[str] = []
    write = group._write

    def recording(batch: commit.Batch) -> None:
        flushed_on.append(threading.current_thread().name)
        write(batch)

    group._write = recording  # type: ignore[method-assign]
    try:
        group.flush_s = 10 * commit.INLINE_FLUSH_S  # as if the last flushes were slow
        async with anyio.create_task_group() as tasks:
            for w in range(8):
                tasks.start_soon(append, journal, w * 100, 5)
        main = threading.current_thread().name
        assert flushed_on and flushed_on[0] != main  # slow: in a worker thread
        assert len(flushed_on) < 40  # and still batched: 40 appends, fewer flushes
        for _ in range(30):  # fast flushes pull the average back under the bar
            await append(journal, 1000, 1)
        assert group.flush_s < commit.INLINE_FLUSH_S and flushed_on[-1] == main
        entries = await journal.entries()
        assert len(entries) == 70
    finally:
        await journal.aclose()
