"""Fencing: `Journal.renew` and `Journal.append_step` are accepted only while the record is
PENDING under the writer's `Fence` (its owner, run and attempt), and a run's step log holds at
most one entry per step index (first writer wins). When refused, nothing is written. Runs
unchanged against every backend."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio
import pytest

from mcp_durable.journal import CallIdentity, CallRecord, CallState, Fence, Journal, JournalEntry
from mcp_durable.journal.base import STEP, step_process_id
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0, pending

MISSING = CallIdentity("local", "refund", "absent")


async def claimed(journal: Journal, key: str = "k") -> tuple[CallRecord, Fence]:
    won, record = await journal.claim(pending(key, owner="A"), T0)
    assert won and record.fence is not None
    return record, record.fence


def differing(fence: Fence, part: str) -> Fence:
    """`fence` with one part (`owner`, `run_id` or `attempts`) changed."""
    if part == "attempts":
        return fence._replace(attempts=fence.attempts + 1)
    return fence._replace(owner="other") if part == "owner" else fence._replace(run_id="other")


async def everything(journal: Journal) -> tuple[CallRecord | None, list[JournalEntry]]:
    """What a refused write must leave as it was: the record and every entry."""
    return await journal.get(CallIdentity("local", "refund", "k")), await journal.entries()


# -- renew --------------------------------------------------------------------------------------


async def test_renewing_under_the_records_fence_sets_the_lease_and_keeps_the_version(journal: Journal) -> None:
    record, fence = await claimed(journal)
    assert fence == Fence("A", record.run_id, record.attempts)
    assert await journal.renew(record.identity, fence, T0 + 100)
    assert await journal.get(record.identity) == dataclasses.replace(record, lease_until=T0 + 100)


@pytest.mark.parametrize("part", ["owner", "run_id", "attempts"])
async def test_renewing_under_a_fence_that_differs_in_one_part_fails_and_changes_nothing(
    journal: Journal, part: str
) -> None:
    record, fence = await claimed(journal)
    other = differing(fence, part)
    before = await everything(journal)
    assert not await journal.renew(record.identity, other, T0 + 100)
    assert await everything(journal) == before


async def test_a_fenced_out_owner_cannot_renew_after_a_take_over(journal: Journal) -> None:
    record, fence = await claimed(journal)
    successor = record.evolve(owner="B", attempts=record.attempts + 1, lease_until=T0 + 60)
    assert await journal.swap(record.version, successor)
    assert not await journal.renew(record.identity, fence, T0 + 100)
    assert await journal.get(record.identity) == successor
    assert successor.fence is not None and await journal.renew(record.identity, successor.fence, T0 + 90)


# -- append_step: written while held ------------------------------------------------------------


async def test_a_step_appended_under_the_fence_is_an_entry_of_the_runs_step_process(journal: Journal) -> None:
    record, fence = await claimed(journal)
    data = {"result": {"charged": 5}}
    entry = await journal.append_step(record.identity, fence, 0, data, T0 + 1)
    assert entry is not None and entry.seq > 0
    assert (entry.process_id, entry.entry_type, entry.ts) == (step_process_id(record.run_id), STEP, T0 + 1)
    assert entry.data == {"result": {"charged": 5}, "index": 0}
    assert data == {"result": {"charged": 5}}  # the caller's dict is not changed
    assert await journal.entries(process_id=step_process_id(record.run_id)) == [entry]
    stored = await journal.get(record.identity)
    assert stored == record  # a step changes nothing of the record


async def test_steps_of_one_run_get_strictly_increasing_sequence_numbers(journal: Journal) -> None:
    record, fence = await claimed(journal)
    entries = [await journal.append_step(record.identity, fence, i, {"i": i}, T0 + i) for i in range(5)]
    seqs = [e.seq for e in entries if e is not None]
    assert len(seqs) == 5 and seqs == sorted(set(seqs))
    stored = await journal.entries(process_id=step_process_id(record.run_id))
    assert [e.data["index"] for e in stored] == [0, 1, 2, 3, 4]


async def test_a_step_whose_data_already_names_its_index_is_written_as_it_is(journal: Journal) -> None:
    record, fence = await claimed(journal)
    entry = await journal.append_step(record.identity, fence, 3, {"index": 3, "v": "x"}, T0)
    assert entry is not None and entry.data == {"index": 3, "v": "x"}


async def test_a_step_whose_data_names_another_index_is_a_programming_error(journal: Journal) -> None:
    record, fence = await claimed(journal)
    with pytest.raises(ValueError):
        await journal.append_step(record.identity, fence, 3, {"index": 4}, T0)
    assert await journal.entries() == []


# -- append_step: refused, nothing written ------------------------------------------------------


async def assert_refused(journal: Journal, identity: CallIdentity, fence: Fence, index: int = 0) -> None:
    before = await everything(journal)
    assert await journal.append_step(identity, fence, index, {"late": True}, T0 + 50) is None
    assert await everything(journal) == before


async def test_a_step_of_a_missing_record_is_refused(journal: Journal) -> None:
    await assert_refused(journal, MISSING, Fence("A", "run-absent", 1))


@pytest.mark.parametrize("part", ["owner", "run_id", "attempts"])
async def test_a_step_under_a_fence_that_differs_in_one_part_is_refused(journal: Journal, part: str) -> None:
    record, fence = await claimed(journal)
    await assert_refused(journal, record.identity, differing(fence, part))


@pytest.mark.parametrize(
    "change",
    [{"owner": "B", "attempts": 2}, {"attempts": 2}, {"run_id": "run-rerun", "attempts": 1}],
    ids=["another-owner", "another-attempt", "another-run"],
)
async def test_a_step_of_an_owner_whose_record_was_taken_over_is_refused(
    journal: Journal, change: dict[str, Any]
) -> None:
    record, fence = await claimed(journal)
    assert await journal.append_step(record.identity, fence, 0, {"first": True}, T0) is not None
    successor = record.evolve(lease_until=T0 + 60, **change)
    assert await journal.swap(record.version, successor)
    await assert_refused(journal, record.identity, fence, index=1)
    assert successor.fence is not None
    assert await journal.append_step(record.identity, successor.fence, 1, {}, T0 + 51) is not None


@pytest.mark.parametrize("state", [s for s in CallState if s != CallState.PENDING])
async def test_a_step_of_a_record_no_longer_pending_is_refused(journal: Journal, state: CallState) -> None:
    record, fence = await claimed(journal)
    # The owner, run and attempt are kept on purpose: only the state fences the writer out.
    moved = record.evolve(state=state, result=b"{}" if state.is_final else None)
    assert await journal.swap(record.version, moved)
    await assert_refused(journal, record.identity, fence)


async def test_a_step_index_already_written_is_refused_and_the_first_entry_stays(journal: Journal) -> None:
    record, fence = await claimed(journal)
    first = await journal.append_step(record.identity, fence, 0, {"v": "first"}, T0)
    assert first is not None
    await assert_refused(journal, record.identity, fence, index=0)
    assert await journal.entries(process_id=step_process_id(record.run_id)) == [first]


async def test_a_step_index_written_by_a_plain_append_counts_as_written(journal: Journal) -> None:
    # An operator's re-run copies a run's steps into the new run's step process with `append`.
    record, fence = await claimed(journal)
    copied = await journal.append(step_process_id(record.run_id), STEP, {"index": 2, "v": "copied"}, T0)
    await assert_refused(journal, record.identity, fence, index=2)
    assert await journal.append_step(record.identity, fence, 1, {}, T0) is not None  # other indexes are free
    assert [e.seq for e in await journal.entries(process_id=step_process_id(record.run_id))][0] == copied.seq


async def test_entries_that_are_not_steps_of_that_run_do_not_count(journal: Journal) -> None:
    record, fence = await claimed(journal)
    await journal.append(step_process_id(record.run_id), "note", {"index": 0}, T0)  # not a step
    await journal.append(step_process_id("another-run"), STEP, {"index": 0}, T0)  # another run's
    await journal.append("worker", STEP, {"index": 0}, T0)  # not a step process
    assert await journal.append_step(record.identity, fence, 0, {}, T0) is not None


async def test_a_successor_cannot_write_again_a_step_its_predecessor_wrote(journal: Journal) -> None:
    # An in-doubt retry keeps the run: its step log is the predecessor's, first writer wins.
    record, fence = await claimed(journal)
    assert await journal.append_step(record.identity, fence, 0, {"by": "A"}, T0) is not None
    successor = record.evolve(owner="B", attempts=2)
    assert await journal.swap(record.version, successor) and successor.fence is not None
    assert await journal.append_step(record.identity, successor.fence, 0, {"by": "B"}, T0) is None
    assert [e.data["by"] for e in await journal.entries(process_id=step_process_id(record.run_id))] == ["A"]


async def test_of_many_concurrent_appends_of_one_step_exactly_one_is_written(journal: Journal) -> None:
    record, fence = await claimed(journal)
    written: list[JournalEntry] = []

    async def append(n: int) -> None:
        entry = await journal.append_step(record.identity, fence, 0, {"writer": n}, T0 + n)
        if entry is not None:
            written.append(entry)

    async with anyio.create_task_group() as tg:
        for n in range(50):
            tg.start_soon(append, n)
    assert len(written) == 1
    assert await journal.entries(process_id=step_process_id(record.run_id)) == written


async def test_concurrent_steps_of_distinct_indexes_are_all_written_in_seq_order(journal: Journal) -> None:
    record, fence = await claimed(journal)
    written: list[JournalEntry] = []

    async def append(n: int) -> None:
        entry = await journal.append_step(record.identity, fence, n % 10, {"writer": n}, T0 + n)
        if entry is not None:
            written.append(entry)

    async with anyio.create_task_group() as tg:
        for n in range(40):
            tg.start_soon(append, n)
    assert sorted(e.data["index"] for e in written) == list(range(10))
    stored = await journal.entries(process_id=step_process_id(record.run_id))
    assert sorted(stored, key=lambda e: e.seq) == stored and len({e.seq for e in stored}) == 10
    assert {e.seq for e in stored} == {e.seq for e in written}


async def test_a_step_swapped_out_concurrently_is_either_written_before_the_take_over_or_refused(
    journal: Journal,
) -> None:
    # The fence check and the write are one step: a refused step is never written, and a step
    # written is one whose fence held when it landed (before the successor's swap).
    record, fence = await claimed(journal)
    results: list[JournalEntry | None] = []

    async def step(n: int) -> None:
        results.append(await journal.append_step(record.identity, fence, n, {}, T0 + n))

    async def take_over() -> None:
        assert await journal.swap(record.version, record.evolve(owner="B", attempts=2))

    async with anyio.create_task_group() as tg:
        for n in range(20):
            tg.start_soon(step, n)
        tg.start_soon(take_over)
        for n in range(20, 40):
            tg.start_soon(step, n)
    written = [e for e in results if e is not None]
    stored = await journal.entries(process_id=step_process_id(record.run_id))
    assert sorted(e.seq for e in written) == [e.seq for e in stored]
    assert len(results) == 40


async def test_a_purged_step_index_can_be_written_again(journal: Journal) -> None:
    record, fence = await claimed(journal)
    assert await journal.append_step(record.identity, fence, 0, {"v": 1}, T0) is not None
    assert await journal.purge_entries([step_process_id(record.run_id)]) == 1
    again = await journal.append_step(record.identity, fence, 0, {"v": 2}, T0 + 1)
    assert again is not None and await journal.entries(process_id=step_process_id(record.run_id)) == [again]


async def test_a_written_step_index_stays_taken_after_reopening(journal_factory: JournalFactory) -> None:
    first = journal_factory()
    await first.open()
    try:
        record, fence = await claimed(first)
        assert await first.append_step(record.identity, fence, 0, {"v": 1}, T0) is not None
        await first.append(step_process_id(record.run_id), STEP, {"index": 1}, T0)
    finally:
        await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        assert await second.append_step(record.identity, fence, 0, {"v": 2}, T0) is None
        assert await second.append_step(record.identity, fence, 1, {"v": 2}, T0) is None
        assert await second.append_step(record.identity, fence, 2, {"v": 2}, T0) is not None
        stored = await second.entries(process_id=step_process_id(record.run_id))
        assert [e.data.get("v") for e in stored] == [1, None, 2]
    finally:
        await second.aclose()
