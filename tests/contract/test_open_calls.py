"""Listings of the open records (PENDING and IN_DOUBT: `OPEN_STATES`), on every backend.

Each backend answers them through an index of those records only (SQLite and Postgres: the
partial index `calls_open`; the file and memory journals: sets kept in memory). Whatever the
index, a listing selects exactly what `CallQuery.page` selects from every record (read here by a
listing of all states, which no such index answers), follows every change of a record's state,
task or existence, and `each_call` pages through more records than a page holds, each once, in
listing order. A listing of one principal never returns another's record.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import anyio

from mcp_durable.journal import CallCursor, CallIdentity, CallQuery, CallRecord, CallState, Journal
from mcp_durable.journal.base import OPEN_STATES, each_call
from mcp_durable.journal.model import Reason
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0

#: Records per page in these listings: several pages of every selection.
PAGE = 7
STATES = (CallState.PENDING, CallState.IN_DOUBT, CallState.COMPLETED, CallState.FAILED, CallState.RELEASED)


def _record(n: int) -> CallRecord:
    """Record `n` as first claimed: three principals, two tools, every other one a task; three
    records share each creation time (the listing's order then falls to the identity)."""
    created = T0 + n // 3
    return CallRecord(
        identity=CallIdentity(("alice", "bob", "carol")[n % 3], ("refund", "ship")[n % 2], f"k{n:03d}"),
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{n}",
        attempts=1,
        created_at=created,
        updated_at=created,
        owner="gone",
        lease_until=created + 30,
        task_id=f"task-{n}" if n % 2 == 0 else None,
    )


def _moved(record: CallRecord, state: CallState) -> CallRecord:
    """`record` moved to `state`, as the engine's transitions leave it."""
    if state == CallState.PENDING:
        return record.evolve(updated_at=record.updated_at + 1)
    if state == CallState.IN_DOUBT:
        return record.evolve(state=state, reason=Reason.LOST_OWNER, owner=None, lease_until=None)
    if state == CallState.RELEASED:
        return record.evolve(state=state, reason=Reason.EXCEPTION, owner=None, lease_until=None)
    return record.evolve(state=state, result=b'{"content":[]}', owner=None, lease_until=None)


def _queries() -> Iterator[CallQuery]:
    for state in OPEN_STATES:
        for tasks_only in (False, True):
            for principal in (None, "alice"):
                for tool in (None, "ship"):
                    yield CallQuery(principal=principal, tool=tool, state=state, limit=PAGE, tasks_only=tasks_only)


async def _check_listings(journal: Journal) -> None:
    """Every open-state listing equals the reference selection from all records, page by page."""
    everything = await journal.list_calls(CallQuery(limit=100_000))
    for query in _queries():
        expected = dataclasses.replace(query, limit=len(everything) + 1).page(everything)
        got = [record async for record in each_call(journal, query)]
        assert got == expected, query
        assert await journal.list_calls(query) == expected[:PAGE], query
        if query.principal is not None:
            assert {r.identity.principal for r in got} <= {query.principal}
        # A listing that starts after a record goes on from the next one.
        if len(expected) > 2:
            after = dataclasses.replace(query, cursor=None).page(everything)[1]
            from_there = dataclasses.replace(query, cursor=CallCursor.after(after))
            assert [r async for r in each_call(journal, from_there)] == expected[2:], query


async def _fill(journal: Journal, count: int) -> list[CallRecord]:
    """Claim `count` records at once, then move each to its state (`STATES`, in turn); the records."""
    records = [_record(n) for n in range(count)]

    async def claim_and_move(n: int) -> None:
        won, claimed = await journal.claim(records[n], T0)
        assert won
        state = STATES[n % len(STATES)]
        if state != CallState.PENDING:
            moved = _moved(claimed, state)
            assert await journal.swap(claimed.version, moved)
            claimed = moved
        records[n] = claimed

    async with anyio.create_task_group() as tg:
        for n in range(count):
            tg.start_soon(claim_and_move, n)
    return records


async def test_open_listings_select_what_the_reference_selects_page_after_page(journal: Journal) -> None:
    records = await _fill(journal, 120)
    open_count = sum(r.state in OPEN_STATES for r in records)
    assert open_count == 48 and open_count > 3 * PAGE
    await _check_listings(journal)


async def test_open_listings_follow_every_change_of_state_task_and_existence(journal: Journal) -> None:
    records = await _fill(journal, 60)
    by_key = {r.identity.key: r for r in records}

    async def move(key: str, new: CallRecord) -> None:
        assert await journal.swap(by_key[key].version, new)
        by_key[key] = new

    # Open to open, open to done, done to open, a task id attached to an open record.
    await move("k000", _moved(by_key["k000"], CallState.IN_DOUBT))  # pending task → in doubt
    await move("k001", _moved(by_key["k001"], CallState.COMPLETED))  # in doubt → completed
    await move("k004", by_key["k004"].evolve(state=CallState.PENDING, owner="B", lease_until=T0 + 99))  # released
    await move("k005", by_key["k005"].evolve(task_id="task-late"))  # a pending plain call becomes a task
    assert by_key["k005"].state == CallState.PENDING
    await _check_listings(journal)
    # Open records expire and are purged; one identity is claimed again, as a plain call.
    for key in ("k010", "k011", "k006"):
        await move(key, by_key[key].evolve(expires_at=T0 + 5))
    assert (await journal.purge_expired_calls(T0 + 6)).calls
    await move("k020", by_key["k020"].evolve(expires_at=T0 + 7))  # a pending task, expired
    again = dataclasses.replace(_record(20), task_id=None, created_at=T0 + 100, updated_at=T0 + 100)
    won, _ = await journal.claim(again, T0 + 8)
    assert won
    await _check_listings(journal)
    listed = await journal.list_calls(CallQuery(state=CallState.PENDING, tasks_only=True, limit=1000))
    assert "k020" not in {r.identity.key for r in listed}


async def test_open_listings_come_back_the_same_after_a_reopen(journal_factory: JournalFactory) -> None:
    journal = journal_factory()
    await journal.open()
    try:
        records = await _fill(journal, 45)
        await journal.swap(records[0].version, _moved(records[0], CallState.IN_DOUBT))
        before = [await journal.list_calls(dataclasses.replace(q, limit=1000)) for q in _queries()]
    finally:
        await journal.aclose()
    again = journal_factory()
    await again.open()
    try:
        assert [await again.list_calls(dataclasses.replace(q, limit=1000)) for q in _queries()] == before
        await _check_listings(again)
    finally:
        await again.aclose()


async def test_a_journal_without_open_records_lists_none(journal: Journal) -> None:
    assert [r async for r in each_call(journal, CallQuery(state=CallState.PENDING, limit=PAGE))] == []
    done = await _fill(journal, 10)
    for record in done:
        if record.state in OPEN_STATES:
            assert await journal.swap(record.version, _moved(record, CallState.COMPLETED))
    for query in _queries():
        assert await journal.list_calls(query) == []
