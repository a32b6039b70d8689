"""A file journal written before `CallRecord.reason` existed: its segments open, and each record
without the field reads back with `legacy_reason(state, error)`, from the segments and from a
snapshot alike; records written since carry their own reason beside the old ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallState, Reason
from mcp_durable.journal.file import FileJournal, verify
from mcp_durable.journal.file.codec import identity_hash
from mcp_durable.journal.file.framing import encode_frame
from mcp_durable.journal.file.segments import Manifest, segment_name

T0 = 1_700_000_000.0

#: (key, state, error) of the records the earlier release wrote, and the reason each reads with.
OLD = [
    ("cancelled", CallState.RELEASED, "cancelled by an operator: duplicate order", Reason.OPERATOR_CANCELLED),
    ("raised", CallState.RELEASED, "RuntimeError: upstream 502", Reason.EXCEPTION),
    ("lost", CallState.IN_DOUBT, None, Reason.LOST_OWNER),
    ("parked", CallState.IN_DOUBT, "parked after 3 attempts", Reason.PARKED),
    ("done", CallState.COMPLETED, None, None),
    ("running", CallState.PENDING, None, None),
]


def old_record(key: str, state: CallState, error: str | None) -> dict[str, Any]:
    """A frame's record object exactly as an earlier release wrote it: no `reason`."""
    return {
        "principal": "local",
        "tool": "refund",
        "key": key,
        "fingerprint": "f",
        "state": state.value,
        "version": 2,
        "run_id": f"run-{key}",
        "attempts": 1,
        "created_at": T0,
        "updated_at": T0 + 1,
        "owner": "A" if state == CallState.PENDING else None,
        "lease_until": None,
        "completed_at": None,
        "expires_at": None,
        "error": error,
        "result": "{}" if state == CallState.COMPLETED else None,
        "arguments": '{"order":1}',
    }


def write_old_journal(path: Path) -> None:
    """A journal directory holding one segment of `call` frames without `reason` (built by hand,
    frame by frame, with this journal's own manifest and hash key)."""
    path.mkdir(mode=0o700)
    manifest = Manifest.new()
    frames = []
    for seq, (key, state, error, _) in enumerate(OLD, start=1):
        h = identity_hash(manifest.hash_key, CallIdentity("local", "refund", key))
        payload = orjson.dumps({"t": "call", "op": "claim", "h": f"{h:032x}", "r": old_record(key, state, error)})
        assert b"reason" not in payload
        frames.append(encode_frame(seq, payload))
    (path / segment_name(1)).write_bytes(b"".join(frames))
    manifest.write(path)


async def test_records_written_without_a_reason_read_back_with_their_legacy_reason(tmp_path: Path) -> None:
    path = tmp_path / "old"
    write_old_journal(path)
    assert verify(path).ok
    journal = FileJournal(path)
    await journal.open()
    try:
        assert journal.recovery is not None and journal.recovery.problems == ()
        for key, state, _, reason in OLD:
            record = await journal.get(CallIdentity("local", "refund", key))
            assert record is not None and record.state == state and record.reason is reason, key
        listed = {r.identity.key: r.reason for r in await journal.list_calls()}
        assert listed == {key: reason for key, _, _, reason in OLD}
    finally:
        await journal.aclose()


async def test_an_old_journal_takes_new_records_and_keeps_both_across_a_snapshot(tmp_path: Path) -> None:
    path = tmp_path / "old"
    write_old_journal(path)
    journal = FileJournal(path)
    await journal.open()
    running = await journal.get(CallIdentity("local", "refund", "running"))
    assert running is not None
    timed_out = running.evolve(state=CallState.IN_DOUBT, owner=None, reason=Reason.TIMED_OUT, error="took 30 s")
    assert await journal.swap(running.version, timed_out)
    assert await journal.snapshot() is not None
    await journal.aclose()
    again = FileJournal(path)
    await again.open()
    try:
        assert again.recovery is not None and again.recovery.snapshot_used is not None
        assert await again.get(timed_out.identity) == timed_out
        cancelled = await again.get(CallIdentity("local", "refund", "cancelled"))
        assert cancelled is not None and cancelled.reason is Reason.OPERATOR_CANCELLED
    finally:
        await again.aclose()
    assert verify(path).ok


async def test_a_frame_whose_reason_no_release_wrote_is_reported_by_verify_and_refused_by_get(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old"
    write_old_journal(path)
    manifest = Manifest.read(path)
    assert manifest is not None
    h = identity_hash(manifest.hash_key, CallIdentity("local", "refund", "odd"))
    record = {**old_record("odd", CallState.RELEASED, None), "reason": "bored"}
    frame = encode_frame(len(OLD) + 1, orjson.dumps({"t": "call", "op": "claim", "h": f"{h:032x}", "r": record}))
    with open(path / segment_name(1), "ab") as segment:
        segment.write(frame)
    report = verify(path)
    assert [(p.offset, "bored" in p.reason) for p in report.problems] == [
        ((path / segment_name(1)).stat().st_size - len(frame), True)
    ]
    journal = FileJournal(path)
    await journal.open()
    try:
        with pytest.raises(JournalError):
            await journal.get(CallIdentity("local", "refund", "odd"))
        assert await journal.get(CallIdentity("local", "refund", "lost")) is not None  # the others read
    finally:
        await journal.aclose()
