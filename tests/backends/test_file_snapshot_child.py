"""Snapshots written by a forked child (`snapshot_child`).

The invariants: a child writes the same bytes a copy in the loop would; it holds nothing of the
parent's (no descriptor but its report pipe) and dies with it; a child that does not finish is
killed and reaped, its temp file removed, and the journal goes on; and while it writes, the
group commit flushes in a thread. A child's failure, like a copy's, never fails the write that
started the snapshot (`test_file_snapshot_cache`).

A child is held in the middle of its snapshot, without any stand-in for our code, by a FIFO at
its temp file's name: its `open` blocks until a reader comes, which none does.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import anyio
import pytest

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallState
from mcp_durable.journal.file import FileJournal, snapshot_child
from mcp_durable.journal.file import journal as file_journal
from mcp_durable.journal.file.snapshot import snapshot_name, temp_path
from mcp_durable.journal.model import Fence
from tests.backends.test_file_recovery import T0, opened, record

ROOT = Path(__file__).resolve().parents[2]

needs_fork = pytest.mark.skipif(not snapshot_child.AVAILABLE, reason="snapshots by a forked child are Linux-only")


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found.extend(int(n) for n in text)
    return found


def _gone(pid: int) -> bool:
    """Dead: no such process, or a zombie not yet reaped by whoever adopted it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


def _wait_for(condition: object, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.01)


async def _ten_records(path: Path) -> FileJournal:
    """An open journal holding ten claims (frames 1 to 10: its next snapshot is of seq 10)."""
    journal = await opened(path)
    for i in range(10):
        await journal.claim(record(f"k{i}"), T0)
    return journal


async def _varied(path: Path) -> FileJournal:
    """A journal holding records of every kind a snapshot saves: open and completed calls, an
    expiry, a purge, a task, steps and checkpoints."""
    journal = await opened(path)
    for i in range(200):
        await journal.claim(record(f"k{i}"), T0)
    for i in range(0, 200, 3):
        done = record(f"k{i}", version=2, state=CallState.COMPLETED, result=b'{"ok":1}', expires_at=T0 + i)
        assert await journal.swap(1, done)
    task = replace(record("task"), task_id="task-1")
    await journal.claim(task, T0)
    fence = Fence("A", task.run_id, task.attempts)
    for step in range(5):
        assert await journal.append_step(task.identity, fence, step, {"result": "r"}, T0 + step) is not None
    await journal.append("p", "checkpoint", {"context_state": {"n": 1}}, T0)
    assert await journal.purge_expired(T0 + 30) > 0
    return journal


@needs_fork
async def test_a_child_writes_the_bytes_a_copy_in_the_loop_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "j"
    journal = await _varied(path)
    try:
        monkeypatch.setattr(file_journal, "SNAPSHOT_IN_CHILD_AT", 0)
        by_child = await journal.snapshot()
        assert by_child is not None
        written_by_child = (path / by_child).read_bytes()
        monkeypatch.setattr(file_journal, "SNAPSHOT_IN_CHILD_AT", 10**12)
        by_copy = await journal.snapshot()
        assert by_copy == by_child  # the same seq: nothing was written between
        assert (path / by_copy).read_bytes() == written_by_child
        monkeypatch.setattr(file_journal, "SNAPSHOT_IN_CHILD_AT", 0)
        assert await journal.snapshot() == by_child
        before = {r.identity: r for r in await journal.list_calls()}
    finally:
        await journal.aclose()
    assert _children(os.getpid()) == []  # every child reaped
    again = await opened(path)
    try:
        assert again.recovery is not None and again.recovery.snapshot_used == by_child
        assert again.recovery.entries_replayed == 0
        assert {r.identity: r for r in await again.list_calls()} == before
    finally:
        await again.aclose()


# The process that holds the journal, in the middle of a snapshot by a child held on a FIFO.
HOLDER = """
import os, sys, anyio
from pathlib import Path
from mcp_durable.journal.file import FileJournal, journal as file_journal
from mcp_durable.journal.file.snapshot import temp_path
from tests.backends.test_file_recovery import T0, record

file_journal.SNAPSHOT_IN_CHILD_AT = 0

async def main() -> None:
    path = Path(sys.argv[1])
    journal = FileJournal(path)
    await journal.open()
    for i in range(10):
        await journal.claim(record(f"k{i}"), T0)
    os.mkfifo(temp_path(path, 10))
    print("snapshot", flush=True)
    await journal.snapshot()
    print("returned", flush=True)

anyio.run(main)
"""


