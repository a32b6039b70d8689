"""The file journal's listing newest first from its creation-time runs (`tally.TimeRuns`):
`list_calls` answers every `CallQuery` exactly as the reference (`CallQuery.page` over every
record) through claims, state changes, claims over expired records, purges and reopens (from a
snapshot, and replaying the frames after one), with runs small enough that every listing
crosses many of them, and with the tasks listed both from their slot set and from the runs;
and a journal whose snapshot is of format 2 (the tally in minute buckets, fixture
`fixtures/file-journal-snapshot-v2/`) or 3 (wide call columns, a per-slot seq, fixture
`fixtures/file-journal-snapshot-v3/`) reads and lists the same after its open.

Real journals on real files; the reference is a dict of what was written.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, CountQuery
from mcp_durable.journal import tally as tally_module
from mcp_durable.journal.base import CallCursor, each_call
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.file import journal as file_journal_module
from mcp_durable.journal.file.snapshot import FORMAT, list_snapshots

T0 = 1_700_000_000.0
PRINCIPALS = ("alice", "bob", "carol")
TOOLS = ("refund", "ship", "lookup")
STATES = tuple(CallState)


def _new_record(rng: random.Random, n: int, now: float) -> CallRecord:
    # Few distinct creation times: many ties, which the identity orders.
    created = T0 + rng.randrange(400) * 0.5
    expires = None if rng.random() < 0.5 else now + rng.uniform(1, 400)
    state = rng.choice(STATES)
    return CallRecord(
        identity=CallIdentity(rng.choice(PRINCIPALS), rng.choice(TOOLS), f"k{n % 700:04d}"),
        fingerprint="f",
        state=state,
        version=1,
        run_id=f"run-{n}",
        attempts=1,
        created_at=created,
        updated_at=created,
        owner="A" if state is CallState.PENDING else None,
        lease_until=now + 30 if state is CallState.PENDING else None,
        expires_at=expires,
        task_id=f"task-{n}" if rng.random() < 0.3 else None,
    )


def _random_query(rng: random.Random, model: dict[CallIdentity, CallRecord]) -> CallQuery:
    cursor = None
    if model and rng.random() < 0.5:
        if rng.random() < 0.7:
            cursor = CallCursor.after(rng.choice(list(model.values())))
        else:
            identity = CallIdentity(rng.choice(PRINCIPALS), rng.choice(TOOLS), f"k{rng.randrange(700):04d}")
            cursor = CallCursor(T0 + rng.randrange(400) * 0.5, identity)
    return CallQuery(
        principal=rng.choice((None, None, *PRINCIPALS, "nobody")),
        tool=rng.choice((None, None, *TOOLS, "none")),
        state=rng.choice((None, None, None, *STATES)),
        limit=rng.choice((0, 1, 2, 7, 50, 10_000)),
        cursor=cursor,
        tasks_only=rng.random() < 0.25,
    )


async def _check(journal: FileJournal, model: dict[CallIdentity, CallRecord], rng: random.Random) -> None:
    for _ in range(25):
        query = _random_query(rng, model)
        assert await journal.list_calls(query) == query.page(model.values()), query
    # Paging through (the export's way) yields each selected record once, in order.
    query = dataclasses.replace(_random_query(rng, model), limit=rng.choice((1, 5, 33)), cursor=None)
    paged = [r async for r in each_call(journal, query)]
    assert paged == dataclasses.replace(query, limit=10**9).page(model.values())


@pytest.mark.parametrize("small", [True, False], ids=["small-runs", "default-runs"])
async def test_listings_equal_the_reference_through_changes_purges_and_reopens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, small: bool
) -> None:
    if small:
        # Runs of a few records and the tasks always listed from the runs: every path and
        # boundary of the runs is crossed by a few hundred records.
        monkeypatch.setattr(tally_module, "RUN", 4)
        monkeypatch.setattr(file_journal_module, "TASK_LISTING", 0)
    rng = random.Random(1234 if small else 99)
    model: dict[CallIdentity, CallRecord] = {}
    journal = FileJournal(tmp_path / "j", durability="relaxed")
    await journal.open()
    now = T0
    try:
        for step in range(1500):
            now += 0.5
            roll = rng.random()
            if roll < 0.55 or not model:
                record = _new_record(rng, step, now)
                won, stored = await journal.claim(record, now)
                old = model.get(record.identity)
                assert won == (old is None or old.is_expired(now))
                if won:
                    model[record.identity] = record
            elif roll < 0.85:
                old = rng.choice(list(model.values()))
                new = dataclasses.replace(
                    old,
                    state=rng.choice(STATES),
                    version=old.version + 1,
                    task_id=old.task_id if rng.random() < 0.8 else f"task-late-{step}",
                    expires_at=old.expires_at if rng.random() < 0.8 else now + rng.uniform(1, 100),
                )
                assert await journal.swap(old.version, new)
                model[new.identity] = new
            elif roll < 0.9:
                gone = await journal.purge_expired_calls(now)
                expected = {i for i, r in model.items() if r.is_expired(now)}
                assert {identity for identity, _ in gone.calls} == expected
                for identity in expected:
                    del model[identity]
            elif roll < 0.93:
                if rng.random() < 0.5:
                    await journal.snapshot()  # the next open loads it; else it replays the frames
                await journal.aclose()
                journal = FileJournal(tmp_path / "j", durability="relaxed")
                await journal.open()
            if step % 50 == 0:
                await _check(journal, model, rng)
        await _check(journal, model, rng)
    finally:
        await journal.aclose()


#: A journal of `fixture_record(0..599)` with a snapshot of format 2 (the tally in minute buckets
#: per principal), written by the release before the tally's runs.
SNAPSHOT_V2 = Path(__file__).parent / "fixtures" / "file-journal-snapshot-v2"


def fixture_record(n: int) -> CallRecord:
    """Record `n` of the `SNAPSHOT_V2` fixture, as it was claimed."""
    created = T0 + 40 * (n // 2)  # two records per creation time, over a few hours
    return CallRecord(
        identity=CallIdentity(("alice", "bob", "carol")[n % 3], ("refund", "ship")[n % 2], f"k{n:04d}"),
        fingerprint="f",
        state=(CallState.COMPLETED, CallState.FAILED, CallState.RELEASED, CallState.PENDING)[n % 4],
        version=1,
        run_id=f"run-{n}",
        attempts=1,
        created_at=created,
        updated_at=created,
        owner="A" if n % 4 == 3 else None,
        lease_until=created + 30 if n % 4 == 3 else None,
        expires_at=created + 3600 * 5 if n % 5 else None,
        task_id=f"task-{n}" if n % 7 == 0 else None,
    )


#: A journal of `fixture_v3_record(0..599)` with a snapshot of format 3 (every call column wide,
#: a seq per slot, 1,024 slots), written by the release before the narrow columns.
SNAPSHOT_V3 = Path(__file__).parent / "fixtures" / "file-journal-snapshot-v3"


def fixture_v3_record(n: int) -> CallRecord:
    """Record `n` of the `SNAPSHOT_V3` fixture: `fixture_record(n)` at version `n * 1000 + 1`
    (up to 599,001: a 4-byte column), record 0 with 70 KB of arguments (a 4-byte size)."""
    arguments = b'{"pad":"' + b"x" * 70_000 + b'"}' if n == 0 else None
    return dataclasses.replace(fixture_record(n), version=n * 1000 + 1, arguments=arguments)


@pytest.mark.parametrize(
    ("fixture", "earlier_format", "record_of"),
    [(SNAPSHOT_V2, 2, fixture_record), (SNAPSHOT_V3, 3, fixture_v3_record)],
    ids=["format-2", "format-3"],
)
async def test_an_earlier_snapshot_is_used_and_read_and_listed_the_same(
    tmp_path: Path, fixture: Path, earlier_format: int, record_of: Callable[[int], CallRecord]
) -> None:
    shutil.copytree(fixture, tmp_path / "j")
    (snapshot,) = list_snapshots(tmp_path / "j")
    assert orjson.loads(snapshot.read_bytes().split(b"\n", 1)[0])["format"] == earlier_format
    model = {r.identity: r for r in map(record_of, range(600))}
    rng = random.Random(5)
    for reopen in range(2):  # from the earlier snapshot, then from the one written after it
        journal = FileJournal(tmp_path / "j", durability="relaxed")
        await journal.open()
        try:
            assert journal.recovery is not None and journal.recovery.snapshot_used is not None
            assert journal.recovery.entries_replayed == 0
            # The open replaced the outdated snapshot at once: its conversion is paid once.
            (snapshot,) = list_snapshots(tmp_path / "j")
            assert orjson.loads(snapshot.read_bytes().split(b"\n", 1)[0])["format"] == FORMAT
            # The wide columns narrowed to what their values need.
            calls = journal._calls
            names = ("hi", "segment", "offset", "size", "version", "tool", "principal")
            widths = {name: getattr(calls, name).typecode for name in names}
            big = earlier_format == 3  # versions up to 599,001 and one 70 KB frame
            assert widths == {
                "hi": "H",
                "segment": "H",
                "offset": "I",
                "size": "I" if big else "H",
                "version": "I" if big else "B",
                "tool": "B",
                "principal": "B",
            }
            for record in model.values():
                assert await journal.get(record.identity) == record
            await _check(journal, model, rng)
            assert await journal.count_calls() == CountQuery().count(model.values())
            if reopen == 0:
                now = T0 + 40 * 150 + 3600 * 5
                gone = await journal.purge_expired_calls(now)
                expected = {i for i, r in model.items() if r.is_expired(now)}
                assert expected and {identity for identity, _ in gone.calls} == expected
                for identity in expected:
                    del model[identity]
                await _check(journal, model, rng)
                await journal.snapshot()
        finally:
            await journal.aclose()
    (snapshot,) = list_snapshots(tmp_path / "j")
    assert orjson.loads(snapshot.read_bytes().split(b"\n", 1)[0])["format"] == FORMAT
