"""Compaction: rewrite the sealed segments keeping only live frames.

Steps, and what a crash after each leaves (every state opens with every live record):
1. purge expired records (a durable `purge` frame); rotate, so the segments to rewrite are
   sealed (never written again), and wait until everything before is on disk;
2. copy the latest frame of every live record and every process entry of the sealed segments,
   byte for byte (same sequence numbers and checksums; a frame of an earlier release's kind stays
   one), into a new segment; fsync it and the directory. Crash here: the new file is not in the
   manifest, an orphan deleted at open;
3. switch: one atomic manifest rename replaces the sealed segments with the new one. Crash
   here: the old segments are orphans, deleted at open; the old snapshot no longer matches the
   manifest and is ignored (recovery reads the segments);
4. point the index at the new positions, delete the old segments, write a snapshot.
Writers keep appending to the active segment throughout; a record changed during the copy has
its latest frame there, so the remap (which only moves positions that did not change) skips it.

After steps 2, 3 and 4 compaction calls the hook `at_phase` it was given with
`compaction:copied`, `compaction:switched`, `compaction:deleted`: the crash tests pass one that
SIGKILLs the process there.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread

from .index import unpack
from .segments import fsync_dir, segment_name, write_synced

#: Called with each phase's name once it is durable (`compaction:copied`, …).
PhaseHook = Callable[[str], None]


class CompactionTarget(Protocol):
    """What compaction needs of a `FileJournal`, named here so this module does not import the
    journal that calls it (`FileJournal.compact`): its directory, its maintenance lock, and
    the steps that read or change its index (sealing, the frames to copy, the switch of the
    manifest, the index pointed at the copies)."""

    directory: Path

    @property
    def maintenance(self) -> anyio.Lock: ...

    async def purge_expired(self, now: float) -> int: ...

    async def seal(self) -> tuple[tuple[int, ...], int]: ...

    def live_frames(self, segments: tuple[int, ...]) -> tuple[list[tuple[int, int, int]], set[int]]: ...

    async def switch(self, sealed: tuple[int, ...], target: int) -> int: ...

    def relocate(
        self, items: list[tuple[int, int, int]], offsets: list[int], target: int, dropped: set[int]
    ) -> tuple[int, int]: ...

    async def snapshot(self) -> str | None: ...

    def writing_big_file(self) -> contextlib.AbstractContextManager[None]: ...


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """What a compaction did."""

    records_purged: int
    records_kept: int
    entries_kept: int
    segments_before: int
    segments_after: int
    bytes_before: int
    bytes_after: int
    duration_s: float

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _copy(directory: Path, items: list[tuple[int, int, int]], target: int) -> list[int]:
    """Copy frames `(position, size, _)` (in log order) into segment `target`; new offsets."""
    offsets: list[int] = []

    def pieces() -> Iterator[bytes]:
        # Frames go out 4096 at a time: one write per piece, without the whole segment in memory.
        out, current, data = 0, -1, b""
        chunk: list[bytes] = []
        for position, size, _ in items:
            segment, offset = unpack(position)
            if segment != current:
                current, data = segment, (directory / segment_name(segment)).read_bytes()
            chunk.append(data[offset : offset + size])
            offsets.append(out)
            out += size
            if len(chunk) >= 4096:
                yield b"".join(chunk)
                chunk = []
        yield b"".join(chunk)

    write_synced(directory / segment_name(target), pieces(), create_new=True)
    fsync_dir(directory)
    return offsets


def _segment_bytes(directory: Path, segments: tuple[int, ...]) -> int:
    return sum((directory / segment_name(s)).stat().st_size for s in segments)


async def compact(journal: CompactionTarget, now: float, *, at_phase: PhaseHook | None = None) -> CompactionReport:
    started = time.perf_counter()
    phase = at_phase or (lambda name: None)
    directory = journal.directory
    async with journal.maintenance:
        purged = await journal.purge_expired(now)
        sealed, target = await journal.seal()
        items, dropped = journal.live_frames(sealed)
        bytes_before = await anyio.to_thread.run_sync(_segment_bytes, directory, sealed)
        with journal.writing_big_file():  # the copy, and the deletes that free the sealed segments
            offsets = await anyio.to_thread.run_sync(_copy, directory, items, target)
            phase("compaction:copied")
            segments_after = await journal.switch(sealed, target)
            phase("compaction:switched")
            kept_records, kept_entries = journal.relocate(items, offsets, target, dropped)
            await anyio.to_thread.run_sync(_delete, directory, sealed)
            phase("compaction:deleted")
        bytes_after = await anyio.to_thread.run_sync(_segment_bytes, directory, (target,))
    await journal.snapshot()
    return CompactionReport(
        purged,
        kept_records,
        kept_entries,
        len(sealed),
        segments_after,
        bytes_before,
        bytes_after,
        time.perf_counter() - started,
    )


def _delete(directory: Path, segments: tuple[int, ...]) -> None:
    for segment in segments:
        (directory / segment_name(segment)).unlink(missing_ok=True)
    fsync_dir(directory)
