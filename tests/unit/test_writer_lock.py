"""The one writer lock of the file and SQLite journals: who holds it, in one format, and the
SQLite journal's older `pid N` text still described."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_durable.errors import JournalLockedError
from mcp_durable.journal.writer_lock import WriterLock, describe_holder


def test_a_second_writer_is_told_who_holds_the_lock(tmp_path: Path) -> None:
    first = WriterLock(tmp_path / "LOCK", "the-journal")
    first.acquire()
    try:
        # flock locks an open file description: a second open in this process conflicts too.
        with pytest.raises(JournalLockedError) as caught:
            WriterLock(tmp_path / "LOCK", "the-journal").acquire()
        assert caught.value.path == "the-journal"
        assert caught.value.holder.startswith(f"pid {os.getpid()} on host ")
    finally:
        first.release()
    second = WriterLock(tmp_path / "LOCK", "the-journal")
    second.acquire()  # released: free again
    second.release()


def test_a_lock_file_of_the_older_sqlite_format_is_described_as_written(tmp_path: Path) -> None:
    (tmp_path / "db.lock").write_text("pid 4242")
    assert describe_holder(tmp_path / "db.lock") == "pid 4242"
    (tmp_path / "empty.lock").write_text("")
    assert describe_holder(tmp_path / "empty.lock") == "a process that has not written its name yet"
