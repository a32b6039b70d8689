"""The directory: segment naming, the manifest, and the few filesystem moves that must be atomic.

- Segments are `seg-NNNNNNNN.log` (a number that only grows; compaction output gets a new one).
- `MANIFEST` (JSON) is the authority on which segments make the journal, in log order. It is
  only ever replaced whole: write `MANIFEST.tmp`, fsync it, rename it over `MANIFEST`, fsync
  the directory. A segment file not in the manifest is an orphan of an interrupted rotation or
  compaction and is deleted at the next writable open. Its `format` (`FORMAT`) says which frames
  the segments may hold; a writable open of a journal of an earlier format first rewrites the
  manifest with the current one (`ManifestKeeper`).
"""

from __future__ import annotations

import os
import re
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

import orjson

from ...errors import JournalCorruptError, JournalError
from ..fsync import fsync_dir as fsync_dir  # re-exported: the file journal's modules import it from here

#: The manifest's `format`: 1, the first release; 2, call records in compact `c` frames
#: (`codec.py`; frames of format 1 are still read). A journal of a later format is refused: its
#: frames may mean what this release cannot read.
FORMAT = 2
MANIFEST = "MANIFEST"
LOCK = "LOCK"
_SEGMENT_RE = re.compile(r"^seg-(\d{8,})\.log$")
DIR_MODE = 0o700
FILE_MODE = 0o600


def segment_name(number: int) -> str:
    return f"seg-{number:08d}.log"


def segment_number(name: str) -> int | None:
    match = _SEGMENT_RE.match(name)
    return int(match.group(1)) if match else None


#: A whole file is synced every this many bytes as it is written, not only at its end. A file
#: system that commits metadata together with the data written before it (ext4's default,
#: `data=ordered`) makes the segments' next `fdatasync` wait for every dirty byte its commit
#: carries: a snapshot or a compacted segment of hundreds of megabytes written whole would hold
#: the calls being committed meanwhile for as long as the disk takes to write all of it.
SYNC_EVERY = 8 * 1024 * 1024


def write_synced(path: Path, chunks: Iterable[bytes | memoryview], *, create_new: bool = False) -> None:
    """Create (or truncate) `path` holding `chunks` in order, and fsync it before returning;
    with `create_new`, a `path` that exists is an error (`FileExistsError`), not truncated.

    The one write-and-fsync loop of the file journal's whole files (manifest, snapshots,
    compacted segments, bytes kept aside): `chunks` may be a generator, so a large file is
    written piece by piece. The directory entry is the caller's to fsync (`fsync_dir`), after
    a rename if there is one."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if create_new else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        unsynced = 0
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                written = os.write(fd, view[:SYNC_EVERY])
                view = view[written:]
                unsynced += written
                if unsynced >= SYNC_EVERY:
                    os.fdatasync(fd)  # bounds what the segments' next sync may wait for
                    unsynced = 0
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace `path` with `data` so that a crash leaves either the old or the new file, whole."""
    tmp = path.with_name(path.name + ".tmp")
    write_synced(tmp, [data])
    os.replace(tmp, path)
    fsync_dir(path.parent)


@dataclass(frozen=True, slots=True)
class Manifest:
    """The journal's identity and its segments in log order (the last one is the active one)."""

    journal_id: str
    hash_key: bytes
    segments: tuple[int, ...]
    next_segment: int
    #: Sequence numbers below this were used (compaction may drop the frames that held them).
    seq_floor: int = 0
    format: int = FORMAT
    extra: dict[str, object] = field(default_factory=dict)

    @classmethod
    def new(cls) -> Manifest:
        return cls(secrets.token_hex(8), secrets.token_bytes(16), (1,), 2)

    def to_bytes(self) -> bytes:
        return orjson.dumps(
            {
                "format": self.format,
                "journal_id": self.journal_id,
                "hash_key": self.hash_key.hex(),
                "segments": [segment_name(n) for n in self.segments],
                "next_segment": self.next_segment,
                "seq_floor": self.seq_floor,
            },
            option=orjson.OPT_INDENT_2,
        )

    @classmethod
    def read(cls, directory: Path) -> Manifest | None:
        path = directory / MANIFEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            d = orjson.loads(raw)
            found = [segment_number(name) for name in d["segments"]]
            numbers = tuple(n for n in found if n is not None)
            if len(numbers) != len(found) or not numbers:
                raise ValueError("bad segment list")
            manifest = cls(
                d["journal_id"],
                bytes.fromhex(d["hash_key"]),
                numbers,
                int(d["next_segment"]),
                int(d.get("seq_floor", 0)),
                int(d["format"]),
            )
        except (orjson.JSONDecodeError, KeyError, ValueError, TypeError) as exc:
            raise JournalCorruptError(str(path), 0, f"unreadable manifest: {exc}") from exc
        if manifest.format > FORMAT:
            raise JournalError(
                f"journal {directory} is of format {manifest.format}, written by a later release; "
                f"this release reads formats up to {FORMAT}"
            )
        return manifest

    def write(self, directory: Path) -> None:
        atomic_write(directory / MANIFEST, self.to_bytes())


class ManifestKeeper:
    """The current manifest of a writable journal; every change goes through one lock.

    Rotation (the group-commit thread) and compaction (a worker thread) both change the segment
    list; the lock makes each read-modify-write of the manifest whole.
    """

    def __init__(self, directory: Path, manifest: Manifest) -> None:
        self.directory = directory
        self.lock = threading.Lock()
        if manifest.format < FORMAT:
            # This writer's frames are of the current format: the manifest says so before the
            # first of them is written (a release that knows formats refuses one it does not).
            manifest = replace(manifest, format=FORMAT)
            manifest.write(directory)
        self.current = manifest

    def add_segment(self, number: int) -> None:
        """Create segment `number` (empty, fsynced) and append it to the manifest."""
        with self.lock:
            path = self.directory / segment_name(number)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            m = self.current
            updated = replace(m, segments=(*m.segments, number), next_segment=max(m.next_segment, number + 1))
            updated.write(self.directory)
            self.current = updated

    def replace_segments(self, old: tuple[int, ...], new: int, seq_floor: int) -> None:
        """Swap the leading segments `old` for the compacted segment `new` (one atomic rename)."""
        with self.lock:
            m = self.current
            if m.segments[: len(old)] != old:
                raise RuntimeError("compacted segments are no longer the head of the manifest")
            updated = replace(
                m,
                segments=(new, *m.segments[len(old) :]),
                next_segment=max(m.next_segment, new + 1),
                seq_floor=max(m.seq_floor, seq_floor),
            )
            updated.write(self.directory)
            self.current = updated

    def allocate(self) -> int:
        """A fresh segment number (recorded in the manifest at the next change)."""
        with self.lock:
            number = self.current.next_segment
            self.current = replace(self.current, next_segment=number + 1)
            return number
