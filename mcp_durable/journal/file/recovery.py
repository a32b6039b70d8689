"""Opening a journal: the last usable snapshot, then every frame after it, with repairs.

Runs in a worker thread, before the journal serves anything. What it does to the files (only
when opened for writing; a read-only open reports the same things and changes nothing):
- a torn or corrupt tail (damage that no valid frame follows) is cut off: the bytes are first
  copied to `<segment>.torn-<offset>` (fsynced), then the segment is truncated there, so the
  next append starts on a frame boundary and is never glued to half a frame;
- damage before the tail is skipped by resynchronising on the framing; every valid frame after
  it is kept, the damaged range is reported with its offset and copied to
  `<segment>.damaged-<offset>` (the segment itself is left as it is);
- orphans (segments not in the manifest, temp files, snapshots that no longer apply) are deleted.
A segment the manifest names but that does not exist is refused (`JournalCorruptError`):
records would be missing.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ...errors import JournalCorruptError
from ..base import CHECKPOINT
from ..fsync import truncate_synced
from ..record_json import step_index
from .codec import identity_hash, index_fields, process_hash
from .framing import Damage, scan
from .index import STATE_CODES, CallIndex, EntryIndex, pack
from .segments import Manifest, fsync_dir, segment_name, segment_number, write_synced
from .snapshot import LoadedSnapshot, SnapshotError, list_snapshots, load
from .writer import data_end

WINDOW = 8 * 1024 * 1024  # bytes of a segment read at a time
_STATE_BY_NAME = {state.value: code for state, code in STATE_CODES.items()}


@dataclass(slots=True)
class Recovered:
    """The index rebuilt from disk, and what was found on the way."""

    calls: CallIndex
    entries: EntryIndex
    last_seq: int
    active: int
    active_end: int
    snapshot_used: str | None = None
    #: The snapshot used is of an earlier format (`LoadedSnapshot.outdated`).
    snapshot_outdated: bool = False
    frames_replayed: int = 0
    bytes_truncated: int = 0
    truncated_to: str | None = None
    problems: list[str] = field(default_factory=list)


def apply(
    calls: CallIndex, entries: EntryIndex, d: dict[str, Any], seq: int, position: int, size: int, hash_key: bytes
) -> None:
    """Fold one frame's payload into the index (the replay rule, in one place). `hash_key` is
    the manifest's: a `c` frame's index hash is computed from its identity (`codec.py`)."""
    kind = d["t"]
    if kind == "c":
        identity, version, state, created, expires, task_id = index_fields(d["r"])
        h = identity_hash(hash_key, identity)
        calls.put_fields(
            h, version, STATE_CODES[state], created, expires, identity.tool, identity.principal, position, size
        )
        calls.put_task(task_id, h, identity.principal)
    elif kind == "call":  # an earlier release's frame: the record as an object, its hash beside it
        r = d["r"]
        calls.put_fields(
            int(d["h"], 16),
            r["version"],
            _STATE_BY_NAME[r["state"]],
            r["created_at"],
            r["expires_at"],
            r["tool"],
            r["principal"],
            position,
            size,
        )
        calls.put_task(r.get("task_id"), int(d["h"], 16), r["principal"])
    elif kind == "entry":
        entry_type = d["entry_type"]
        entries.add(
            seq,
            position,
            size,
            process_hash(d["process_id"]),
            entry_type == CHECKPOINT,
            step_index(entry_type, d["data"]),
        )
    elif kind == "purge":
        for slot in calls.take_expired(d["now"]):
            calls.delete(slot)
        calls.prune_tasks()


def _usable_snapshot(directory: Path, manifest: Manifest, problems: list[str]) -> LoadedSnapshot | None:
    for path in list_snapshots(directory):
        try:
            snap = load(path)
        except SnapshotError as exc:
            problems.append(f"{path.name}: {exc}; not used (recovery reads the segments instead)")
            continue
        covered = snap.segments if snap.end else snap.segments[:-1]
        if manifest.segments[: len(covered)] != covered:
            continue  # written before a compaction: stale, not damaged
        if not snap.has_steps:
            # Written before step counts existed: not damaged, but only the segments say which
            # entries are steps (the next snapshot has the counts).
            continue
        if snap.end and (directory / segment_name(snap.segments[-1])).stat().st_size < snap.end:
            problems.append(f"{path.name}: covers more than its segment holds; not used")
            continue
        return snap
    return None


def recover(directory: Path, manifest: Manifest, *, writable: bool) -> Recovered:
    """Rebuild the index of the journal in `directory` (see the module docstring)."""
    problems: list[str] = []
    snap = _usable_snapshot(directory, manifest, problems)
    if snap is not None:
        calls, entries, last_seq = snap.calls, snap.entries, snap.seq
        start_index, start_offset = len(snap.segments) - 1, snap.end
    else:
        calls, entries, last_seq = CallIndex(), EntryIndex(), 0
        start_index, start_offset = 0, 0
    out = Recovered(
        calls,
        entries,
        last_seq,
        manifest.segments[-1],
        0,
        snapshot_used=snap.path.name if snap else None,
        snapshot_outdated=snap is not None and snap.outdated,
        problems=problems,
    )
    for i in range(start_index, len(manifest.segments)):
        path = directory / segment_name(manifest.segments[i])
        sealed = i < len(manifest.segments) - 1
        try:
            with open(path, "rb") as f:
                out.active_end = _replay_segment(
                    f,
                    manifest.segments[i],
                    start_offset if i == start_index else 0,
                    out,
                    manifest.hash_key,
                    writable=writable,
                    sealed=sealed,
                )
        except FileNotFoundError:
            raise JournalCorruptError(str(path), 0, "a segment named in the manifest is missing") from None
    if start_index >= len(manifest.segments):
        # The snapshot's active segment was never created: compaction rotates to a segment that
        # exists only once a frame is written to it, and nothing was (e.g. `journal compact`
        # closes right after). Writing goes on after the data of the manifest's last segment,
        # never from its offset 0 over the records the snapshot indexes there.
        path = directory / segment_name(manifest.segments[-1])
        try:
            with open(path, "rb") as f:
                out.active_end = data_end(f.fileno(), os.fstat(f.fileno()).st_size)
        except FileNotFoundError:
            raise JournalCorruptError(str(path), 0, "a segment named in the manifest is missing") from None
    out.last_seq = max(out.last_seq, manifest.seq_floor - 1)
    if writable:
        _delete_orphans(directory, manifest, snap)
    return out


def _replay_segment(
    f: BinaryIO, number: int, start: int, out: Recovered, hash_key: bytes, *, writable: bool, sealed: bool
) -> int:
    """Replay one segment from byte `start`, a window at a time; returns where it ends now.

    Windows keep memory flat whatever the segment size: a frame cut by the end of a window is
    read again at the start of the next one (a bigger one if a single frame is larger). Zero
    bytes after the data are space allocated ahead of the writer (`writer.py`), not damage.
    """
    path = Path(f.name)
    size = data_end(f.fileno(), os.fstat(f.fileno()).st_size)
    pos, window = start, WINDOW
    while pos < size:
        f.seek(pos)
        data = f.read(min(window, size - pos))
        at_eof = pos + len(data) >= size
        resume: int | None = None
        for item in scan(data, 0, out.last_seq):
            if isinstance(item, Damage):
                if item.tail and not at_eof:
                    resume = item.start  # maybe only cut by the window: read again from there
                    break
                _repair(path, pos, data, item, out, writable=writable, sealed=sealed)
                if item.tail:
                    size = pos + item.start  # cut off here (or, read-only, to be ignored from here)
                continue
            try:
                d = orjson.loads(data[item.start : item.start + item.length])
                apply(out.calls, out.entries, d, item.seq, pack(number, pos + item.offset), item.size, hash_key)
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
                out.problems.append(
                    f"{path.name}: frame at offset {pos + item.offset} has a valid checksum "
                    f"but an unreadable payload ({exc}); skipped"
                )
            out.last_seq = item.seq
            out.frames_replayed += 1
        if resume is None:
            pos += len(data)
        elif resume == 0:
            window *= 2
        else:
            pos, window = pos + resume, WINDOW
    return size


def _repair(
    path: Path, base: int, data: bytes, damage: Damage, out: Recovered, *, writable: bool, sealed: bool
) -> None:
    """Report (and, writable, set aside; a tail also cut off) one damaged range."""
    start, stop = base + damage.start, base + damage.end
    cut = data[damage.start : damage.end]
    if not damage.tail:
        aside = path.with_name(f"{path.name}.damaged-{start}")
        if writable and not aside.exists():
            _keep_aside(aside, cut)
        out.problems.append(
            f"{path.name}: damaged bytes at offset {start} to {stop} ({damage.reason}); resynchronised on the "
            f"next frame, every valid record after it kept; the damaged bytes are in {aside.name}"
        )
        return
    aside = path.with_name(f"{path.name}.torn-{start}")
    where = "sealed segment" if sealed else "tail"
    out.problems.append(
        f"{path.name}: torn or corrupt {where} at offset {start} ({damage.reason}): "
        f"{len(cut)} bytes cut off and kept in {aside.name}"
    )
    out.bytes_truncated += len(cut)
    out.truncated_to = str(aside)
    if writable:
        _keep_aside(aside, cut)
        fd = os.open(path, os.O_WRONLY)
        try:
            truncate_synced(fd, start)
        finally:
            os.close(fd)


def _keep_aside(path: Path, data: bytes) -> None:
    write_synced(path, [data])
    fsync_dir(path.parent)


def _delete_orphans(directory: Path, manifest: Manifest, used: LoadedSnapshot | None) -> None:
    listed = set(manifest.segments)
    for p in directory.iterdir():
        number = segment_number(p.name)
        stale_snapshot = p.name.startswith("snapshot-") and (used is None or p != used.path)
        if (number is not None and number not in listed) or p.name.endswith(".tmp") or stale_snapshot:
            p.unlink(missing_ok=True)
