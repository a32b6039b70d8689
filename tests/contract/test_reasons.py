"""`CallRecord.reason` is stored and read back as it was written, through every way in and
out of a journal: claim, swap, get, list_calls, get_task, and a reopen. Runs unchanged against
every backend.

None is written on PENDING, COMPLETED and FAILED records (the only states it belongs to): a
RELEASED or IN_DOUBT record without a reason is one journaled before the field existed, which
backends read with `legacy_reason` (tests/unit/test_record_json.py, the file journal's
tests/backends/test_file_legacy_reason.py).
"""

from __future__ import annotations

import dataclasses

import pytest

from mcp_durable.journal import CallQuery, CallRecord, CallState, Journal, Reason
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0, pending

IN_DOUBT_REASONS = {Reason.LOST_OWNER, Reason.OUTCOME_UNKNOWN, Reason.TIMED_OUT, Reason.PARKED, Reason.HOOK_FAILED}


def state_of(reason: Reason) -> CallState:
    return CallState.IN_DOUBT if reason in IN_DOUBT_REASONS else CallState.RELEASED


def task(key: str) -> CallRecord:
    """A PENDING record that is a task (so `get_task` finds it)."""
    return dataclasses.replace(pending(key), task_id=f"task-{key}")


async def read_every_way(journal: Journal, record: CallRecord) -> list[Reason | None]:
    """The stored reason of `record` as get, list_calls and get_task return it."""
    got = await journal.get(record.identity)
    listed = [r for r in await journal.list_calls(CallQuery(state=record.state)) if r.identity == record.identity]
    assert record.task_id is not None
    by_task = await journal.get_task(record.identity.principal, record.task_id)
    assert got is not None and by_task is not None and len(listed) == 1
    return [got.reason, listed[0].reason, by_task.reason]


@pytest.mark.parametrize("reason", list(Reason), ids=[r.value for r in Reason])
async def test_a_reason_written_by_a_claim_reads_back_every_way(journal: Journal, reason: Reason) -> None:
    record = dataclasses.replace(task(reason.value), state=state_of(reason), reason=reason, owner=None)
    won, _ = await journal.claim(record, T0)
    assert won
    assert await read_every_way(journal, record) == [reason] * 3
    assert await journal.get(record.identity) == record


@pytest.mark.parametrize("reason", list(Reason), ids=[r.value for r in Reason])
async def test_a_reason_written_by_a_swap_reads_back_every_way(journal: Journal, reason: Reason) -> None:
    _, record = await journal.claim(task(reason.value), T0)
    moved = record.evolve(state=state_of(reason), reason=reason, error="whatever the text says", owner=None)
    assert await journal.swap(record.version, moved)
    assert await read_every_way(journal, moved) == [reason] * 3
    assert await journal.get(record.identity) == moved


async def test_a_stored_reason_is_read_as_it_is_whatever_the_error_text_says(journal: Journal) -> None:
    # The error text of a cancel, on a record whose reason says otherwise: the field decides.
    _, record = await journal.claim(task("k"), T0)
    moved = record.evolve(state=CallState.RELEASED, reason=Reason.EXCEPTION, error="cancelled by an operator")
    assert await journal.swap(record.version, moved)
    assert await read_every_way(journal, moved) == [Reason.EXCEPTION] * 3


@pytest.mark.parametrize("state", [CallState.COMPLETED, CallState.FAILED])
async def test_no_reason_reads_back_as_none_on_claims_and_final_records(journal: Journal, state: CallState) -> None:
    _, record = await journal.claim(task("k"), T0)
    assert await read_every_way(journal, record) == [None] * 3
    final = record.evolve(
        state=state, result=b"{}", owner=None, error="tool said no" if state == CallState.FAILED else None
    )
    assert await journal.swap(record.version, final)
    assert await read_every_way(journal, final) == [None] * 3


async def test_a_reason_moves_with_its_record_through_swaps(journal: Journal) -> None:
    _, record = await journal.claim(task("k"), T0)
    in_doubt = record.evolve(state=CallState.IN_DOUBT, reason=Reason.LOST_OWNER, owner=None)
    assert await journal.swap(record.version, in_doubt)
    released = in_doubt.evolve(state=CallState.RELEASED, reason=Reason.NOT_APPLIED)
    assert await journal.swap(in_doubt.version, released)
    assert await read_every_way(journal, released) == [Reason.NOT_APPLIED] * 3
    retried = released.evolve(state=CallState.PENDING, reason=None, owner="B", attempts=2)
    assert await journal.swap(released.version, retried)
    assert await read_every_way(journal, retried) == [None] * 3


async def test_reasons_survive_close_and_reopen(journal_factory: JournalFactory) -> None:
    first = journal_factory()
    await first.open()
    written: list[CallRecord] = []
    try:
        for reason in Reason:
            _, record = await first.claim(task(reason.value), T0)
            moved = record.evolve(state=state_of(reason), reason=reason, owner=None)
            assert await first.swap(record.version, moved)
            written.append(moved)
    finally:
        await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        for record in written:
            assert await second.get(record.identity) == record
            assert await read_every_way(second, record) == [record.reason] * 3
    finally:
        await second.aclose()
