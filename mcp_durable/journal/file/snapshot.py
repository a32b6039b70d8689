"""Snapshots: the index written to disk, so recovery reads the last snapshot plus the tail.

A snapshot (`snapshot-<seq hex>.snap`) is one JSON header line, then the index arrays raw:

    {"format":4,"seq":…,"segments":["seg-…",…],"end":…,"byteorder":"little","crc":…,
     "sections":[["call.lo","Q",nbytes],…],"tools":[…],"principals":[…]}\\n<sections…>

Sections `tally.*` and the header's `counts` (the call index's `RecordTally`: counts by
principal, tool and state, slots by creation and by expiry time) came with `count_calls`: a
snapshot without them is used, and the tally is rebuilt from its arrays in one pass. Format 3
saves the tally's runs (`tally.runs.*`, `tally.expiry_runs.*`: a start, a length and the slots
of each run); a format 2 snapshot (minute buckets per principal, `tally.created.*`) is read, and
its tally rebuilt from the arrays. Format 4 saves the call index's narrow columns at the
typecode they have (`CallIndex.NARROW`), each frame's position as a segment number and an
offset, a 2-byte `call.hi` (the 80 bits of the hash the index keeps), no `call.seq` (saved
frames are on disk), only the slots up to the last live one, and the tasks as sections
(`call.tasks.*`) rather than in the header; a format 2 or 3 snapshot is converted as it is
loaded, and the journal writes a format 4 one at its open (`outdated`). An earlier release
refuses a format 4 snapshot (an unknown format) and reads the segments instead.

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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias, cast

import orjson

from ..tally import RecordTally
from .index import (
    MASK64,
    WIDTHS,
    CallIndex,
    EntryIndex,
    Interned,
    narrowest,
    split_positions,
    split_step_key,
    step_key,
)
from .segments import fsync_dir, segment_name, segment_number, write_synced

#: 2: the call index's hash table is saved too; 3: the tally's runs (`tally.TimeRuns`); 4: the
#: call index's narrow columns, a 4-byte `hi`, no `seq`.
FORMAT = 4
#: Formats read: a format 2 snapshot's tally (minute buckets) is rebuilt from its arrays, a
#: format 2 or 3 snapshot's call columns narrowed (`_narrowed`).
READ_FORMATS = (2, 3, 4)
#: A section of slots per run, read into one array per run (its lengths come before it), so the
#: runs are loaded without a second copy of all their slots.
RUN_SECTIONS = {"tally.runs.refs": "tally.runs.lengths", "tally.expiry_runs.refs": "tally.expiry_runs.lengths"}
PREFIX = "snapshot-"
SUFFIX = ".snap"
TEMP_SUFFIX = ".tmp"


def snapshot_name(seq: int) -> str:
    return f"{PREFIX}{seq:016x}{SUFFIX}"


def temp_path(directory: Path, seq: int) -> Path:
    """Where the snapshot of `seq` is written before `publish` renames it into place."""
    return directory / (snapshot_name(seq) + TEMP_SUFFIX)


def list_snapshots(directory: Path) -> list[Path]:
    """Snapshot files, newest first."""
    found = [p for p in directory.iterdir() if p.name.startswith(PREFIX) and p.name.endswith(SUFFIX)]
    return sorted(found, key=lambda p: p.name, reverse=True)


#: A section's bytes: a copy (`bytes`), a byte view of an index array as it is (`memoryview`),
#: or the views of several arrays, one after another (`list`: the tally's runs).
Blob: TypeAlias = "bytes | memoryview | list[memoryview]"


def _pieces(blob: Blob) -> Sequence[bytes | memoryview]:
    return blob if isinstance(blob, list) else (blob,)


def _size(blob: Blob) -> int:
    return sum(len(piece) for piece in _pieces(blob))


@dataclass(slots=True)
class SnapshotData:
    """The index as a snapshot's sections: a copy taken in the event loop and written later by
    a worker thread, or views of the arrays taken and written by a forked child (`child`)."""

    seq: int
    segments: tuple[int, ...]
    end: int
    sections: list[tuple[str, str, Blob]]
    tools: list[str]
    principals: list[str]
    counts: list[tuple[Any, ...]]
    used: int


def capture(
    calls: CallIndex, entries: EntryIndex, seq: int, segments: tuple[int, ...], end: int, *, copy: bool = True
) -> SnapshotData:
    """The index as sections. With `copy` (in the event loop), every array is copied: consistent
    because the loop does not yield before it returns, and the loop may change the index while
    a worker thread writes the copy. Without (`child`: in a forked child, where nothing changes
    the index), the arrays' own bytes are the sections, and only what is kept in dicts (steps,
    tasks, the tally's runs) is built into new arrays.

    The call index's slots after the last live one (the spare ones of its last growth) are left
    out: no bucket names them, and a load is that much smaller."""
    slots = len(calls.state.rstrip(b"\x00"))  # DEAD is 0

    def blob(view: memoryview) -> Blob:
        if not copy:
            return view.cast("B")
        with view:  # released at once: an array with a view exported cannot grow
            return view.tobytes()

    sections: list[tuple[str, str, Blob]] = []
    for name, _ in CallIndex.ARRAYS:
        column: array[Any] = getattr(calls, name)
        kept = memoryview(column) if name == "table" else memoryview(column)[:slots]
        sections.append((f"call.{name}", column.typecode, blob(kept)))
    sections.append(("call.state", "B", blob(memoryview(calls.state)[:slots])))
    for name, code in EntryIndex.ARRAYS:
        sections.append((f"entry.{name}", code, blob(memoryview(getattr(entries, name)))))
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
    sections.extend(_task_sections(calls))
    sections.extend(_tally_sections(calls.tally, copy))
    counts = list(calls.tally.counts.items())
    names = list(calls.tools.names), list(calls.principals.names)
    return SnapshotData(seq, segments, end, sections, *names, counts, calls.used)


def _task_sections(calls: CallIndex) -> list[tuple[str, str, bytes]]:
    """`CallIndex.tasks` as sections: per task its principal (its number), its record's hash in
    two halves, and its task id (their UTF-8 lengths, then every one's bytes one after another),
    so a load builds the dicts without a parsed row per task."""
    principals, los, his = array("I"), array("Q"), array("Q")
    task_ids: list[bytes] = []
    for principal, tasks in calls.tasks.items():
        number = calls.principals.ids[principal]
        for task_id, h in tasks.items():
            principals.append(number)
            los.append(h & MASK64)
            his.append(h >> 64)
            task_ids.append(task_id.encode("utf-8", "surrogatepass"))
    return [
        ("call.tasks.principals", "I", principals.tobytes()),
        ("call.tasks.lo", "Q", los.tobytes()),
        ("call.tasks.hi", "Q", his.tobytes()),
        ("call.tasks.id_lengths", "I", array("I", map(len, task_ids)).tobytes()),
        ("call.tasks.ids", "B", b"".join(task_ids)),
    ]


def _tally_sections(tally: RecordTally[int], copy: bool) -> list[tuple[str, str, Blob]]:
    """The tally's runs as sections: per run its principal and tool (creation only), start and
    length, and the slots of every run one after another (`load` slices them back): copied
    into one `bytes` with `copy`, else the runs' own bytes (`capture`)."""
    principals, tools, starts, lengths = array("I"), array("I"), array("d"), array("Q")
    runs_in_order: list[memoryview] = []
    for principal, streams in tally.created.items():
        for tool, runs in streams.items():
            for start, run in zip(runs.starts, runs.runs, strict=True):
                principals.append(cast(int, principal))
                tools.append(cast(int, tool))
                starts.append(start)
                lengths.append(len(run))
                runs_in_order.append(_run_view(run))
    expiry = tally.expiry
    expiry_starts, expiry_lengths = array("d", expiry.starts), array("Q", map(len, expiry.runs))
    expiry_runs = [_run_view(run) for run in expiry.runs]

    def refs(views: list[memoryview]) -> Blob:
        if not copy:
            return views
        try:
            return b"".join(views)
        finally:
            for view in views:
                view.release()  # as in `capture`: the runs must stay free to grow

    return [
        ("tally.runs.principals", "I", principals.tobytes()),
        ("tally.runs.tools", "I", tools.tobytes()),
        ("tally.runs.starts", "d", starts.tobytes()),
        ("tally.runs.lengths", "Q", lengths.tobytes()),
        ("tally.runs.refs", "I", refs(runs_in_order)),
        ("tally.expiry_runs.starts", "d", expiry_starts.tobytes()),
        ("tally.expiry_runs.lengths", "Q", expiry_lengths.tobytes()),
        ("tally.expiry_runs.refs", "I", refs(expiry_runs)),
    ]


def _run_view(run: object) -> memoryview:
    """A run's slots as bytes of typecode `I` (`index._slots`), as the section saves them."""
    if not isinstance(run, array) or run.typecode != "I":
        run = array("I", cast("list[int]", run))
    return memoryview(run).cast("B")


#: The section read as a bytearray (the call index's state); every other one is an array.
BYTES_SECTION = "call.state"
#: A section as read: `BYTES_SECTION` as bytes, `RUN_SECTIONS` as one array per run, the others
#: as an array.
Section: TypeAlias = "array[Any] | bytearray | list[array[Any]]"


def _load_tally(calls: CallIndex, header: dict[str, Any], blobs: dict[str, Section]) -> bool:
    """Put the tally a snapshot holds into `calls`, or rebuild it from the arrays when the
    snapshot is of a release without it, or with its minute buckets (format 2): True then."""
    if "counts" not in header or "tally.expiry_runs.refs" not in blobs:
        calls.rebuild_tally()
        return True
    tally = calls.tally
    for principal, tool, state, n in header["counts"]:
        tally.counts.add(principal, tool, state, n)
    principals, tools, starts = (_array(blobs, f"tally.runs.{n}") for n in ("principals", "tools", "starts"))
    # The runs were read one array each (`RUN_SECTIONS`): the load costs the runs, not the slots.
    runs = _runs(blobs, "tally.runs.refs")
    for principal, tool, start, run in zip(principals, tools, starts, runs, strict=True):
        tally.stream(principal, tool).put_run(start, run)
    for start, run in zip(
        _array(blobs, "tally.expiry_runs.starts"), _runs(blobs, "tally.expiry_runs.refs"), strict=True
    ):
        tally.expiry.put_run(start, run)
    return False


def _array(blobs: dict[str, Section], name: str) -> array[Any]:
    """Section `name` as an array (`TypeError`, which `load` reports, when it is not one)."""
    value = blobs[name]
    if not isinstance(value, array):
        raise TypeError(f"section {name} is not an array")
    return value


def _runs(blobs: dict[str, Section], name: str) -> list[array[Any]]:
    """Section `name` read as one array per run (`TypeError`, which `load` reports, when not)."""
    value = blobs[name]
    if not isinstance(value, list):
        raise TypeError(f"section {name} is not read by runs")
    return value


def write_temp(directory: Path, data: SnapshotData) -> Path:
    """Write `data` to a temp file and fsync it; `publish` then puts it in place."""
    crc = 0
    for _, _, blob in data.sections:
        for piece in _pieces(blob):
            crc = zlib.crc32(piece, crc)
    header = {
        "format": FORMAT,
        "seq": data.seq,
        "segments": [segment_name(n) for n in data.segments],
        "end": data.end,
        "byteorder": sys.byteorder,
        "crc": crc,
        "sections": [[name, code, _size(blob)] for name, code, blob in data.sections],
        "tools": data.tools,
        "principals": data.principals,
        "counts": data.counts,
        "used": data.used,
    }
    tmp = temp_path(directory, data.seq)
    write_synced(tmp, [orjson.dumps(header) + b"\n", *(piece for _, _, b in data.sections for piece in _pieces(b))])
    return tmp


def publish(tmp: Path) -> Path:
    """Rename a written snapshot into place, fsync the directory, delete the older snapshots."""
    path = tmp.with_name(tmp.name[: -len(TEMP_SUFFIX)])
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
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
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


def _read_sections(path: Path) -> tuple[dict[str, Any], dict[str, Section]]:
    """The header and every section by name (`BYTES_SECTION` as bytes, those of `RUN_SECTIONS` as a
    list of arrays, one per run, the others as arrays), their checksum verified; raises
    `SnapshotError` for an unknown format, a short file, a checksum mismatch or an unreadable
    file or header."""
    try:
        with open(path, "rb") as f:
            header: dict[str, Any] = orjson.loads(f.readline())
            if header.get("format") not in READ_FORMATS or header.get("byteorder") != sys.byteorder:
                raise SnapshotError("unknown snapshot format")
            blobs: dict[str, Section] = {}
            crc = 0
            for name, code, nbytes in header["sections"]:
                lengths = blobs.get(RUN_SECTIONS.get(name, ""))
                pieces = _section(name, code, nbytes) if lengths is None else _run_arrays(code, nbytes, lengths)
                for piece in pieces if isinstance(pieces, list) else (pieces,):
                    # Read straight into the section's memory: no copy, no second buffer.
                    if f.readinto(memoryview(piece).cast("B")) != len(piece) * _itemsize(piece):
                        raise SnapshotError("snapshot is shorter than its header says")
                    crc = zlib.crc32(piece, crc)
                blobs[name] = pieces
            if crc != header["crc"]:
                raise SnapshotError("snapshot checksum mismatch")
    except (OSError, ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
        raise SnapshotError(f"unreadable snapshot: {exc}") from exc
    return header, blobs


def _itemsize(value: array[Any] | bytearray) -> int:
    return value.itemsize if isinstance(value, array) else 1


def _run_arrays(code: str, nbytes: int, lengths: Section) -> list[array[Any]]:
    """Room for a section of runs: one array of `code` per length of `lengths` (`ValueError`
    when they do not add up to `nbytes`)."""
    if not isinstance(lengths, array) or nbytes != sum(lengths) * array(code).itemsize:
        raise ValueError(f"section of {nbytes} bytes does not hold runs of the lengths before it")
    return [array(code, [0]) * length for length in lengths]


def _section(name: str, code: str, nbytes: int) -> array[Any] | bytearray:
    """Room for section `name` of `nbytes`: a bytearray for `BYTES_SECTION` (of code "B"), else
    an array of that type code (`ValueError` when `nbytes` is not a whole number of its items)."""
    if name == BYTES_SECTION and code == "B":
        return bytearray(nbytes)
    arr = array(code)
    if nbytes % arr.itemsize:
        raise ValueError(f"section of {nbytes} bytes is not an array of {code!r}")
    return array(code, [0]) * (nbytes // arr.itemsize)


def _rebuild_calls(header: dict[str, Any], blobs: dict[str, Section]) -> tuple[CallIndex, bool]:
    """The call index from its sections and the header's names and tasks, and whether it is
    outdated: its tally rebuilt (`_load_tally`) or its columns narrowed (`_column`); raises
    `SnapshotError` when its arrays do not fit together (a missing or malformed section raises
    `KeyError`, `ValueError`, `TypeError` or `AttributeError`, which `load` reports)."""
    calls = CallIndex()
    narrowed, earlier = False, header["format"] < 4
    if earlier:  # one packed position per slot then (`index.pack`)
        blobs["call.segment"], blobs["call.offset"] = split_positions(_array(blobs, "call.pos"))
    for name, code in CallIndex.ARRAYS:
        column, converted = _column(name, code, _array(blobs, f"call.{name}"), earlier)
        setattr(calls, name, column)
        narrowed = narrowed or converted
    state = blobs["call.state"]
    calls.state = state if isinstance(state, bytearray) else bytearray(_array(blobs, "call.state"))
    calls.tools = Interned(header["tools"])
    calls.principals = Interned(header["principals"])
    if "call.tasks.lo" in blobs:
        calls.tasks = _tasks(blobs, calls)
    else:  # an earlier format's, in the header (absent from those written before tasks existed)
        calls.tasks = _header_tasks(header.pop("tasks", []), calls)
    size = len(calls.table)
    lengths_differ = any(len(getattr(calls, n)) != len(calls.state) for n, _ in CallIndex.ARRAYS[:-1])
    if size < 2 or size & (size - 1) or lengths_differ:
        raise SnapshotError("snapshot arrays do not fit together")
    calls.after_load(header.get("used"))
    return calls, _load_tally(calls, header, blobs) or narrowed


def _tasks(blobs: dict[str, Section], calls: CallIndex) -> dict[str, dict[str, int]]:
    """`CallIndex.tasks` from its sections (`_task_sections`); `ValueError` or `IndexError`
    when they do not fit together."""
    principals, los, his, id_lengths = (
        _array(blobs, f"call.tasks.{n}") for n in ("principals", "lo", "hi", "id_lengths")
    )
    task_ids = _texts(_array(blobs, "call.tasks.ids"), id_lengths)
    names = calls.principals.names
    tasks: dict[str, dict[str, int]] = {}
    for p, lo, hi, task_id in zip(principals, los, his, task_ids, strict=True):
        tasks.setdefault(names[p], {})[task_id] = hi << 64 | lo
    return tasks


def _texts(blob: array[Any], lengths: array[Any]) -> Iterator[str]:
    """The strings of `lengths` UTF-8 bytes each that `blob` holds one after another (each
    decoded from its own bytes: no copy of the whole)."""
    if sum(lengths) != len(blob):
        raise ValueError("a section of texts does not hold the lengths before it")
    data, at = memoryview(blob), 0
    for length in lengths:
        yield str(data[at : at + length], "utf-8", "surrogatepass")
        at += length


def _header_tasks(rows: list[list[str]], calls: CallIndex) -> dict[str, dict[str, int]]:
    """`CallIndex.tasks` from an earlier format's header rows `[principal, task id, hash hex,
    tool, key]`, which are consumed (each freed once it is in the dicts)."""
    rows.reverse()
    while rows:
        principal, task_id, h, _, _ = rows.pop()
        calls.put_task(task_id, int(h, 16), principal)
    return calls.tasks


def _column(name: str, code: str, column: array[Any], earlier: bool) -> tuple[array[Any], bool]:
    """Column `name` (typecode `code` in `CallIndex.ARRAYS`) as a snapshot saved it, made what
    the index keeps, and whether it had to be converted. A narrow column (`CallIndex.NARROW`)
    is kept at the width it was saved at (one of `WIDTHS`), or narrowed when the snapshot is of
    an `earlier` format (2 or 3, which saved it wide whatever its values); their 8-byte `hi` is
    cut to the bits the index keeps. Any other typecode is refused (`TypeError`)."""
    if name in CallIndex.NARROW and column.typecode in WIDTHS:
        if not earlier:
            return column, False
        narrowed = narrowest(column, code)
        return narrowed, narrowed is not column
    if column.typecode == code:
        return column, False
    if name == "hi" and column.typecode == "Q" and earlier:
        # The low 2 bytes of each 8-byte value, in the machine's byte order (the header's).
        words = memoryview(column).cast("B").cast("H")
        return array("H", words[0::4] if sys.byteorder == "little" else words[3::4]), True
    raise TypeError(f"section call.{name} has typecode {column.typecode!r}, not {code!r}")


def _rebuild_entries(blobs: dict[str, Section]) -> tuple[EntryIndex, bool]:
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
