"""Compaction of the file journal: what it drops, what it keeps, and crashes in the middle of it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Fence
from mcp_durable.journal.file import FileJournal, verify

T0 = 1_700_000_000.0
ROOT = Path(__file__).resolve().parents[2]
SEGMENT = 2_000  # small segments, so the journal spans several

COMPACT_CHILD = """
import os, signal, sys, anyio
from mcp_durable.journal.file import FileJournal
def kill_at(wanted):
    def at_phase(name):
        if name == wanted:
            os.kill(os.getpid(), signal.SIGKILL)
    return at_phase
async def main():
    journal = FileJournal(sys.argv[1], segment_bytes=int(sys.argv[2]))
    await journal.open()
    await journal.compact(float(sys.argv[3]), at_phase=kill_at(sys.argv[4]))
    await journal.aclose()
anyio.run(main)
"""


def call(
    key: str,
    version: int,
    state: CallState,
    *,
    expires_at: float | None = None,
    result: bytes | None = None,
    lease: float = 30,
) -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f",
        state=state,
        version=version,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner="A",
        lease_until=T0 + lease,
        result=result,
        expires_at=expires_at,
        arguments=b'{"order":"%s"}' % key.encode(),
    )


async def build(path: Path) -> dict[str, CallRecord]:
    """A journal with live, expired and much-renewed records and process entries; the live records."""
    journal = FileJournal(path, segment_bytes=SEGMENT)
    await journal.open()
    live: dict[str, CallRecord] = {}
    for i in range(12):
        key = f"live-{i}"
        await journal.claim(call(key, 1, CallState.PENDING), T0)
        done = call(key, 2, CallState.COMPLETED, result=b'{"refund":"re_%d"}' % i, expires_at=T0 + 1000)
        assert await journal.swap(1, done)
        live[key] = done
    for i in range(8):
        key = f"old-{i}"
        await journal.claim(call(key, 1, CallState.PENDING), T0)
        assert await journal.swap(1, call(key, 2, CallState.COMPLETED, result=b"{}", expires_at=T0 + 10))
    await journal.claim(call("running", 1, CallState.PENDING), T0)
    for n in range(40):  # superseded versions: only the last lease survives compaction
        assert await journal.renew(
            CallIdentity("local", "refund", "running"), Fence("A", "run-running", 1), T0 + 100 + n
        )
    live["running"] = call("running", 1, CallState.PENDING, lease=139)
    for i in range(10):
        await journal.append("worker", "context_update", {"last_done": i}, float(i))
    await journal.aclose()
    return live


async def check(path: Path, live: dict[str, CallRecord], entries: int = 10) -> FileJournal:
    journal = FileJournal(path, segment_bytes=SEGMENT)
    await journal.open()
    for key, expected in live.items():
        assert await journal.get(expected.identity) == expected, key
    for i in range(8):
        assert await journal.get(CallIdentity("local", "refund", f"old-{i}")) is None
    assert [e.data["last_done"] for e in await journal.entries(process_id="worker")] == list(range(entries))
    return journal


async def test_compaction_drops_expired_records_and_superseded_versions_and_keeps_the_live(tmp_path: Path) -> None:
    path = tmp_path / "j"
    live = await build(path)
    journal = FileJournal(path, segment_bytes=SEGMENT)
    await journal.open()
    try:
        report = await journal.compact(T0 + 50)
        assert report.records_purged == 8
        assert report.records_kept == len(live) and report.entries_kept == 10
        assert report.segments_before > 1 and report.segments_after <= 2
        assert report.bytes_after < report.bytes_before / 2
        for expected in live.values():
            assert await journal.get(expected.identity) == expected
        await journal.append("worker", "context_update", {"last_done": 10}, 10.0)
    finally:
        await journal.aclose()
    reopened = await check(path, live, entries=11)
    try:
        assert reopened.recovery is not None and not reopened.recovery.problems
    finally:
        await reopened.aclose()
    assert verify(path).ok


async def test_a_record_changed_during_compaction_keeps_its_newest_version(tmp_path: Path) -> None:
    path = tmp_path / "j"
    live = await build(path)
    journal = FileJournal(path, segment_bytes=SEGMENT)
    await journal.open()
    try:
        import anyio

        updated = live["live-0"].evolve(state=CallState.FAILED, result=b'{"isError":true}')
        async with anyio.create_task_group() as group:
            group.start_soon(journal.compact, T0 + 50)
            await anyio.sleep(0)
            assert await journal.swap(2, updated)
        assert await journal.get(updated.identity) == updated
    finally:
        await journal.aclose()
    live["live-0"] = updated
    await (await check(path, live)).aclose()


@pytest.mark.parametrize("phase", ["compaction:copied", "compaction:switched", "compaction:deleted"])
async def test_a_crash_at_any_phase_of_compaction_leaves_every_live_record(tmp_path: Path, phase: str) -> None:
    path = tmp_path / "j"
    live = await build(path)
    segments_before = sorted(p.name for p in path.glob("seg-*.log"))
    child = subprocess.run(
        [sys.executable, "-c", COMPACT_CHILD, str(path), str(SEGMENT), str(T0 + 50), phase],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == -9, child.stderr.decode()
    on_disk = sorted(p.name for p in path.glob("seg-*.log"))
    if phase == "compaction:copied":
        assert len(on_disk) > len(segments_before)  # the new segment exists but is not in the manifest
    journal = await check(path, live)
    try:
        assert journal.recovery is not None and not journal.recovery.problems
        assert set(p.name for p in path.glob("seg-*.log")) <= {f"seg-{n:08d}.log" for n in range(1, 1000)}
        report = await journal.compact(T0 + 60)  # and a compaction after the crash completes
        assert report.records_kept == len(live)
    finally:
        await journal.aclose()
    assert verify(path).ok
    await (await check(path, live)).aclose()


async def test_purge_then_reopen_without_compaction_does_not_resurrect_expired_records(tmp_path: Path) -> None:
    path = tmp_path / "j"
    live = await build(path)
    journal = FileJournal(path)
    await journal.open()
    try:
        assert await journal.purge_expired(T0 + 50) == 8
    finally:
        await journal.aclose()
    await (await check(path, live)).aclose()


async def test_writes_after_a_compaction_that_closed_the_journal_do_not_overwrite_it(tmp_path: Path) -> None:
    """Found by the power-loss harness (a second run started from a crash state): compaction
    rotates to a new active segment that exists only once a frame is written to it. Closed
    right after (as `mcp-durable journal compact` does), the next open resumed from the
    snapshot in the manifest's last segment, the compacted one, at offset 0 — and the next
    writes overwrote the live records compaction had just copied there."""
    path = tmp_path / "j"
    live = await build(path)
    journal = FileJournal(path, segment_bytes=SEGMENT)
    await journal.open()
    await journal.compact(T0 + 50)
    await journal.aclose()  # nothing written after the compaction
    again = FileJournal(path, segment_bytes=SEGMENT)
    await again.open()
    await again.append("worker", "context_update", {"last_done": 10}, 10.0)
    await again.aclose()
    reopened = await check(path, live, entries=11)
    try:
        assert reopened.recovery is not None and not reopened.recovery.problems
    finally:
        await reopened.aclose()
    assert verify(path).ok
