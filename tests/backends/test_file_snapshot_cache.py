"""A snapshot is a cache: one the file journal takes on its own (every `SNAPSHOT_EVERY` frames,
at close, at open) and cannot write never fails the write, the close or the open that started
it, whether it is written from a copy or by a forked child; only an operator's `snapshot()`
raises. The fault: a directory where the snapshot's temp file would be written."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_durable.journal.file import journal as file_journal
from mcp_durable.journal.file import snapshot_child
from mcp_durable.journal.file.snapshot import snapshot_name, temp_path
from tests.backends.test_file_recovery import T0, opened, record


@pytest.mark.parametrize("in_child", [False, True], ids=["copied", "child"])
async def test_a_snapshot_that_fails_does_not_fail_the_write_that_started_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_child: bool
) -> None:
    if in_child and not snapshot_child.AVAILABLE:
        pytest.skip("snapshots by a forked child are Linux-only")
    monkeypatch.setattr(file_journal, "SNAPSHOT_IN_CHILD_AT", 0 if in_child else 10**12)
    monkeypatch.setattr(file_journal, "SNAPSHOT_EVERY", 5)
    path = tmp_path / "j"
    journal = await opened(path)
    try:
        temp_path(path, 5).mkdir()  # the snapshot the fifth write starts cannot be written
        for i in range(5):
            await journal.claim(record(f"k{i}"), T0)  # the fifth returns: it is durable
        assert not list(path.glob("*.snap"))
        for i in range(5, 10):
            await journal.claim(record(f"k{i}"), T0)  # the tenth's snapshot is written
        assert [p.name for p in path.glob("*.snap")] == [snapshot_name(10)]
    finally:
        await journal.aclose()


async def test_a_snapshot_that_fails_at_close_does_not_fail_the_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "j"
    journal = await opened(path)
    for i in range(10):
        await journal.claim(record(f"k{i}"), T0)
    monkeypatch.setattr(file_journal, "SNAPSHOT_ON_CLOSE", 5)
    temp_path(path, 10).mkdir()
    await journal.aclose()  # its snapshot fails; the close does not
    assert not list(path.glob("*.snap"))
    temp_path(path, 10).rmdir()
    again = await opened(path)
    try:
        assert again.recovery is not None and again.recovery.entries_replayed == 10
        assert len(await again.list_calls()) == 10
    finally:
        await again.aclose()
