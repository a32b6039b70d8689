"""The file journal's recovery: torn tails, damage in the middle, snapshots plus tail, sequence numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_durable.errors import JournalCorruptError
from mcp_durable.journal import CallIdentity, CallRecord, CallState
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.file.framing import OVERHEAD

T0 = 1_700_000_000.0


def record(
    key: str,
    *,
    version: int = 1,
    state: CallState = CallState.PENDING,
    result: bytes | None = None,
    expires_at: float | None = None,
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
        lease_until=T0 + 30,
        result=result,
        expires_at=expires_at,
        arguments=b'{"a":1}',
    )


async def opened(path: Path, **kwargs: object) -> FileJournal:
    journal = FileJournal(path, **kwargs)  # type: ignore[arg-type]
    await journal.open()
    return journal


async def write_entries(path: Path, count: int) -> list[int]:
    """Append `count` entries `{"i": n}` and close; returns the byte offset where each frame starts."""
    journal = await opened(path)
    for i in range(count):
        await journal.append("p", "context_update", {"i": i, "pad": "x" * (i * 7 % 50)}, float(i))
    await journal.aclose()
    data = (path / "seg-00000001.log").read_bytes()
    starts = [0] + [i + 1 for i, byte in enumerate(data) if byte == 0x0A][:-1]
    assert len(starts) == count
    return starts


@pytest.mark.parametrize("keep", [1, 20, OVERHEAD - 1, OVERHEAD + 5, -1])
async def test_a_torn_last_frame_is_cut_off_kept_aside_and_the_next_append_survives(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "j"
    starts = await write_entries(path, 10)
    segment = path / "seg-00000001.log"
    data = segment.read_bytes()
    cut_at = starts[-1] + (keep if keep > 0 else len(data) - starts[-1] - 1)  # -1: all but the newline
    segment.write_bytes(data[:cut_at])

    journal = await opened(path)
    try:
        assert journal.recovery is not None
        assert journal.recovery.bytes_truncated == cut_at - starts[-1]
        assert journal.recovery.truncated_to is not None
        assert Path(journal.recovery.truncated_to).read_bytes() == data[starts[-1] : cut_at]
        assert any(f"offset {starts[-1]}" in p for p in journal.recovery.problems)
        assert [e.data["i"] for e in await journal.entries()] == list(range(9))
        after = await journal.append("p", "context_update", {"i": "next"}, 99.0)
    finally:
        await journal.aclose()

    again = await opened(path)
    try:
        assert again.recovery is not None and again.recovery.bytes_truncated == 0 and not again.recovery.problems
        entries = await again.entries()
        assert [e.data["i"] for e in entries] == [*range(9), "next"]
        assert entries[-1].seq == after.seq
    finally:
        await again.aclose()


async def test_garbage_in_the_middle_is_reported_with_its_offset_and_every_record_after_it_is_kept(
    tmp_path: Path,
) -> None:
    path = tmp_path / "j"
    starts = await write_entries(path, 20)
    segment = path / "seg-00000001.log"
    data = bytearray(segment.read_bytes())
    damaged = starts[10] + 5
    data[damaged : damaged + 12] = b"\x00garbage\xff\xfe!!"
    segment.write_bytes(bytes(data))

    journal = await opened(path)
    try:
        assert journal.recovery is not None
        assert journal.recovery.bytes_truncated == 0
        [problem] = journal.recovery.problems
        assert f"offset {starts[10]} " in problem and "resynchronised" in problem
        assert [e.data["i"] for e in await journal.entries()] == [*range(10), *range(11, 20)]
        assert (path / f"seg-00000001.log.damaged-{starts[10]}").read_bytes() == bytes(data[starts[10] : starts[11]])
        await journal.append("p", "context_update", {"i": 20}, 20.0)
    finally:
        await journal.aclose()
    again = await opened(path)
    try:
        assert [e.data["i"] for e in await again.entries()] == [*range(10), *range(11, 21)]
    finally:
        await again.aclose()


async def test_garbage_inserted_between_frames_loses_no_record(tmp_path: Path) -> None:
    path = tmp_path / "j"
    starts = await write_entries(path, 6)
    segment = path / "seg-00000001.log"
    data = segment.read_bytes()
    segment.write_bytes(data[: starts[3]] + b"@zz not a frame\n\x00\x01" + data[starts[3] :])
    journal = await opened(path)
    try:
        assert journal.recovery is not None
        assert len(journal.recovery.problems) == 1 and f"offset {starts[3]} " in journal.recovery.problems[0]
        assert [e.data["i"] for e in await journal.entries()] == list(range(6))
    finally:
        await journal.aclose()


async def test_a_read_only_open_reports_damage_but_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "j"
    starts = await write_entries(path, 5)
    segment = path / "seg-00000001.log"
    torn = segment.read_bytes()[: starts[-1] + 9]
    segment.write_bytes(torn)
    reader = await opened(path, read_only=True)
    try:
        assert reader.recovery is not None and reader.recovery.bytes_truncated == 9
        assert len(await reader.entries()) == 4
    finally:
        await reader.aclose()
    assert segment.read_bytes() == torn
    assert not list(path.glob("*.torn-*"))


async def test_reopen_reads_the_snapshot_then_only_the_tail(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = await opened(path)
    for i in range(30):
        await journal.claim(record(f"k{i}"), T0)
    await journal.append("p", "checkpoint", {"context_state": {"n": 1}}, 1.0)
    assert await journal.snapshot() is not None
    # After the snapshot: an update, a new record, an entry, a purge.
    assert await journal.swap(1, record("k0", version=2, state=CallState.COMPLETED, result=b'{"r":0}'))
    assert await journal.swap(1, record("k1", version=2, state=CallState.COMPLETED, expires_at=T0 + 1))
    await journal.claim(record("late"), T0)
    await journal.append("p", "context_update", {"n": 2}, 2.0)
    assert await journal.purge_expired(T0 + 5) == 1
    await journal.aclose()

    again = await opened(path)
    try:
        assert again.recovery is not None
        assert again.recovery.snapshot_used is not None and again.recovery.snapshot_used.startswith("snapshot-")
        assert again.recovery.entries_replayed == 5  # the five frames after the snapshot
        assert again.recovery.records_loaded == 30  # 30 + late - k1
        k0 = await again.get(CallIdentity("local", "refund", "k0"))
        assert k0 is not None and k0.state == CallState.COMPLETED and k0.result == b'{"r":0}' and k0.version == 2
        assert await again.get(CallIdentity("local", "refund", "k1")) is None
        assert await again.get(CallIdentity("local", "refund", "late")) is not None
        checkpoint = await again.last_checkpoint("p")
        assert checkpoint is not None and checkpoint.data == {"context_state": {"n": 1}}
        assert [e.data for e in await again.entries(process_id="p", after=checkpoint.seq)] == [{"n": 2}]
    finally:
        await again.aclose()


async def test_a_damaged_snapshot_is_ignored_and_reported(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = await opened(path)
    for i in range(10):
        await journal.claim(record(f"k{i}"), T0)
    name = await journal.snapshot()
    await journal.aclose()
    assert name is not None
    snap = path / name
    data = bytearray(snap.read_bytes())
    data[-3] ^= 0xFF
    snap.write_bytes(bytes(data))
    again = await opened(path)
    try:
        assert again.recovery is not None and again.recovery.snapshot_used is None
        assert any(name in p and "checksum" in p for p in again.recovery.problems)
        assert all([await again.get(CallIdentity("local", "refund", f"k{i}")) for i in range(10)])
    finally:
        await again.aclose()


async def test_sequence_numbers_keep_increasing_across_reopens_and_segments(tmp_path: Path) -> None:
    path = tmp_path / "j"
    seqs: list[int] = []
    for _ in range(3):
        journal = await opened(path, segment_bytes=400)  # tiny segments: rotation on most appends
        for i in range(5):
            seqs.append((await journal.append("p", "context_update", {"i": i, "pad": "y" * 100}, 0.0)).seq)
        await journal.aclose()
    assert seqs == sorted(set(seqs))
    assert len(list(path.glob("seg-*.log"))) > 3
    journal = await opened(path)
    try:
        assert [e.seq for e in await journal.entries()] == seqs
    finally:
        await journal.aclose()


async def test_a_segment_missing_from_the_directory_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j"
    journal = await opened(path, segment_bytes=300)
    for i in range(6):
        await journal.append("p", "context_update", {"i": i, "pad": "z" * 100}, 0.0)
    await journal.aclose()
    (path / "seg-00000002.log").unlink()
    with pytest.raises(JournalCorruptError) as caught:
        await opened(path)
    assert "seg-00000002.log" in caught.value.path


async def test_url_forms_relative_absolute_and_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    relative = FileJournal.from_url("file://.mcp-durable/journal?durability=relaxed")
    assert relative.directory == Path(".mcp-durable/journal") and relative.durability == "relaxed"
    absolute = FileJournal.from_url(f"file://{tmp_path}/abs?mode=ro")
    assert absolute.directory == tmp_path / "abs" and absolute.read_only and absolute.durability == "strict"
    await relative.open()
    try:
        assert (tmp_path / ".mcp-durable/journal/MANIFEST").exists()
        assert (tmp_path / ".mcp-durable/journal").stat().st_mode & 0o777 == 0o700
        await relative.append("p", "x", {}, 0.0)
        assert all(p.stat().st_mode & 0o777 == 0o600 for p in (tmp_path / ".mcp-durable/journal").iterdir())
    finally:
        await relative.aclose()


async def test_recovery_reading_small_windows_finds_the_same_records_and_damage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mcp_durable.journal.file import recovery

    monkeypatch.setattr(recovery, "WINDOW", 64)  # smaller than any frame: every frame straddles windows
    path = tmp_path / "j"
    starts = await write_entries(path, 12)
    segment = path / "seg-00000001.log"
    data = bytearray(segment.read_bytes())
    data[starts[4] + 3 : starts[4] + 9] = b"XXXXXX"
    segment.write_bytes(bytes(data[: starts[-1] + 20]))
    journal = await opened(path)
    try:
        assert journal.recovery is not None
        assert journal.recovery.bytes_truncated == 20
        assert any(f"offset {starts[4]} " in p and "resynchronised" in p for p in journal.recovery.problems)
        assert [e.data["i"] for e in await journal.entries()] == [0, 1, 2, 3, 5, 6, 7, 8, 9, 10]
    finally:
        await journal.aclose()
