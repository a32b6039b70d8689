"""Snapshots: the index written to disk, so recovery reads the last snapshot plus the tail.

A snapshot (`snapshot-<seq hex>.snap`) is one JSON header line, then the index arrays raw:

    {"format":3,"seq":…,"segments":["seg-…",…],"end":…,"byteorder":"little","crc":…,
     "sections":[["call.lo","Q",nbytes],…],"tools":[…],"principals":[…]}\\n<sections…>

Sections `tally.*` and the header's `counts` (the call index's `RecordTally`: counts by
principal, tool and state, slots by creation and by expiry time) came with `count_calls`: a
snapshot without them is used, and the tally is rebuilt from its arrays in one pass. Format 3
saves the tally's runs (`tally.runs.*`, `tally.expiry_runs.*`: a start, a length and the slots
of each run); a format 2 snapshot (minute buckets per principal, `tally.created.*`) is read, and
its tally rebuilt from the arrays.

Sections `entry.steps.*` (the step counts, `EntryIndex.steps`) came with durable steps: a
snapshot without them (an earlier release's) is not damaged, but recovery does not use it and
reads the segments instead, which rebuilds the counts (sections a release does not know are
ignored, so an earlier release still reads a newer snapshot).

It covers every frame of `segments` up to byte `end` of the last one (all fsynced before the
snapshot was renamed into place). It is written to a temp file, fsynced, renamed, and the
directory fsynced: a crash leaves the old snapshot or the new one, never half of one. A
snapshot is a cache: one that fails its CRC or no longer matches the manifest (compaction
rewrote its segments) is ignored and recovery reads the segments instead.
"""

from __future__ import annotations

import os
import sys
import zlib
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

from ..tally import RecordTally
from .index import CallIndex, EntryIndex, Interned, split_step_key, step_key
from .segments import fsync_dir, segment_name, segment_number, write_synced

FORMAT = 3  # 2: the call index's hash table is saved too; 3: the tally's runs (`tally.TimeRuns`)
#: Formats read: a format 2 snapshot's tally (minute buckets) is rebuilt from its arrays.
READ_FORMATS = (2, 3)
PREFIX = "snapshot-"
SUFFIX = ".snap"


def snapshot_name(seq: int) -> str:
    return f"{PREFIX}{seq:016x}{SUFFIX}"


def list_snapshots(directory: Path) -> list[Path]:
    """Snapshot files, newest first."""
    found = [p for p in directory.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX)]
    return sorted(found, key=lambda p: p.name, reverse=True)


@dataclass(slots=True)
class SnapshotData:
    """A copy of the index taken in the event loop, written later by a worker thread."""

    seq: int
    segments: tuple[int, ...]
    end: int
    sections: list[tuple[str, str, bytes]]
    tools: list[str]
    principals: list[str]
    tasks: list[list[str]]
    counts: list[tuple[Any, ...]]
    used: int


def capture(calls: CallIndex, entries: EntryIndex, seq: int, segments: tuple[int, ...], end: int) -> SnapshotData:
    """Copy the index (array copies: fast, and consistent because the loop does not yield)."""
    sections: list[tuple[str, str, bytes]] = []
    for name, code in CallIndex.ARRAYS:
        sections.append((f"call.{name}", code, getattr(calls, name).tobytes()))
    sections.append(("call.state", "B", bytes(calls.state)))
    for name, code in EntryIndex.ARRAYS:
        sections.append((f"entry.{name}", code, getattr(entries, name).tobytes()))
    for name in ("last", "checkpoint"):
        mapping: dict[int, int] = getattr(entries, name)
        sections.append((f"entry.{name}.keys", "Q", array("Q", mapping.keys()).tobytes()))
        sections.append((f"entry.{name}.values", "Q", array("Q", mapping.values()).tobytes()))
    # Step keys split back into (hash, index): an index is a 64-bit signed integer (`step_index`).
    hashes, indexes = array("Q"), array("q")
    for key in entries.steps:
        phash, index = split_step_key(key)
        hashes.append(phash)
        indexes.append(index)
    sections.append(("entry.steps.hashes", "Q", hashes.tobytes()))
    sections.append(("entry.steps.indexes", "q", indexes.tobytes()))
    sections.append(("entry.steps.counts", "Q", array("Q", entries.steps.values()).tobytes()))
    tasks = [
        [principal, task_id, f"{h:032x}", tool, key] for (principal, task_id), (h, tool, key) in calls.tasks.items()
    ]
    sections.extend(_tally_sections(calls.tally))
    counts = list(calls.tally.counts.items())
    names = list(calls.tools.names), list(calls.principals.names)
    return SnapshotData(seq, segments, end, sections, *names, tasks, counts, calls.used)


