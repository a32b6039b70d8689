"""A snapshot written by a forked child, so that the event loop neither copies the index nor waits.

`snapshot.capture` copies every array of the index in the event loop, so that a worker thread
can write a consistent image while the loop goes on changing the index. That copy grows with
the journal: at ten million records it is about half a gigabyte, taken while nothing else in the
process runs, and held beside the index until the write ends. `os.fork` gives the same
consistent image for the price of the page tables: the child sees the index as it was at the
fork (copy on write), writes it with `snapshot.write_temp`, and exits; the parent goes on at
once, and only the pages it changes meanwhile are copied.

The child's contract, which is what makes forking a process with threads safe here:

- It runs only code already imported and takes no lock another thread may have held at the
  fork: no logging, no file objects, `os` calls on the descriptors it opens itself. It collects
  no garbage (a collection would touch every object's page, and so copy it).
- It first closes every descriptor it inherited but its report pipe: it holds no socket, no
  pipe of a stdio transport and no writer lock (`flock`) of the parent's, so no client and no
  next writer waits on it.
- It dies with the thread that forked it (`PR_SET_PDEATHSIG`), and leaves at once if that
  thread's process is already gone.
- It reports on the pipe, `ok <temp file name>` or `error <errno> <text>`, and leaves with
  `os._exit` (no exit handlers, no buffers flushed twice).

The parent reads the report in a worker thread (`wait`) and reaps the child. A child that has
not reported after `patience` seconds (stopped, or stuck, against every expectation) is killed
and the snapshot fails as a storage fault does; its temp file is removed. A snapshot is a cache:
a failed one costs the next open a longer replay, never a record.

Linux only (`AVAILABLE`: `fork`, and `prctl` through libc); elsewhere, and when `fork` fails
(no memory to commit for the child, no process slot), the journal copies the index as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import gc
import os
import select
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .index import CallIndex, EntryIndex
from .snapshot import capture, temp_path, write_temp

PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """libc's `prctl`, loaded now (the child must not load anything), or None off Linux."""
    if sys.platform != "linux" or not hasattr(os, "fork"):
        return None
    try:
        # The process's own symbols, libc's among them: `find_library` would start a subprocess.
        libc = ctypes.CDLL(None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
        return prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _prctl()
#: Whether snapshots can be written by a forked child on this system.
AVAILABLE = _PRCTL is not None


@dataclass(slots=True)
class Child:
    """A forked child writing the snapshot of `seq` into `directory`, reporting on `report`."""

    pid: int
    report: int
    directory: Path
    seq: int

    @property
    def temp(self) -> Path:
        return temp_path(self.directory, self.seq)


def start(
    directory: Path, calls: CallIndex, entries: EntryIndex, seq: int, segments: tuple[int, ...], end: int
) -> Child | None:
    """Fork a child that writes the snapshot of the index as it is now; None when no child can
    be forked here (the caller copies the index instead). Call it from the thread that changes
    the index, with no await between choosing `seq`, `segments`, `end` and this call."""
    if not AVAILABLE:
        return None
    read_end, write_end = os.pipe()
    parent = os.getpid()
    try:
        with warnings.catch_warnings():
            # From Python 3.12 every fork of a process with threads warns, in the parent (an
            # error filter turns it into an unraisable report, never an exception). The
            # child's contract (the module's docstring) is what makes this fork safe: the
            # warning would be noise in a server's log at every snapshot.
            warnings.filterwarnings(
                "ignore", message=".*use of fork\\(\\) may lead to deadlocks", category=DeprecationWarning
            )
            pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return None
    if pid == 0:  # pragma: no cover - the child's lines run in the child, which coverage does not follow
        _child(write_end, parent, directory, calls, entries, seq, segments, end)
    os.close(write_end)
    return Child(pid, read_end, directory, seq)


def _child(
    report: int,
    parent: int,
    directory: Path,
    calls: CallIndex,
    entries: EntryIndex,
    seq: int,
    segments: tuple[int, ...],
    end: int,
) -> NoReturn:  # pragma: no cover - runs in the forked child
    status = 1
    try:
        gc.disable()
        assert _PRCTL is not None
        _PRCTL(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)  # the parent died before the death signal was armed
        _default_signals()
        os.closerange(0, report)
        os.closerange(report + 1, max(os.sysconf("SC_OPEN_MAX"), report + 2))
        tmp = write_temp(directory, capture(calls, entries, seq, segments, end, copy=False))
        _report(report, b"ok " + os.fsencode(tmp.name))
        status = 0
    except OSError as exc:
        _report(report, f"error {exc.errno or 0} {exc.strerror or exc}".encode("utf-8", "replace"))
    except BaseException as exc:  # noqa: BLE001 - anything else is a failed snapshot, reported
        _report(report, f"error 0 {type(exc).__name__}: {exc}".encode("utf-8", "replace"))
    finally:
        os._exit(status)


def _default_signals() -> None:  # pragma: no cover - runs in the forked child
    """SIGINT and SIGTERM end the child, and no signal is written to the parent's loop (its
    handlers and wakeup descriptor were inherited). Python allows this only in the main
    thread, which the forking thread becomes in the child on the CPython releases known;
    where it does not, the inherited handlers stay, and write only to closed descriptors."""
    try:
        signal.set_wakeup_fd(-1)
        for number in (signal.SIGINT, signal.SIGTERM):
            signal.signal(number, signal.SIG_DFL)
    except ValueError:
        pass


def _report(fd: int, message: bytes) -> None:  # pragma: no cover - runs in the forked child
    view = memoryview(message)
    while view:
        view = view[os.write(fd, view) :]


def wait(child: Child, patience: float) -> Path:
    """Block until the child reports (a worker thread's call), reap it, and return its temp file.

    `OSError` when it failed (its own error), died without a report, or did not report within
    `patience` seconds (then it is killed first); its temp file is removed in each case."""
    deadline = time.monotonic() + patience
    message = bytearray()
    timed_out = False
    poll = select.poll()  # not select(): a busy server's descriptors pass FD_SETSIZE
    poll.register(child.report, select.POLLIN)
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not poll.poll(remaining * 1000):
                timed_out = True
                os.kill(child.pid, signal.SIGKILL)
                break
            chunk = os.read(child.report, 4096)
            if not chunk:
                break
            message += chunk
    finally:
        os.close(child.report)
        _reap(child.pid)
    if message.startswith(b"ok ") and not timed_out:
        return child.directory / os.fsdecode(bytes(message[3:]))
    with contextlib.suppress(OSError):  # not a file (what the child could not open, say): left as it is
        child.temp.unlink(missing_ok=True)
    if timed_out:
        raise OSError(errno.ETIMEDOUT, f"the snapshot's child (pid {child.pid}) did not finish in {patience:g} s")
    if message.startswith(b"error "):
        code, _, text = bytes(message[6:]).decode("utf-8", "replace").partition(" ")
        raise OSError(int(code) if code.isdigit() else 0, f"in the snapshot's child: {text}")
    raise OSError(errno.ECHILD, f"the snapshot's child (pid {child.pid}) ended without a report")


def _reap(pid: int) -> None:
    """Wait for the child's exit. Another part of the process may have reaped it first (a
    `waitpid(-1)` of someone's child watcher): the report, not the exit status, says how it went."""
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass
