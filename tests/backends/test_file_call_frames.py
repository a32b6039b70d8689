"""Call frames across releases: a journal written before the compact `c` frames (the committed
fixture `fixtures/file-journal-v1/`, written by that release) opens and reads the same, takes new
records beside its old ones, survives a snapshot and a compaction with both kinds of frame; a
journal of today writes only `c` frames and reads them back from the segments and from a
snapshot; and the manifest's format keeps a release from reading frames it does not know."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import orjson
import pytest

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallQuery, CallState, create_journal
from mcp_durable.journal.file import FileJournal, verify
from mcp_durable.journal.file.framing import Frame, scan
from mcp_durable.journal.file.segments import FORMAT, MANIFEST, Manifest, segment_name
from mcp_durable.journal.file.snapshot import list_snapshots

from . import reference_journal
from .reference_journal import T0, Expected

FIXTURE = Path(__file__).parent / "fixtures" / "file-journal-v1"


def old_journal(tmp_path: Path) -> Path:
    path = tmp_path / "v1"
    shutil.copytree(FIXTURE, path)
    return path


def frame_kinds(path: Path) -> list[str]:
    """The kind (`t`) of every frame of the journal's segments, in log order."""
    manifest = Manifest.read(path)
    assert manifest is not None
    kinds = []
    for number in manifest.segments:
        data = (path / segment_name(number)).read_bytes().rstrip(b"\0")
        for item in scan(data):
            assert isinstance(item, Frame)
            kinds.append(orjson.loads(data[item.start : item.start + item.length])["t"])
    return kinds


async def expected() -> Expected:
    """What the reference workload leaves (run on the memory journal: no file format involved)."""
    journal = create_journal("memory://")
    await journal.open()
    try:
        return await reference_journal.run(journal)
    finally:
        await journal.aclose()


async def assert_holds(journal: FileJournal, truth: Expected) -> None:
    """Every record of `truth` byte for byte, the purged ones gone, every entry, step and task."""
    for identity, record in truth.records.items():
        assert await journal.get(identity) == record, identity
    for identity in truth.purged:
        assert await journal.get(identity) is None
    listed = await journal.list_calls(CallQuery(limit=100))
    assert {r.identity: r for r in listed} == truth.records
    assert [(e.process_id, e.entry_type, e.data, e.ts) for e in await journal.entries()] == truth.entries
    task = await journal.get_task("local", "task-0001-ü")
    assert task is not None and task.identity.key == "t-1"


async def test_the_fixture_is_what_the_earlier_release_wrote() -> None:
    # The fixture's call frames are all of the earlier kind (`call`, a record object and its hash).
    kinds = frame_kinds(FIXTURE)
    assert "call" in kinds and "c" not in kinds
    manifest = Manifest.read(FIXTURE)
    assert manifest is not None and manifest.format == 1
    assert verify(FIXTURE).ok


async def test_a_journal_of_the_earlier_release_opens_and_reads_the_same(tmp_path: Path) -> None:
    path = old_journal(tmp_path)
    truth = await expected()
    journal = FileJournal(path)
    await journal.open()
    try:
        assert journal.recovery is not None and journal.recovery.problems == ()
        assert journal.recovery.snapshot_used is None  # every frame replayed from the segments
        await assert_holds(journal, truth)
    finally:
        await journal.aclose()


async def test_read_only_it_reads_the_same_and_changes_nothing(tmp_path: Path) -> None:
    path = old_journal(tmp_path)
    before = {p.name: p.read_bytes() for p in path.iterdir()}
    truth = await expected()
    journal = FileJournal(path, read_only=True)
    await journal.open()
    try:
        for identity, record in truth.records.items():
            assert await journal.get(identity) == record
    finally:
        await journal.aclose()
    assert {p.name: p.read_bytes() for p in path.iterdir()} == before


async def test_old_and_new_frames_live_side_by_side_through_a_snapshot_and_a_compaction(tmp_path: Path) -> None:
    path = old_journal(tmp_path)
    truth = await expected()
    journal = FileJournal(path)
    await journal.open()
    # A writable open marks the manifest with this release's format before any new frame.
    manifest = Manifest.read(path)
    assert manifest is not None and manifest.format == FORMAT
    running = truth.records[CallIdentity("bob", "noop", "k-1")]
    done = running.evolve(
        state=CallState.COMPLETED, owner=None, lease_until=None, updated_at=T0 + 20, completed_at=T0 + 20, result=b"{}"
    )
    assert await journal.swap(running.version, done)
    truth.records[done.identity] = done
    fresh = dataclasses.replace(running, identity=CallIdentity("bob", "noop", "k-2"))
    assert (await journal.claim(fresh, T0 + 21))[0]
    truth.records[fresh.identity] = fresh
    await journal.aclose()
    kinds = frame_kinds(path)
    assert kinds.count("c") == 2 and "call" in kinds
    assert verify(path).ok

    for step in ("reopened", "snapshot", "compacted"):
        journal = FileJournal(path)
        await journal.open()
        try:
            assert journal.recovery is not None and journal.recovery.problems == (), step
            for identity, record in truth.records.items():
                assert await journal.get(identity) == record, (step, identity)
            if step == "reopened":
                assert await journal.snapshot() is not None
            elif step == "snapshot":
                assert journal.recovery.snapshot_used is not None
                report = await journal.compact(T0 + 22)
                assert report.records_kept == len(truth.records)
        finally:
            await journal.aclose()
        assert verify(path).ok, step
    assert "call" in frame_kinds(path)  # compaction copies frames verbatim: old ones stay old


@pytest.mark.parametrize("from_snapshot", [True, False])
async def test_a_journal_of_today_writes_only_compact_frames_and_reads_them_back(
    tmp_path: Path, from_snapshot: bool
) -> None:
    path = tmp_path / "today"
    journal = FileJournal(path)
    await journal.open()
    try:
        truth = await reference_journal.run(journal, snapshot_midway=True)
    finally:
        await journal.aclose()
    assert "call" not in frame_kinds(path) and "c" in frame_kinds(path)
    assert verify(path).ok
    if not from_snapshot:
        for snap in list_snapshots(path):
            snap.unlink()
    journal = FileJournal(path)
    await journal.open()
    try:
        assert journal.recovery is not None and journal.recovery.problems == ()
        assert (journal.recovery.snapshot_used is not None) == from_snapshot
        await assert_holds(journal, truth)
    finally:
        await journal.aclose()


async def test_a_journal_of_a_later_format_is_refused_and_reported(tmp_path: Path) -> None:
    path = old_journal(tmp_path)
    raw = orjson.loads((path / MANIFEST).read_bytes())
    (path / MANIFEST).write_bytes(orjson.dumps({**raw, "format": FORMAT + 1}))
    for read_only in (False, True):
        journal = FileJournal(path, read_only=read_only)
        with pytest.raises(JournalError, match="later release"):
            await journal.open()
    report = verify(path)
    assert [("later release" in p.reason) for p in report.problems] == [True]
