"""The journal contract for process entries (position recovery): every backend."""

from __future__ import annotations

from mcp_durable.journal import Journal
from tests.conftest import JournalFactory


async def test_entries_get_increasing_sequence_numbers(journal: Journal) -> None:
    first = await journal.append("p1", "context_update", {"i": 1}, 1.0)
    second = await journal.append("p2", "context_update", {"i": 2}, 2.0)
    third = await journal.append("p1", "state_transition", {"to": "running"}, 3.0)
    assert first.seq < second.seq < third.seq


async def test_entries_read_after_a_sequence_number_by_process(journal: Journal) -> None:
    a = await journal.append("p1", "context_update", {"i": 1}, 1.0)
    await journal.append("p2", "context_update", {"i": 2}, 2.0)
    c = await journal.append("p1", "context_update", {"i": 3}, 3.0)
    assert [e.data["i"] for e in await journal.entries(process_id="p1")] == [1, 3]
    assert [e.seq for e in await journal.entries(process_id="p1", after=a.seq)] == [c.seq]
    assert [e.data["i"] for e in await journal.entries(after=a.seq)] == [2, 3]
    assert [e.data["i"] for e in await journal.entries(limit=2)] == [1, 2]


async def test_the_last_checkpoint_of_a_process_is_found(journal: Journal) -> None:
    await journal.append("p1", "checkpoint", {"state": 1}, 1.0)
    await journal.append("p2", "checkpoint", {"state": 9}, 2.0)
    last = await journal.append("p1", "checkpoint", {"state": 2}, 3.0)
    found = await journal.last_checkpoint("p1")
    assert found is not None and found.seq == last.seq and found.data == {"state": 2}
    assert await journal.last_checkpoint("nobody") is None


async def test_entries_survive_close_and_reopen(journal_factory: JournalFactory) -> None:
    first = journal_factory()
    await first.open()
    written = await first.append("p1", "context_update", {"nested": {"a": [1, 2]}, "text": "é"}, 5.5)
    await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        entries = await second.entries(process_id="p1")
        assert [(e.seq, e.entry_type, e.data, e.ts) for e in entries] == [
            (written.seq, "context_update", {"nested": {"a": [1, 2]}, "text": "é"}, 5.5)
        ]
        later = await second.append("p1", "context_update", {}, 6.0)
        assert later.seq > written.seq
    finally:
        await second.aclose()
