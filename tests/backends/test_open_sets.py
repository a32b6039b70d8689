"""The memory and file journals' indexes of open records: the sets a listing of PENDING or
IN_DOUBT records reads instead of every record (`MemoryJournal._open`, `CallIndex.open` and
`CallIndex.task_hashes`).

They hold exactly the open records (never a record that is done or gone: a listing reads only
what can need it) through claims, swaps, purges and claims over expired records, and the file
journal's come back from a snapshot (rebuilt from its state array) and from the frames replayed
after it. Real journals on real files.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mcp_durable.journal import CallQuery, CallRecord, CallState
from mcp_durable.journal.base import OPEN_STATES
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.file.index import OPEN_CODES, STATE_CODES, CallIndex
from mcp_durable.journal.memory import MemoryJournal
from tests.contract.test_calls import T0
from tests.contract.test_open_calls import _fill, _moved, _record


def _walked(idx: CallIndex) -> dict[int, set[int]]:
    """The open slots by state code, found by a walk over every slot."""
    return {code: {s for s in range(len(idx.state)) if idx.state[s] == code} for code in OPEN_CODES}


async def _check_file(journal: FileJournal) -> list[CallRecord]:
    idx = journal._calls
    assert idx.open == _walked(idx)
    everything = await journal.list_calls(CallQuery(limit=100_000))
    for state in OPEN_STATES:
        tasks = {
            slot
            for r in everything
            if r.state == state and r.task_id is not None and (slot := idx.find(journal._hash(r.identity))) is not None
        }
        # A listing of open tasks looks at those tasks' slots only (none when there are none).
        assert set(idx.listing_slots(state, tasks_only=True)) == tasks
        assert set(idx.listing_slots(state, tasks_only=False)) == idx.open[STATE_CODES[state]]
    return everything


async def _changes(journal: FileJournal | MemoryJournal) -> None:
    """Open records closed, done ones reopened, open ones purged, an expired task claimed again."""
    records = {r.identity.key: r for r in await journal.list_calls(CallQuery(limit=1000))}
    for key, new in (
        ("k000", _moved(records["k000"], CallState.IN_DOUBT)),
        ("k001", _moved(records["k001"], CallState.COMPLETED)),
        ("k004", records["k004"].evolve(state=CallState.PENDING, owner="B", lease_until=T0 + 99)),
        ("k010", records["k010"].evolve(expires_at=T0 + 5)),
        ("k006", records["k006"].evolve(expires_at=T0 + 5)),
        ("k020", records["k020"].evolve(expires_at=T0 + 5)),
    ):
        assert await journal.swap(records[key].version, new)
    assert len((await journal.purge_expired_calls(T0 + 6)).calls) == 3
    won, _ = await journal.claim(dataclasses.replace(_record(20), task_id=None, created_at=T0 + 100), T0 + 7)
    assert won


async def test_the_file_journals_open_sets_hold_the_open_records_through_changes_snapshots_and_replay(
    tmp_path: Path,
) -> None:
    journal = FileJournal(tmp_path / "j", durability="relaxed")
    await journal.open()
    try:
        await _fill(journal, 60)
        await _check_file(journal)
        await _changes(journal)
        await _check_file(journal)
        assert await journal.snapshot() is not None
        # After the snapshot, frames that recovery replays on top of it.
        records = {r.identity.key: r for r in await journal.list_calls(CallQuery(limit=1000))}
        assert await journal.swap(records["k005"].version, _moved(records["k005"], CallState.COMPLETED))
        reopened = records["k003"].evolve(state=CallState.PENDING, owner="C", lease_until=T0 + 99)
        assert await journal.swap(records["k003"].version, reopened)
        before = await _check_file(journal)
    finally:
        await journal.aclose()
    again = FileJournal(tmp_path / "j")
    await again.open()
    try:
        assert again.recovery is not None and again.recovery.snapshot_used is not None
        assert again.recovery.entries_replayed > 0
        assert await _check_file(again) == before
    finally:
        await again.aclose()


async def test_the_memory_journals_open_sets_hold_the_open_records_through_changes() -> None:
    journal = MemoryJournal()
    await journal.open()
    await _fill(journal, 60)
    await _changes(journal)
    walked = {
        (state, task): {i for i, r in journal._calls.items() if r.state == state and (r.task_id is not None) == task}
        for state in OPEN_STATES
        for task in (False, True)
    }
    assert journal._open == walked
