"""The writer lock: one writing process per journal (the file journal's `LOCK`, the SQLite
journal's `PATH.lock` with `?single_writer=1`).

The lock file is held with `fcntl.flock(LOCK_EX | LOCK_NB)` for as long as the journal is open
for writing; the kernel drops it when the process dies (even by SIGKILL), so a crash never
leaves a stale lock. While held, the file says who holds it (`{"pid", "host", "started_at"}`,
one JSON line), which a second writer reports in its `JournalLockedError`. Read-only opens
take no lock.

Before this format was shared, the SQLite journal wrote `pid N` as plain text; a lock file
from then is still described (its text as it stands), since a holder of an older version may
still be running beside a newer one.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

import orjson

from ..errors import JournalError, JournalLockedError

#: Like the journals' own files: only the owner reads who holds the lock.
LOCK_FILE_MODE = 0o600


class WriterLock:
    """An exclusive, non-blocking lock on the file `path`, for the journal named `journal`
    (what `JournalLockedError` says is locked)."""

    def __init__(self, path: Path, journal: str) -> None:
        self.path = path
        self.journal = journal
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, LOCK_FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_holder(self.path)
            os.close(fd)
            raise JournalLockedError(self.journal, holder) from None
        except OSError as exc:
            os.close(fd)
            raise JournalError(f"cannot lock {self.path}: {exc}") from exc
        info = orjson.dumps(
            {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
        )
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, info + b"\n", 0)
        except OSError as exc:  # e.g. a full disk: let go, or this process locks itself out
            os.close(fd)
            raise JournalError(f"cannot write {self.path}: {exc}") from exc
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.ftruncate(fd, 0)
            finally:
                os.close(fd)  # closing the descriptor releases the flock


def describe_holder(path: Path) -> str:
    """Who holds the lock, as its file says (`pid 123 on host h since …`; an older SQLite
    journal's plain `pid 123` as it stands)."""
    try:
        text = path.read_bytes().strip()
    except OSError:
        text = b""
    if not text:
        return "a process that has not written its name yet"
    try:
        info = orjson.loads(text)
    except orjson.JSONDecodeError:
        return text[:200].decode(errors="replace")
    if not isinstance(info, dict):
        return text[:200].decode(errors="replace")
    return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('started_at')}"
