"""`verify(directory)`: check every frame and checksum of a file journal, changing nothing.

It takes no lock, so it may run beside the writer; a frame being appended at that very moment
can then show up as a torn tail (run it again to tell a live append from damage).

Every payload is also decoded as the journal reads it (`payload_problem`): a frame whose
checksum holds but whose record the journal cannot read (an unknown state or reason, a missing
field) is reported too, since `get()` would refuse it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ...errors import JournalCorruptError, JournalError
from ..base import Problem, VerifyReport
from ..record_json import record_from_json
from .codec import record_from_list
from .framing import Damage, scan
from .segments import MANIFEST, Manifest, segment_name
from .snapshot import list_snapshots, verify_file


def verify(directory: str | Path, progress: Callable[[int, int], None] | None = None) -> VerifyReport:
    """Read every segment the manifest names, frame by frame, and every snapshot.

    `progress(done_bytes, total_bytes)` is called after each segment (and at the start).
    """
    directory = Path(directory)
    problems: list[Problem] = []
    manifest = _manifest(directory)
    if isinstance(manifest, Problem):
        return VerifyReport(0, [manifest])
    paths = [directory / segment_name(n) for n in manifest.segments]
    total = sum(p.stat().st_size for p in paths if p.exists())
    done = records = last_seq = 0
    if progress is not None:
        progress(0, total)
    for path in paths:
        try:
            # Zero bytes after the data are space allocated ahead of the writer, not damage.
            data = path.read_bytes().rstrip(b"\0")
        except FileNotFoundError:
            problems.append(Problem(str(path), 0, "segment named in the manifest is missing"))
            continue
        for item in scan(data, 0, last_seq):
            if isinstance(item, Damage):
                what = "torn or corrupt tail" if item.tail else f"damaged bytes up to offset {item.end}"
                problems.append(Problem(str(path), item.start, f"{what}: {item.reason}"))
                continue
            reason = payload_problem(data[item.start : item.start + item.length])
            if reason is not None:
                problems.append(Problem(str(path), item.offset, reason))
            records += 1
            last_seq = item.seq
        done += len(data)
        if progress is not None:
            progress(done, total)
    for snap in list_snapshots(directory):
        reason = verify_file(snap)
        if reason is not None:
            problems.append(Problem(str(snap), 0, reason))
    return VerifyReport(records, problems)


def _manifest(directory: Path) -> Manifest | Problem:
    """The journal's manifest, or why there is none to go by."""
    try:
        manifest = Manifest.read(directory)
    except JournalCorruptError as exc:
        return Problem(exc.path, exc.offset, exc.reason)
    except JournalError as exc:  # a later release's format: nothing here can be checked
        return Problem(str(directory / MANIFEST), 0, str(exc))
    if manifest is None:
        return Problem(str(directory / MANIFEST), 0, "no manifest: not a file journal")
    return manifest


def payload_problem(payload: bytes) -> str | None:
    """Why the journal cannot read a frame's payload (see `codec.py` for the kinds), or None."""
    try:
        d: Any = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        return f"payload is not JSON: {exc}"
    try:
        kind = d["t"]
        if kind == "c":
            if not isinstance(d["r"], list):
                raise TypeError("a call record frame holds an array")
            record_from_list(d["r"])
        elif kind == "call":  # an earlier release's frame
            record_from_json(d["r"])
            int(d["h"], 16)
        elif kind == "entry":
            if not (
                isinstance(d["process_id"], str)
                and isinstance(d["entry_type"], str)
                and isinstance(d["data"], dict)
                and isinstance(d["ts"], int | float)
            ):
                raise ValueError("an entry needs a process id, a type, a data object and a time")
        elif kind == "purge":
            float(d["now"])
        else:
            raise ValueError(f"unknown kind {kind!r}")
    except (KeyError, TypeError, ValueError) as exc:
        return f"the journal cannot read this payload: {type(exc).__name__}: {exc}"
    return None
