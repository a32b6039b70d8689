"""The file journal's index at a size where its hash table grows, loses records and reuses slots."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.file.index import CallIndex

T0 = 1_700_000_000.0


def completed(key: str, expires_at: float | None) -> CallRecord:
    return CallRecord(
        identity=CallIdentity(f"user-{len(key) % 3}", "refund", key),
        fingerprint="f",
        state=CallState.COMPLETED,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        expires_at=expires_at,
        result=b'{"key":"%s"}' % key.encode(),
    )


async def test_thousands_of_records_with_purges_and_reuse_are_all_found_before_and_after_reopen(
    tmp_path: Path,
) -> None:
    journal = FileJournal(tmp_path / "j", durability="relaxed")
    await journal.open()
    expected: dict[str, CallRecord] = {}
    for i in range(3000):  # the table starts at 1,024 buckets: it is rebuilt twice on the way
        record = completed(f"k{i}", T0 + 10 if i % 2 else None)
        assert (await journal.claim(record, T0))[0]
        expected[record.identity.key] = record
    assert await journal.purge_expired(T0 + 20) == 1500
    for i in range(1, 3000, 2):
        del expected[f"k{i}"]
    for i in range(3000, 4000):  # new records reuse the freed slots
        record = completed(f"k{i}", None)
        assert (await journal.claim(record, T0 + 20))[0]
        expected[record.identity.key] = record
    await journal.snapshot()
    await journal.claim(completed("after-snapshot", None), T0 + 20)
    expected["after-snapshot"] = completed("after-snapshot", None)

    async def check(j: FileJournal) -> None:
        for record in expected.values():
            assert await j.get(record.identity) == record
        for i in range(1, 3000, 2):
            assert await j.get(completed(f"k{i}", None).identity) is None
        stats = await j.stats()
        assert stats.calls_by_state == {"completed": len(expected)}

    await check(journal)
    await journal.aclose()
    again = FileJournal(tmp_path / "j")
    await again.open()
    try:
        assert again.recovery is not None and again.recovery.snapshot_used is not None
        assert again.recovery.records_loaded == len(expected)
        await check(again)
    finally:
        await again.aclose()


@pytest.mark.parametrize("seed", range(6))
def test_the_hash_table_agrees_with_a_dict_through_inserts_deletes_and_rebuilds(seed: int) -> None:
    rng = random.Random(seed)
    index = CallIndex()
    model: dict[int, int] = {}
    hashes = [rng.getrandbits(128) for _ in range(3000)]
    for step in range(15_000):
        h = rng.choice(hashes)
        roll = rng.random()
        slot = index.find(h)
        assert (slot is None) == (h not in model)
        if slot is not None:
            assert index.version[slot] == model[h]
        if roll < 0.6:
            index.put_fields(h, step, 2, 1.0, None, "refund", "local", step, 10)
            model[h] = step
        elif roll < 0.8 and slot is not None:
            index.delete(slot)
            del model[h]
    assert len(index) == len(model) == len(index.state) - index.state.count(0)
    assert all(index.version[index.find(h)] == v for h, v in model.items())  # type: ignore[index]


def test_a_narrow_column_widens_when_a_value_does_not_fit_and_refuses_one_no_width_holds() -> None:
    index = CallIndex()
    h = 12345 << 64 | 678
    slot = index.put_fields(h, 1, 2, 1.0, None, "refund", "local", 0, 10)
    assert _widths(index) == ("B", "H")
    for version in (255, 256, 2**16, 2**32 - 1, 2**32, 2**64 - 1):
        assert index.put_fields(h, version, 2, 1.0, None, "refund", "local", 0, 70_000) == slot
        assert index.version[slot] == version and index.size[slot] == 70_000
    assert _widths(index) == ("Q", "I")
    with pytest.raises(OverflowError):
        index.put_narrow("version", slot, 2**64)
    with pytest.raises(OverflowError):
        index.put_narrow("version", slot, -1)
    assert index.version[slot] == 2**64 - 1
    for n in range(300):  # a 256th tool and principal widen their columns too
        index.put_fields(n, 1, 2, 1.0, None, f"tool-{n}", f"user-{n}", 0, 10)
    assert index.tool.typecode == index.principal.typecode == "H"
    for n in range(300):
        found = index.find(n)
        assert found is not None and index.tools.names[index.tool[found]] == f"tool-{n}"


def _widths(index: CallIndex) -> tuple[str, str]:
    """The typecodes of `index`'s version and size columns."""
    return index.version.typecode, index.size.typecode


async def test_widened_columns_and_versions_past_32_bits_survive_a_snapshot_and_a_replay(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path / "j", durability="relaxed")
    await journal.open()
    records = [completed(f"k{i}", None) for i in range(3)]
    records[1] = replace(records[1], version=2**40 + 7, arguments=b'{"pad":"' + b"x" * 70_000 + b'"}')
    records[2] = replace(records[2], version=2**64 - 1)
    try:
        for record in records:
            assert (await journal.claim(record, T0))[0]
        records[1] = replace(records[1], version=2**40 + 8)
        assert await journal.swap(2**40 + 7, records[1])
        await journal.snapshot()
        late = replace(completed("after", None), version=2**33)  # replayed after the snapshot
        assert (await journal.claim(late, T0))[0]
        records.append(late)
    finally:
        await journal.aclose()
    async with _reopened_from_snapshot(tmp_path / "j") as again:
        assert again.recovery is not None and again.recovery.entries_replayed == 1
        assert _widths(again._calls) == ("Q", "I")
        for record in records:
            assert await again.get(record.identity) == record
        assert await again.swap(2**64 - 1, replace(records[2], state=CallState.FAILED)) is True
        assert await again.swap(2**40 + 7, replace(records[1], version=2**40 + 9)) is False


async def test_tasks_are_found_by_principal_and_id_after_a_snapshot_whatever_their_text(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path / "j", durability="relaxed")
    await journal.open()
    task_ids = ["t-1", "tâche-é-\U0001f642", "t-1"]  # the same id under another principal is another task
    records = [
        replace(completed(f"k{i}", None), identity=CallIdentity(f"p{i}", "refund", f"k{i}"), task_id=task_id)
        for i, task_id in enumerate(task_ids)
    ]
    try:
        for record in records:
            assert (await journal.claim(record, T0))[0]
        await journal.snapshot()
    finally:
        await journal.aclose()
    async with _reopened_from_snapshot(tmp_path / "j") as again:
        assert again.recovery is not None and again.recovery.entries_replayed == 0
        for record in records:
            assert record.task_id is not None
            assert await again.get_task(record.identity.principal, record.task_id) == record
        assert await again.get_task("p0", "tâche-é-\U0001f642") is None  # p1's task, not p0's
        assert await again.get_task("p1", "t-1") is None


@asynccontextmanager
async def _reopened_from_snapshot(directory: Path) -> AsyncIterator[FileJournal]:
    """The journal in `directory` opened again, having loaded a snapshot; closed on exit."""
    journal = FileJournal(directory, durability="relaxed")
    await journal.open()
    try:
        assert journal.recovery is not None and journal.recovery.snapshot_used is not None
        yield journal
    finally:
        await journal.aclose()


@pytest.mark.parametrize("seed", range(4))
def test_the_tally_and_open_sets_kept_through_puts_agree_with_ones_rebuilt_from_the_arrays(seed: int) -> None:
    """A put of a record already in the index with its tool, principal and creation time kept
    (a completion, a renewal) takes a shorter path than a put that changes them or makes a new
    slot; whichever way each went, the counts, the creation and expiry indexes and the open sets
    are what the arrays alone rebuild."""
    rng = random.Random(seed)
    index = CallIndex()
    hashes = [rng.getrandbits(128) for _ in range(400)]
    created = {h: T0 for h in hashes}
    for step in range(6000):
        h = rng.choice(hashes)
        roll = rng.random()
        slot = index.find(h)
        if roll < 0.1 and slot is not None:
            index.delete(slot)
            continue
        if roll < 0.2 or slot is None:
            created[h] = T0 + step  # a new claim of the key: a new creation time
        tool, principal = ("refund", "alice") if roll < 0.9 else (f"t{step % 3}", f"p{step % 2}")
        state = rng.randint(1, 5)
        expires = rng.choice([None, created[h] + rng.randint(0, 50), float("inf")])
        index.put_fields(h, step, state, created[h], expires, tool, principal, step, rng.randint(1, 400))
    kept_counts = index.tally.counts.by_principal
    kept_open = {code: set(slots) for code, slots in index.open.items()}
    kept_size = index.live_size()
    newest = sorted(index.tally.newest())
    due = sorted(index.tally.expiry.take(T0 + 3000))
    index.rebuild_tally()
    index.after_load()
    assert index.tally.counts.by_principal == kept_counts
    assert index.open == kept_open
    assert index.live_size() == kept_size
    assert sorted(index.tally.newest()) == newest
    assert sorted(index.tally.expiry.take(T0 + 3000)) == due
