"""The file journal's `verify()` and its writer lock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mcp_durable.errors import JournalError, JournalLockedError
from mcp_durable.journal import create_journal
from mcp_durable.journal.file import FileJournal, verify

HOLDER = """
import sys, anyio
from mcp_durable.journal import create_journal
async def main():
    journal = create_journal(sys.argv[1])
    await journal.open()
    await journal.append("p", "context_update", {"from": "holder"}, 1.0)
    print("locked", flush=True)
    sys.stdin.readline()
    await journal.aclose()
anyio.run(main)
"""


async def build(path: Path, count: int = 12) -> None:
    journal = FileJournal(path)
    await journal.open()
    for i in range(count):
        await journal.append("p", "context_update", {"i": i}, float(i))
    await journal.aclose()


async def test_verify_passes_a_healthy_journal_and_reports_progress(tmp_path: Path) -> None:
    await build(tmp_path / "j")
    seen: list[tuple[int, int]] = []
    report = verify(tmp_path / "j", progress=lambda done, total: seen.append((done, total)))
    assert report.ok and report.records == 12 and report.problems == []
    assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1] > 0


async def test_verify_finds_a_flipped_byte_and_names_its_place(tmp_path: Path) -> None:
    path = tmp_path / "j"
    await build(path)
    segment = path / "seg-00000001.log"
    data = bytearray(segment.read_bytes())
    frame_starts = [0] + [i + 1 for i, b in enumerate(data) if b == 0x0A][:-1]
    target = frame_starts[7]
    data[target + 50] ^= 0x01
    segment.write_bytes(bytes(data))
    report = verify(path)
    assert not report.ok
    [problem] = report.problems
    assert problem.path == str(segment) and problem.offset == target and "checksum" in problem.reason
    assert report.records == 11


async def test_verify_reports_a_journal_without_manifest(tmp_path: Path) -> None:
    report = verify(tmp_path)
    assert not report.ok and "manifest" in report.problems[0].reason


async def test_a_second_writer_gets_journal_locked_naming_the_holder_and_a_reader_still_opens(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path}/j"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        second = create_journal(url)
        with pytest.raises(JournalLockedError) as caught:
            await second.open()
        assert f"pid {holder.pid}" in caught.value.holder and f"pid {holder.pid}" in str(caught.value)

        reader = create_journal(url + "?mode=ro")
        await reader.open()
        try:
            assert [e.data for e in await reader.entries()] == [{"from": "holder"}]
            with pytest.raises(JournalError):
                await reader.append("p", "context_update", {}, 2.0)
            assert verify(tmp_path / "j").ok
        finally:
            await reader.aclose()
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(timeout=30)
    assert holder.returncode == 0
    again = create_journal(url)  # released at close: a writer opens again
    await again.open()
    await again.aclose()


async def test_a_lock_left_by_a_killed_writer_does_not_block_the_next(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/j"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
    holder.kill()
    holder.wait(timeout=30)
    journal = create_journal(url)
    await journal.open()
    try:
        assert [e.data for e in await journal.entries()] == [{"from": "holder"}]
        assert str(os.getpid()) in (tmp_path / "j" / "LOCK").read_text()
    finally:
        await journal.aclose()


async def test_a_second_writer_in_the_same_process_is_refused_too(tmp_path: Path) -> None:
    first = FileJournal(tmp_path / "j")
    await first.open()
    try:
        with pytest.raises(JournalLockedError):
            await FileJournal(tmp_path / "j").open()
    finally:
        await first.aclose()
