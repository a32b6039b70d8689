"""The writer lock: one writing process per journal directory.

`LOCK` is held with `fcntl.flock(LOCK_EX | LOCK_NB)` for as long as the journal is open for
writing; the kernel drops it when the process dies (even by SIGKILL), so a crash never leaves
a stale lock. While held, the file says who holds it (`{"pid", "host", "started_at"}`), which
a second writer reports in its `JournalLockedError`. Read-only opens take no lock.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from pathlib import Path

import orjson

from ...errors import JournalError, JournalLockedError
from .segments import FILE_MODE, LOCK


class WriterLock:
    """An exclusive, non-blocking lock on `directory/LOCK`."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / LOCK
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = describe_holder(self.path)
            os.close(fd)
            raise JournalLockedError(str(self.path.parent), holder) from None
        except OSError as exc:
            os.close(fd)
            raise JournalError(f"cannot lock {self.path}: {exc}") from exc
        info = orjson.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(),
             "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
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
    """Who holds the lock, as its file says (`pid 123 on host h since …`)."""
    try:
        info = orjson.loads(path.read_bytes() or b"{}")
    except (OSError, orjson.JSONDecodeError):
        info = {}
    if not info:
        return "a process that has not written its name yet"
    return f"pid {info.get('pid')} on host {info.get('host')} since {info.get('started_at')}"