@needs_fork
def test_a_child_holds_nothing_of_its_parent_and_dies_with_it(tmp_path: Path) -> None:
    path = tmp_path / "j"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    child = None
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "snapshot\n"
        _wait_for(lambda: _children(holder.pid), "the snapshot's child was forked")
        (child,) = _children(holder.pid)
        # Blocked opening the FIFO: it holds its report pipe and nothing else of the parent's
        # (not the writer lock, not the segments, not the parent's stdout).
        _wait_for(lambda: len(os.listdir(f"/proc/{child}/fd")) == 1, "the child closed what it inherited")
        (fd,) = os.listdir(f"/proc/{child}/fd")
        assert os.readlink(f"/proc/{child}/fd/{fd}").startswith("pipe:")
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        _wait_for(lambda: _gone(child), "the child died with its parent")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        if child is not None and not _gone(child):
            os.kill(child, signal.SIGKILL)  # a failed run leaves no child blocked on the FIFO
    # The writer lock is free at once, and the next open reads all ten records.
    journal = FileJournal(path)

    async def reopen() -> int:
        await journal.open()
        try:
            return len(await journal.list_calls())
        finally:
            await journal.aclose()

    assert anyio.run(reopen) == 10
    assert not temp_path(path, 10).exists()  # the orphaned FIFO was removed at the open


@needs_fork
async def test_a_child_that_does_not_finish_is_killed_and_the_journal_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(file_journal, "SNAPSHOT_IN_CHILD_AT", 0)
    monkeypatch.setattr(file_journal, "SNAPSHOT_CHILD_PATIENCE", 0.5)
    path = tmp_path / "j"
    journal = await _ten_records(path)
    try:
        os.mkfifo(temp_path(path, 10))
        with pytest.raises(JournalError, match="did not finish") as caught:
            await journal.snapshot()
        assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.ETIMEDOUT
        assert _children(os.getpid()) == []  # killed and reaped
        assert not temp_path(path, 10).exists()
        await journal.claim(record("after"), T0)
        name = await journal.snapshot()
        assert name == snapshot_name(11)
    finally:
        await journal.aclose()
    again = await opened(path)
    try:
        assert again.recovery is not None and again.recovery.snapshot_used == snapshot_name(11)
        assert len(await again.list_calls()) == 11
    finally:
        await again.aclose()


@needs_fork
async def test_a_child_reports_its_storage_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_journal, "SNAPSHOT_IN_CHILD_AT", 0)
    path = tmp_path / "j"
    journal = await _ten_records(path)
    try:
        temp_path(path, 10).mkdir()  # where the child would write: it cannot open a directory
        with pytest.raises(JournalError, match="in the snapshot's child") as caught:
            await journal.snapshot()
        assert isinstance(caught.value.__cause__, OSError) and caught.value.__cause__.errno == errno.EISDIR
        assert _children(os.getpid()) == []
    finally:
        await journal.aclose()


@needs_fork
async def test_while_a_snapshot_is_written_every_flush_runs_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A flush's `fdatasync` may wait for the snapshot's writeback, which the group commit's
    moving average cannot foresee: inline, that wait would hold the event loop."""
    monkeypatch.setattr(file_journal, "SNAPSHOT_IN_CHILD_AT", 0)
    monkeypatch.setattr(file_journal, "SNAPSHOT_CHILD_PATIENCE", 2.0)
    path = tmp_path / "j"
    journal = await _ten_records(path)
    commit = journal._commit
    assert commit is not None
    try:
        commit.flush_s = 0.0  # as on a fast disk: a flush would run inline
        threaded = commit.threaded
        await journal.claim(record("before"), T0)
        assert commit.threaded == threaded  # inline
        os.mkfifo(temp_path(path, 11))

        async def snapshot() -> None:
            with pytest.raises(JournalError, match="did not finish"):
                await journal.snapshot()

        async with anyio.create_task_group() as tg:
            tg.start_soon(snapshot)
            while not _children(os.getpid()):
                await anyio.sleep(0.01)
            commit.flush_s = 0.0
            await journal.claim(record("during"), T0)
            assert commit.threaded == threaded + 1
        commit.flush_s = 0.0
        await journal.claim(record("after"), T0)
        assert commit.threaded == threaded + 1  # inline again
    finally:
        await journal.aclose()
