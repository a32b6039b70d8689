"""Moving a journal between backends: export to JSON lines, import from them.

The format is one JSON object per line:

    {"type": "header", "format": "mcp-durable-journal", "version": 1, "calls": N, "entries": M}
    {"type": "call", "principal": …, "tool": …, "key": …, "state": …, "version": …, …}
    {"type": "entry", "process_id": …, "entry_type": …, "data": {…}, "ts": …, "seq": …}

A call line holds every `CallRecord` field; the byte fields (`result`, `arguments`) are written
as text when they are UTF-8 (they always are when the MCP face wrote them) and as base64 under
`result_b64` / `arguments_b64` otherwise, so every record round-trips byte for byte; `reason`
only when it is set (a line of an earlier release has none: it imports with `legacy_reason`,
`record_json`). Entries are written in `seq` order; the importing journal numbers them anew, in
the same order (durable steps included: `append` writes them as they are).

Import inserts each record with `claim(record, now=-inf)`: a record whose identity the target
already holds is kept as it is and counted as skipped (an import never overwrites). An entry
the target already holds (the same process, type, time and data) is not appended again: each
one present in the target stands for one such line of the export, so an import that was
interrupted, or run twice, can be run again without doubling any process's history.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from ..errors import JournalError
from ..keys import canonical_json
from .base import CallCursor, CallQuery, Journal
from .model import CallIdentity, CallRecord, JournalEntry
from .record_json import record_from_json, record_to_json

FORMAT = "mcp-durable-journal"
VERSION = 1
_PAGE = 500

Progress = Callable[[int], None]  # called with how many items were just done


def call_to_json(record: CallRecord) -> dict[str, Any]:
    """A call record as one export line's object (every field; `record_json`)."""
    return {"type": "call", **record_to_json(record)}


def call_from_json(line: dict[str, Any]) -> CallRecord:
    """The call record of an export line (raises KeyError/ValueError when it is not one)."""
    return record_from_json(line)


def entry_to_json(entry: JournalEntry) -> dict[str, Any]:
    return {
        "type": "entry",
        "process_id": entry.process_id,
        "entry_type": entry.entry_type,
        "data": entry.data,
        "ts": entry.ts,
        "seq": entry.seq,
    }


async def iter_calls(journal: Journal, **filters: Any) -> AsyncIterator[CallRecord]:
    """Every call record (newest first), page by page."""
    cursor: CallCursor | None = None
    while True:
        page = await journal.list_calls(CallQuery(limit=_PAGE, cursor=cursor, **filters))
        for record in page:
            yield record
        if len(page) < _PAGE:
            return
        cursor = CallCursor.after(page[-1])


async def iter_entries(journal: Journal, after: int = 0) -> AsyncIterator[JournalEntry]:
    """Every process entry after `after`, in `seq` order."""
    while True:
        page = await journal.entries(after=after, limit=_PAGE)
        for entry in page:
            yield entry
        if len(page) < _PAGE:
            return
        after = page[-1].seq


@dataclass(slots=True)
class TransferCounts:
    """What an export or import moved (`skipped`: records the target already held)."""

    calls: int = 0
    entries: int = 0
    skipped: int = 0
    skipped_identities: list[CallIdentity] = field(default_factory=list)
    skipped_entries: int = 0  # entries the target already held


async def totals(journal: Journal) -> tuple[int, int]:
    """How many call records and entries `journal` holds (for progress bars)."""
    stats = await journal.stats()
    return sum(stats.calls_by_state.values()), stats.entries


EXPORT_FILE_MODE = 0o600  # like the journal's own files: every record's arguments and results


def open_export_file(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open `path` to write an export into, readable by its owner only (0600, whatever the umask).

    An export holds every record's arguments and results, so it gets the journal's own file
    mode. A file that already exists is truncated and has its mode narrowed before any byte is
    written (`O_CREAT`'s mode applies only to a new file).
    """
    fd = os.open(Path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, EXPORT_FILE_MODE)
    try:
        os.fchmod(fd, EXPORT_FILE_MODE)
        return os.fdopen(fd, "wb")
    except BaseException:
        os.close(fd)
        raise


async def export_journal(journal: Journal, out: IO[bytes], progress: Progress | None = None) -> TransferCounts:
    """Write every call record and entry of an open journal to `out` as JSON lines."""
    calls, entries = await totals(journal)
    header = {"type": "header", "format": FORMAT, "version": VERSION, "calls": calls, "entries": entries}
    out.write(orjson.dumps(header) + b"\n")
    counts = TransferCounts()
    async for record in iter_calls(journal):
        out.write(orjson.dumps(call_to_json(record)) + b"\n")
        counts.calls += 1
        if progress is not None:
            progress(1)
    async for entry in iter_entries(journal):
        out.write(orjson.dumps(entry_to_json(entry)) + b"\n")
        counts.entries += 1
        if progress is not None:
            progress(1)
    return counts


def read_header(first_line: bytes) -> dict[str, Any]:
    """Parse and check an export's header line; raises `JournalError` when it is not one."""
    try:
        header = orjson.loads(first_line)
    except orjson.JSONDecodeError as exc:
        raise JournalError(f"not a journal export (line 1 is not JSON: {exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise JournalError("not a journal export (line 1 is not an mcp-durable-journal header)")
    if header.get("version") != VERSION:
        raise JournalError(f"journal export version {header.get('version')!r} is not supported (expected {VERSION})")
    return header


def _entry_digest(process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> bytes:
    """What makes two entries the same entry, whatever seq each journal gave it."""
    return hashlib.sha256(canonical_json([process_id, entry_type, ts, data])).digest()


async def _entries_present(journal: Journal) -> Counter[bytes]:
    """How many times the target holds each entry (32 bytes per distinct entry in memory)."""
    present: Counter[bytes] = Counter()
    async for entry in iter_entries(journal):
        present[_entry_digest(entry.process_id, entry.entry_type, entry.data, entry.ts)] += 1
    return present


async def import_journal(journal: Journal, lines: Iterable[bytes], progress: Progress | None = None) -> TransferCounts:
    """Insert an export's records and entries into an open journal (existing ones are kept).

    `lines` are the export's lines after its header. Raises `JournalError` naming the line of
    anything that is not a call or an entry.
    """
    counts = TransferCounts()
    present: Counter[bytes] | None = None  # read at the first entry line: most imports have calls only
    for number, raw in enumerate(lines, start=2):
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
            kind = line.get("type")
            if kind == "call":
                record = call_from_json(line)
            elif kind == "entry":
                entry = JournalEntry(
                    str(line["process_id"]), str(line["entry_type"]), dict(line["data"]), float(line["ts"])
                )
            else:
                raise ValueError(f"unknown line type {kind!r}")
        except (orjson.JSONDecodeError, KeyError, ValueError, TypeError, AttributeError) as exc:
            raise JournalError(f"journal export line {number}: {exc}") from None
        if kind == "call":
            # `now=-inf`: nothing counts as expired, so an identity already present is never replaced.
            won, _ = await journal.claim(record, float("-inf"))
            if won:
                counts.calls += 1
            else:
                counts.skipped += 1
                counts.skipped_identities.append(record.identity)
        else:
            if present is None:
                present = await _entries_present(journal)
            digest = _entry_digest(entry.process_id, entry.entry_type, entry.data, entry.ts)
            if present[digest] > 0:
                present[digest] -= 1  # one held entry answers for one line, so repeats stay repeats
                counts.skipped_entries += 1
            else:
                await journal.append(entry.process_id, entry.entry_type, entry.data, entry.ts)
                counts.entries += 1
        if progress is not None:
            progress(1)
    return counts
