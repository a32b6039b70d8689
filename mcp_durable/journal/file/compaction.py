"""Compaction: rewrite the sealed segments keeping only live frames.

Steps, and what a crash after each leaves (every state opens with every live record):
1. purge expired records (a durable `purge` frame); rotate, so the segments to rewrite are
   sealed (never written again), and wait until everything before is on disk;
2. copy the latest frame of every live record and every process entry of the sealed segments,
   byte for byte (same sequence numbers and checksums), into a new segment; fsync it and the
   directory. Crash here: the new file is not in the manifest, an orphan deleted at open;
3. switch: one atomic manifest rename replaces the sealed segments with the new one. Crash
   here: the old segments are orphans, deleted at open; the old snapshot no longer matches the
   manifest and is ignored (recovery reads the segments);
4. point the index at the new positions, delete the old segments, write a snapshot.
Writers keep appending to the active segment throughout; a record changed during the copy has
its latest frame there, so the remap (which only moves positions that did not change) skips it.

The environment variable `MCP_DURABLE_CRASH_AT` (`compaction:copied`, `compaction:switched`,
`compaction:deleted`) makes the process SIGKILL itself at that point: the crash tests use it.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import anyio.to_thread

from ... import config
from .commit import GroupCommit
from .index import DEAD, CallIndex, EntryIndex, pack, unpack
from .segments import ManifestKeeper, fsync_dir, segment_name, write_synced


class CompactionTarget(Protocol):
    """The parts of a `FileJournal` a compaction reads and changes, named here so this module
    does not import the journal that calls it (`FileJournal.compact`). They are its private
    state: compaction is part of the file journal, in its own module for size."""

    directory: Path
    _keeper: ManifestKeeper | None
    _maintenance: anyio.Lock
    _calls: CallIndex
    _entries: EntryIndex
    _dropped: set[int]
    _readers: dict[int, int]
    _next_seq: int
    _active: int

    def _writable(self) -> GroupCommit: ...

    def _rotate(self) -> None: ...

    async def purge_expired(self, now: float) -> int: ...

    async def snapshot(self) -> str | None: ...


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


def crash_point(name: str) -> None:
    """SIGKILL this process here if `MCP_DURABLE_CRASH_AT` names this point (crash tests)."""
    if config.crash_at() == name:
        os.kill(os.getpid(), signal.SIGKILL)


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


async def compact(journal: CompactionTarget, now: float) -> CompactionReport:
    started = time.perf_counter()
    commit = journal._writable()
    keeper = journal._keeper
    assert keeper is not None
    directory = journal.directory
    async with journal._maintenance:
        purged = await journal.purge_expired(now)
        journal._rotate()
        await commit.wait_seq(journal._next_seq - 1)
        sealed = tuple(s for s in keeper.current.segments if s != journal._active)
        order = {segment: i for i, segment in enumerate(sealed)}
        calls, entries = journal._calls, journal._entries
        items: list[tuple[int, int, int]] = []  # (position, size, slot or ~entry index)
        for slot in range(len(calls.state)):
            if calls.state[slot] != DEAD and unpack(calls.pos[slot])[0] in order:
                items.append((calls.pos[slot], calls.size[slot], slot))
        dropped = set(journal._dropped)  # entries purged: left out of the new segment and index
        for i in range(len(entries)):
            if i not in dropped and unpack(entries.pos[i])[0] in order:
                items.append((entries.pos[i], entries.size[i], ~i))
        items.sort(key=lambda item: (order[unpack(item[0])[0]], unpack(item[0])[1]))
        bytes_before = await anyio.to_thread.run_sync(_segment_bytes, directory, sealed)
        target = keeper.allocate()
        offsets = await anyio.to_thread.run_sync(_copy, directory, items, target)
        crash_point("compaction:copied")
        await anyio.to_thread.run_sync(keeper.replace_segments, sealed, target, journal._next_seq)
        crash_point("compaction:switched")
        kept_records = kept_entries = 0
        for (position, _, ref), offset in zip(items, offsets, strict=True):
            if ref >= 0:
                if calls.pos[ref] == position:  # unchanged during the copy
                    calls.pos[ref] = pack(target, offset)
                kept_records += 1
            else:
                entries.pos[~ref] = pack(target, offset)
                kept_entries += 1
        if dropped:
            # Rebuilt in one go (no await): entries appended meanwhile are kept, in order.
            late = journal._dropped - dropped  # dropped during the copy: renumbered like the index
            journal._entries = entries.without(dropped)
            order_dropped = sorted(dropped)
            journal._dropped = {i - bisect_left(order_dropped, i) for i in late}
        for segment in sealed:
            fd = journal._readers.pop(segment, None)
            if fd is not None:
                os.close(fd)
        await anyio.to_thread.run_sync(_delete, directory, sealed)
        crash_point("compaction:deleted")
        bytes_after = await anyio.to_thread.run_sync(_segment_bytes, directory, (target,))
        segments_after = len(keeper.current.segments)
    await journal.snapshot()
    return CompactionReport(purged, kept_records, kept_entries, len(sealed), segments_after, bytes_before,
                            bytes_after, time.perf_counter() - started)


def _delete(directory: Path, segments: tuple[int, ...]) -> None:
    for segment in segments:
        (directory / segment_name(segment)).unlink(missing_ok=True)
    fsync_dir(directory)