def _tally_sections(tally: RecordTally[int]) -> list[tuple[str, str, bytes]]:
    """The tally's runs as sections: per run its principal and tool (creation only), start and
    length, and the slots of every run one after another (`load` slices them back)."""
    principals, tools, starts, lengths, refs = array("I"), array("I"), array("d"), array("Q"), array("I")
    for principal, streams in tally.created.items():
        for tool, runs in streams.items():
            for start, run in zip(runs.starts, runs.runs, strict=True):
                principals.append(cast(int, principal))
                tools.append(cast(int, tool))
                starts.append(start)
                lengths.append(len(run))
                refs.extend(run)
    expiry = tally.expiry
    expiry_starts, expiry_lengths, expiry_refs = array("d", expiry.starts), array("Q"), array("I")
    for run in expiry.runs:
        expiry_lengths.append(len(run))
        expiry_refs.extend(run)
    return [
        ("tally.runs.principals", "I", principals.tobytes()),
        ("tally.runs.tools", "I", tools.tobytes()),
        ("tally.runs.starts", "d", starts.tobytes()),
        ("tally.runs.lengths", "Q", lengths.tobytes()),
        ("tally.runs.refs", "I", refs.tobytes()),
        ("tally.expiry_runs.starts", "d", expiry_starts.tobytes()),
        ("tally.expiry_runs.lengths", "Q", expiry_lengths.tobytes()),
        ("tally.expiry_runs.refs", "I", expiry_refs.tobytes()),
    ]


def _load_tally(calls: CallIndex, header: dict[str, Any], blobs: dict[str, array[Any] | bytearray]) -> bool:
    """Put the tally a snapshot holds into `calls`, or rebuild it from the arrays when the
    snapshot is of a release without it, or with its minute buckets (format 2): True then."""
    if "counts" not in header or "tally.expiry_runs.refs" not in blobs:
        calls.rebuild_tally()
        return True
    tally = calls.tally
    for principal, tool, state, n in header["counts"]:
        tally.counts.add(principal, tool, state, n)
    principals, tools, starts, lengths, refs = (
        _array(blobs, f"tally.runs.{n}") for n in ("principals", "tools", "starts", "lengths", "refs")
    )
    # A slice per run (a run is a few hundred slots): the load costs the runs, not the slots.
    at = 0
    for principal, tool, start, length in zip(principals, tools, starts, lengths, strict=True):
        tally.stream(principal, tool).put_run(start, refs[at : at + length])
        at += length
    starts, lengths, refs = (_array(blobs, f"tally.expiry_runs.{n}") for n in ("starts", "lengths", "refs"))
    at = 0
    for start, length in zip(starts, lengths, strict=True):
        tally.expiry.put_run(start, refs[at : at + length])
        at += length
    return False


def _array(blobs: dict[str, array[Any] | bytearray], name: str) -> array[Any]:
    """Section `name` as an array (`TypeError`, which `load` reports, when it is not one)."""
    value = blobs[name]
    if not isinstance(value, array):
        raise TypeError(f"section {name} is not an array")
    return value


def write_temp(directory: Path, data: SnapshotData) -> Path:
    """Write `data` to a temp file and fsync it; `publish` then puts it in place."""
    crc = 0
    for _, _, blob in data.sections:
        crc = zlib.crc32(blob, crc)
    header = {
        "format": FORMAT,
        "seq": data.seq,
        "segments": [segment_name(n) for n in data.segments],
        "end": data.end,
        "byteorder": sys.byteorder,
        "crc": crc,
        "sections": [[name, code, len(blob)] for name, code, blob in data.sections],
        "tools": data.tools,
        "principals": data.principals,
        "tasks": data.tasks,
        "counts": data.counts,
        "used": data.used,
    }
    tmp = directory / (snapshot_name(data.seq) + ".tmp")
    write_synced(tmp, [orjson.dumps(header) + b"\n", *(b for _, _, b in data.sections)])
    return tmp


def publish(tmp: Path) -> Path:
    """Rename a written snapshot into place, fsync the directory, delete the older snapshots."""
    path = tmp.with_name(tmp.name[: -len(".tmp")])
    os.replace(tmp, path)
    fsync_dir(path.parent)
    for old in list_snapshots(path.parent):
        if old != path:
            old.unlink(missing_ok=True)
    return path


@dataclass(slots=True)
class LoadedSnapshot:
    path: Path
    seq: int
    segments: tuple[int, ...]
    end: int
    calls: CallIndex
    entries: EntryIndex
    #: False for a snapshot of an earlier release (no step counts): sound, but not to be used.
    has_steps: bool = True
    #: True when its tally was rebuilt (an earlier release's snapshot): a writable open writes
    #: a snapshot at once, so the rebuild is paid once.
    outdated: bool = False


class SnapshotError(Exception):
    """A snapshot that cannot be used (the reason is the message)."""


