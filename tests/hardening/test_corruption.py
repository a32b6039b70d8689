"""Corruption of the file journal: a flipped byte anywhere, a segment cut short.

For each damage: `verify(dir)` finds it (a problem with the segment's path and an offset inside
the damaged frame); opening the journal reports it (`recovery.problems`, and `bytes_truncated`
for a torn tail) and follows the documented policy (tail cut off and kept aside; damage before
the tail skipped by resynchronising); and no record is silently lost: every record and entry
whose frame was not the damaged one is there, byte for byte, and the journal keeps working.

The flipped offsets are a sample that covers every field of the first, a middle and the last
frame plus random payload bytes; `MCP_DURABLE_FLIP_ALL=1` flips every byte of the segment.
"""

from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client

from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, JournalEntry
from tests.helpers import resource_text

file_journal = pytest.importorskip("mcp_durable.journal.file", reason="the file journal is not built yet")
FileJournal = file_journal.FileJournal
verify = file_journal.verify

SEGMENT = "seg-00000001.log"
HEADER = 36  # "@LLLLLLLL SSSSSSSSSSSSSSSS CCCCCCCC "
T0 = 1_700_000_000.0
FLIP_ALL = os.environ.get("MCP_DURABLE_FLIP_ALL") == "1"


@dataclass(frozen=True)
class Frame:
    start: int
    end: int  # one past the newline
    seq: int
    payload: dict[str, Any]

    def identity(self) -> CallIdentity | None:
        if self.payload.get("t") != "c":
            return None
        r = self.payload["r"]  # principal, tool, key first (keys here are not derived ones)
        return CallIdentity(r[0], r[1], r[2])

    def version(self) -> int:
        version: int = self.payload["r"][5]
        return version


def parse_frames(data: bytes) -> list[Frame]:
    """The segment's frames, by the documented framing (an independent reading of the format)."""
    frames, pos = [], 0
    while pos < len(data):
        assert data[pos : pos + 1] == b"@", pos
        length, seq = int(data[pos + 1 : pos + 9], 16), int(data[pos + 10 : pos + 26], 16)
        end = pos + HEADER + length + 1
        assert data[end - 1 : end] == b"\n"
        frames.append(Frame(pos, end, seq, orjson.loads(data[pos + HEADER : end - 1])))
        pos = end
    return frames


async def build(directory: Path, calls: int = 24) -> tuple[dict[CallIdentity, CallRecord], list[JournalEntry]]:
    """A journal of claims, completions, releases and process entries; returns what it holds."""
    journal = FileJournal.from_url(f"file://{directory}?durability=relaxed")
    await journal.open()
    try:
        for i in range(calls):
            identity = CallIdentity("alice" if i % 2 else "bob", "refund", f"O-{i}")
            now = T0 + i
            claimed = CallRecord(
                identity=identity,
                fingerprint=f"fp{i}",
                state=CallState.PENDING,
                version=1,
                run_id=f"run-{i}",
                attempts=1,
                created_at=now,
                updated_at=now,
                owner="me",
                lease_until=now + 30,
                arguments=orjson.dumps({"order_id": f"O-{i}", "n": i}),
            )
            won, _ = await journal.claim(claimed, now)
            assert won
            if i % 5 == 4:
                end = claimed.evolve(state=CallState.RELEASED, owner=None, lease_until=None, error="Boom")
            else:
                result = orjson.dumps({"content": [{"type": "text", "text": f"refunded O-{i} ✓"}], "isError": False})
                end = claimed.evolve(
                    state=CallState.COMPLETED,
                    owner=None,
                    lease_until=None,
                    result=result,
                    completed_at=now + 1,
                    expires_at=now + 86_400,
                )
            assert await journal.swap(1, end)
            if i % 3 == 0:
                await journal.append("worker", "context_update", {"done": i}, now)
        records = {r.identity: r for r in await journal.list_calls(CallQuery(limit=1000))}
        entries = await journal.entries()
    finally:
        await journal.aclose()
    return records, entries


@pytest.fixture(scope="module")
def pristine(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, dict[CallIdentity, CallRecord], list[JournalEntry]]:
    import anyio

    directory = tmp_path_factory.mktemp("pristine") / "journal"
    records, entries = anyio.run(build, directory)
    assert verify(directory).ok
    return directory, records, entries


def damaged_copy(pristine_dir: Path, target: Path) -> Path:
    shutil.copytree(pristine_dir, target)
    (target / "LOCK").unlink(missing_ok=True)
    return target


