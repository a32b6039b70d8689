"""The file journal's tally (counts, records by creation and by expiry time) through snapshots:
saved with the index and loaded back, or rebuilt from the arrays when a snapshot of an earlier
release has none; and `TimeRuns` itself, whose stale references a read drops."""

from __future__ import annotations

import random
import zlib
from array import array
from collections import Counter
from pathlib import Path

import orjson

from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, CountQuery
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.file.snapshot import list_snapshots
from mcp_durable.journal.tally import RUN, GroupCounts, TimeRuns

T0 = 1_700_000_000.0


def record(n: int) -> CallRecord:
    created = T0 + 37 * n
    return CallRecord(
        identity=CallIdentity(f"p{n % 3}", f"t{n % 2}", f"k{n}"),
        fingerprint="f",
        state=(CallState.COMPLETED, CallState.FAILED, CallState.RELEASED)[n % 3],
        version=1,
        run_id=f"r{n}",
        attempts=1,
        created_at=created,
        updated_at=created,
        expires_at=created + 1000 if n % 2 else None,
    )


async def _filled(directory: Path) -> list[CountQuery]:
    journal = FileJournal(directory, durability="relaxed")
    await journal.open()
    for n in range(300):
        await journal.claim(record(n), T0)
    assert await journal.purge_expired(T0 + 3000) > 0
    await journal.snapshot()
    await journal.aclose()
    return [CountQuery(), CountQuery(principal="p1"), CountQuery(since=T0 + 600, until=T0 + 6000, bucket_s=60)]


async def _check(directory: Path, queries: list[CountQuery], *, purged_later: int) -> None:
    journal = FileJournal(directory)
    await journal.open()
    try:
        assert journal.recovery is not None and journal.recovery.snapshot_used is not None
        records = await journal.list_calls(CallQuery(limit=1000))
        for query in queries:
            assert await journal.count_calls(query) == query.count(records)
        # The expiry index came through too: a purge finds what expires after the snapshot.
        assert await journal.purge_expired(T0 + 20_000) == purged_later
        assert await journal.count_calls() == CountQuery().count(await journal.list_calls(CallQuery(limit=1000)))
    finally:
        await journal.aclose()


async def test_a_snapshot_holds_the_tally(tmp_path: Path) -> None:
    queries = await _filled(tmp_path / "j")
    header = orjson.loads(list_snapshots(tmp_path / "j")[0].read_bytes().split(b"\n", 1)[0])
    assert header["counts"] and any(name.startswith("tally.") for name, _, _ in header["sections"])
    await _check(tmp_path / "j", queries, purged_later=len([n for n in range(300) if n % 2 and 37 * n + 1000 > 3000]))


async def test_a_snapshot_of_an_earlier_release_is_used_and_the_tally_rebuilt(tmp_path: Path) -> None:
    queries = await _filled(tmp_path / "j")
    path = list_snapshots(tmp_path / "j")[0]
    head, body = path.read_bytes().split(b"\n", 1)
    header = orjson.loads(head)
    # As a release before the tally wrote it: no counts, no tally sections (and their bytes gone).
    kept, data, offset = [], b"", 0
    for name, code, size in header["sections"]:
        if not name.startswith("tally."):
            kept.append([name, code, size])
            data += body[offset : offset + size]
        offset += size
    del header["counts"]
    header["sections"] = kept
    header["crc"] = zlib.crc32(data)
    path.write_bytes(orjson.dumps(header) + b"\n" + data)
    await _check(tmp_path / "j", queries, purged_later=len([n for n in range(300) if n % 2 and 37 * n + 1000 > 3000]))


def test_time_runs_drop_stale_references_list_newest_first_and_take_exactly_what_is_due() -> None:
    # Times spread at random (spread 4: few distinct times, runs that cannot split), and times
    # that mostly come in order, as records' creations and expiries do: additions that start a
    # run of their own after a full last run, with some earlier ones, moves and repeats among them.
    for seed, spread, in_order in ((7, 3000.0, False), (8, 4.0, False), (9, 3000.0, True), (10, 4.0, True)):
        rng = random.Random(seed)
        times: dict[int, float] = {}  # the model: ref -> its current time (absent: gone)
        runs: TimeRuns[int] = TimeRuns(lambda: array("I"), times.get)
        clock = 0.0
        if in_order and seed % 2:
            # Full runs loaded from a snapshot first, their latest times unknown (`put_run`), and
            # additions that start earlier than the last run's latest time.
            for n in range(3):
                refs = array("I", range(n * RUN, (n + 1) * RUN))
                for ref in refs:
                    times[ref] = n * 10.0 + ref % 7
                runs.put_run(n * 10.0, refs)
            clock = 22.0
        for _ in range(40_000):
            ref = rng.randrange(5000)  # more than a run holds: runs split
            if rng.random() < 0.2:
                times.pop(ref, None)  # gone: the runs learn it on their next read
            else:
                if in_order and rng.random() < 0.95:
                    clock += rng.choice((0.0, spread / 40_000, spread / 4_000))  # some equal times
                    times[ref] = clock
                else:
                    times[ref] = float(round(rng.uniform(0, max(spread, clock)), 1))
                runs.add(times[ref], ref)
            if rng.random() < 0.003:
                low, high = sorted((rng.uniform(0, spread), rng.uniform(0, spread)))
                seen = [(ref, t) for ref, t in runs.scan(low, high) if low <= t <= high]
                assert sorted(seen) == sorted((r, t) for r, t in times.items() if low <= t <= high)
                assert runs.first() == min(times.values(), default=None)
                top = rng.uniform(0, spread * 1.1)
                newest = list(runs.newest(top))
                assert [t for t, _ in newest] == sorted((t for t in times.values() if t <= top), reverse=True)
                assert sorted(newest) == sorted((t, r) for r, t in times.items() if t <= top)
            if rng.random() < 0.001:
                due = rng.uniform(0, spread)
                taken = runs.take(due)
                assert sorted(taken) == sorted(r for r, t in times.items() if t <= due)
                for ref in taken:
                    del times[ref]
        assert len(runs) >= len(times)
        assert sorted(r for r, _ in runs.scan(None, None)) == sorted(times)
        assert len(runs) == len(times)  # a full read left no stale reference behind
        assert max(len(run) for run in runs.runs) <= max(RUN, 2 * max(Counter(times.values()).values()))


async def test_live_bytes_are_kept_as_records_and_entries_change_and_through_a_reopen(tmp_path: Path) -> None:
    """`live_bytes` (what retention asks before compacting) is kept by the index, not summed
    over every slot: it equals that sum through writes, purges, dropped entries and reopens."""
    from mcp_durable.journal.file.index import DEAD

    def summed(journal: FileJournal) -> int:
        calls, entries = journal._calls, journal._entries
        live = sum(calls.size[s] for s in range(len(calls.state)) if calls.state[s] != DEAD)
        return live + sum(entries.size[i] for i in range(len(entries)) if i not in journal._dropped)

    journal = FileJournal(tmp_path / "j", durability="relaxed")
    await journal.open()
    for n in range(120):
        await journal.claim(record(n), T0)
        await journal.append(f"steps/r{n}", "step", {"index": 0, "name": "a"}, T0)
    assert journal.live_bytes()[1] == summed(journal)
    await journal.purge_expired_calls(T0 + 3000)
    assert journal.live_bytes()[1] == summed(journal)
    await journal.snapshot()
    await journal.claim(record(500), T0)
    await journal.aclose()
    again = FileJournal(tmp_path / "j")
    await again.open()
    try:
        assert again.live_bytes()[1] == summed(again)
        await again.compact(T0 + 3000)
        assert again.live_bytes()[1] == summed(again)
    finally:
        await again.aclose()


def test_a_move_between_states_counts_as_a_removal_and_an_addition() -> None:
    # `GroupCounts.move` (a completion's change of state) against `add` of -1 then +1, from
    # every kind of start: groups present, absent, at one, and at counts a repair left negative.
    rng = random.Random(11)
    moved, added = GroupCounts(), GroupCounts()
    for _ in range(20_000):
        principal, tool = rng.choice("pq"), rng.choice("ab")
        old, new = rng.sample(("pending", "completed", "failed"), 2)
        if rng.random() < 0.4:
            n = rng.choice((1, 1, 2, -1))
            moved.add(principal, tool, old, n)
            added.add(principal, tool, old, n)
        else:
            moved.move(principal, tool, old, new)
            added.add(principal, tool, old, -1)
            added.add(principal, tool, new, 1)
        assert moved.by_principal == added.by_principal