def load(path: Path) -> LoadedSnapshot:
    """Read a snapshot back into a fresh index; raises `SnapshotError` if it is unusable."""
    header, blobs = _read_sections(path)
    try:
        calls, outdated = _rebuild_calls(header, blobs)
        entries, has_steps = _rebuild_entries(blobs)
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise SnapshotError(f"snapshot lacks a section: {exc}") from exc
    found = [segment_number(n) for n in header["segments"]]
    numbers = tuple(n for n in found if n is not None)
    if len(numbers) != len(found):
        raise SnapshotError("snapshot names an unknown segment")
    return LoadedSnapshot(
        path,
        int(header["seq"]),
        numbers,
        int(header["end"]),
        calls,
        entries,
        has_steps,
        outdated,
    )


def _read_sections(path: Path) -> tuple[dict[str, Any], dict[str, array[Any] | bytearray]]:
    """The header and every section by name (code "B" as bytes, the others as arrays), their
    checksum verified; raises `SnapshotError` for an unknown format, a short file, a checksum
    mismatch or an unreadable file or header."""
    try:
        with open(path, "rb") as f:
            header: dict[str, Any] = orjson.loads(f.readline())
            if header.get("format") not in READ_FORMATS or header.get("byteorder") != sys.byteorder:
                raise SnapshotError("unknown snapshot format")
            blobs: dict[str, array[Any] | bytearray] = {}
            crc = 0
            for name, code, nbytes in header["sections"]:
                value = _section(code, nbytes)
                # Read straight into the section's memory: no copy, no second buffer.
                if f.readinto(memoryview(value).cast("B")) != nbytes:
                    raise SnapshotError("snapshot is shorter than its header says")
                crc = zlib.crc32(value, crc)
                blobs[name] = value
            if crc != header["crc"]:
                raise SnapshotError("snapshot checksum mismatch")
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise SnapshotError(f"unreadable snapshot: {exc}") from exc
    return header, blobs


def _section(code: str, nbytes: int) -> array[Any] | bytearray:
    """Room for one section of `nbytes`: a bytearray for code "B", else an array of that type
    code (`ValueError` when `nbytes` is not a whole number of its items)."""
    if code == "B":
        return bytearray(nbytes)
    arr = array(code)
    if nbytes % arr.itemsize:
        raise ValueError(f"section of {nbytes} bytes is not an array of {code!r}")
    return array(code, [0]) * (nbytes // arr.itemsize)


def _rebuild_calls(header: dict[str, Any], blobs: dict[str, array[Any] | bytearray]) -> tuple[CallIndex, bool]:
    """The call index from its sections and the header's names and tasks, and whether its tally
    was rebuilt (`_load_tally`); raises `SnapshotError`
    when its arrays do not fit together (a missing or malformed section raises `KeyError`,
    `ValueError`, `TypeError` or `AttributeError`, which `load` reports)."""
    calls = CallIndex()
    for name, _ in CallIndex.ARRAYS:
        setattr(calls, name, blobs[f"call.{name}"])
    state = blobs["call.state"]
    calls.state = state if isinstance(state, bytearray) else bytearray(state)
    calls.tools = Interned(header["tools"])
    calls.principals = Interned(header["principals"])
    # Absent from snapshots written before tasks existed (there were none then).
    calls.tasks = {(p, t): (int(h, 16), tool, key) for p, t, h, tool, key in header.get("tasks", ())}
    size = len(calls.table)
    lengths_differ = any(len(getattr(calls, n)) != len(calls.state) for n, _ in CallIndex.ARRAYS[:-1])
    if size < 2 or size & (size - 1) or lengths_differ:
        raise SnapshotError("snapshot arrays do not fit together")
    calls.after_load(header.get("used"))
    return calls, _load_tally(calls, header, blobs)


def _rebuild_entries(blobs: dict[str, array[Any] | bytearray]) -> tuple[EntryIndex, bool]:
    """The entry index from its sections, and whether the snapshot has the step counts (an
    earlier release's has not: `LoadedSnapshot.has_steps`). A missing or malformed section
    raises `KeyError`, `ValueError`, `TypeError` or `AttributeError`, which `load` reports."""
    entries = EntryIndex()
    for name, _ in EntryIndex.ARRAYS:
        setattr(entries, name, blobs[f"entry.{name}"])
    entries.forget_size()
    for name in ("last", "checkpoint"):
        keys, values = blobs[f"entry.{name}.keys"], blobs[f"entry.{name}.values"]
        setattr(entries, name, dict(zip(keys.tolist(), values.tolist(), strict=True)))  # type: ignore[union-attr]
    has_steps = "entry.steps.counts" in blobs
    if has_steps:
        hashes, indexes, counts = (blobs[f"entry.steps.{n}"] for n in ("hashes", "indexes", "counts"))
        entries.steps = {step_key(h, i): c for h, i, c in zip(hashes, indexes, counts, strict=True)}
    return entries, has_steps


def verify_file(path: Path) -> str | None:
    """Why the snapshot at `path` is unusable, or None if its checksum holds."""
    try:
        load(path)
    except SnapshotError as exc:
        return str(exc)
    return None