def flip_offsets(frames: list[Frame], size: int) -> list[int]:
    if FLIP_ALL:
        return list(range(size))
    chosen: set[int] = set()
    for frame in (frames[0], frames[len(frames) // 2], frames[-1]):
        s = frame.start
        # '@', length, separator, sequence, checksum, first payload byte, a middle one, the newline
        chosen.update(
            [
                s,
                s + 1,
                s + 8,
                s + 9,
                s + 12,
                s + 25,
                s + 27,
                s + 34,
                s + HEADER,
                (s + HEADER + frame.end) // 2,
                frame.end - 2,
                frame.end - 1,
            ]
        )
    rng = random.Random(8)
    chosen.update(rng.randrange(size) for _ in range(24))
    return sorted(o for o in chosen if 0 <= o < size)


async def check_reopened(
    directory: Path,
    truth: dict[CallIdentity, CallRecord],
    entries: list[JournalEntry],
    lost_frame: Frame | None,
    frames: list[Frame],
) -> Any:
    """Open the damaged journal: every record and entry not in `lost_frame` is intact; it still works."""
    journal = FileJournal.from_url(f"file://{directory}?durability=relaxed")
    await journal.open()
    try:
        report = journal.recovery
        assert report is not None
        latest = {f.identity(): f for f in frames if f.identity() is not None}
        for identity, record in truth.items():
            stored = await journal.get(identity)
            if lost_frame is not None and latest[identity] is lost_frame:
                # The damaged frame held this identity's latest version: it may be at an older one.
                assert stored is None or (stored.identity == identity and stored.version < record.version)
            else:
                assert stored == record, f"{identity} was lost or changed by damage elsewhere"
        lost_seq = lost_frame.seq if lost_frame is not None and lost_frame.payload["t"] == "entry" else None
        assert [e for e in await journal.entries()] == [e for e in entries if e.seq != lost_seq]
        # It keeps working: a new record is appended on a frame boundary and survives a reopen.
        fresh = CallRecord(
            identity=CallIdentity("carol", "refund", "after-damage"),
            fingerprint="f",
            version=1,
            state=CallState.PENDING,
            run_id="r",
            attempts=1,
            created_at=T0,
            updated_at=T0,
        )
        assert (await journal.claim(fresh, T0))[0]
    finally:
        await journal.aclose()
    again = FileJournal.from_url(f"file://{directory}?durability=relaxed")
    await again.open()
    try:
        assert await again.get(CallIdentity("carol", "refund", "after-damage")) is not None
    finally:
        await again.aclose()
    return report


async def test_a_flipped_byte_anywhere_is_found_reported_and_loses_only_its_own_frame(
    pristine: tuple[Path, dict[CallIdentity, CallRecord], list[JournalEntry]], tmp_path: Path
) -> None:
    source, truth, entries = pristine
    data = (source / SEGMENT).read_bytes()
    frames = parse_frames(data)
    for offset in flip_offsets(frames, len(data)):
        target = damaged_copy(source, tmp_path / f"flip-{offset}")
        damaged = bytearray(data)
        damaged[offset] ^= 0xFF
        (target / SEGMENT).write_bytes(bytes(damaged))
        hit = next(f for f in frames if f.start <= offset < f.end)

        found = verify(target)
        assert not found.ok, f"verify missed a flipped byte at {offset}"
        assert any(p.path.endswith(SEGMENT) and hit.start <= p.offset <= offset for p in found.problems), (
            offset,
            found.problems,
        )

        report = await check_reopened(target, truth, entries, hit, frames)
        assert report.problems, f"start-up did not report the flipped byte at {offset}"
        assert any(str(hit.start) in problem for problem in report.problems), (offset, report.problems)
        if hit is frames[-1]:
            assert report.bytes_truncated == hit.end - hit.start  # a corrupt tail is cut off...
            assert report.truncated_to and Path(report.truncated_to).read_bytes() == bytes(damaged[hit.start :])
        else:
            assert report.bytes_truncated == 0  # ...damage before the tail is skipped, not cut
        shutil.rmtree(target)


async def test_a_segment_cut_short_is_found_reported_and_truncated_to_its_last_whole_frame(
    pristine: tuple[Path, dict[CallIdentity, CallRecord], list[JournalEntry]], tmp_path: Path
) -> None:
    source, truth, entries = pristine
    data = (source / SEGMENT).read_bytes()
    frames = parse_frames(data)
    last = frames[-1]
    cuts = [last.start + 1, last.start + HEADER, last.end - 1, frames[-2].start + 5]
    for cut in cuts:
        target = damaged_copy(source, tmp_path / f"cut-{cut}")
        (target / SEGMENT).write_bytes(data[:cut])
        torn = next(f for f in frames if f.start < cut < f.end)
        kept = [f for f in frames if f.end <= cut]

        found = verify(target)
        assert [(p.offset, "tail" in p.reason) for p in found.problems] == [(torn.start, True)], found.problems

        journal = FileJournal.from_url(f"file://{target}?durability=relaxed")
        await journal.open()
        try:
            report = journal.recovery
            assert report is not None and report.bytes_truncated == cut - torn.start and report.problems
            for identity, record in truth.items():
                survivors = [f for f in kept if f.identity() == identity]
                stored = await journal.get(identity)
                if survivors and survivors[-1].version() == record.version:
                    assert stored == record
                else:  # its latest version was in the torn frame or after the cut: an older one at most
                    assert stored is None or stored.version < record.version
        finally:
            await journal.aclose()
        assert (target / SEGMENT).stat().st_size == torn.start  # the next append starts on a boundary
        assert verify(target).ok
        shutil.rmtree(target)


async def test_start_up_reports_damage_in_the_journal_recovery_resource(
    pristine: tuple[Path, dict[CallIdentity, CallRecord], list[JournalEntry]], tmp_path: Path
) -> None:
    from mcp_durable.server import DurableServer

    source, _, _ = pristine
    data = (source / SEGMENT).read_bytes()
    frames = parse_frames(data)
    target = damaged_copy(source, tmp_path / "served")
    middle = frames[len(frames) // 2]
    damaged = bytearray(data[: frames[-1].start + 10])  # a torn tail...
    damaged[middle.start + HEADER + 3] ^= 0x20  # ...and a flipped byte in the middle
    (target / SEGMENT).write_bytes(bytes(damaged))
    server = DurableServer("damaged", journal=f"file://{target}")
    for mode in ("legacy", "auto"):
        async with Client(server, mode=mode) as client:
            result = await client.read_resource("journal://recovery")
            body = orjson.loads(resource_text(result))
        if mode == "legacy":
            assert body["bytes_truncated"] == 10 and body["truncated_to"]
            assert any(str(middle.start) in p for p in body["problems"]), body["problems"]
            assert any("torn" in p for p in body["problems"]), body["problems"]
        else:  # reopened: the tail was cut the first time, the skipped middle is reported again
            assert body["bytes_truncated"] == 0
            assert any(str(middle.start) in p for p in body["problems"]), body["problems"]
