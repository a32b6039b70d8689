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


async def test_purged_entries_are_never_read_again_and_other_processes_keep_theirs(
    journal_factory: JournalFactory,
) -> None:
    store = journal_factory()
    await store.open()
    try:
        steps = [await store.append("steps/r1", "step", {"index": i}, 1.0 + i) for i in range(3)]
        kept = await store.append("steps/r2", "step", {"index": 0}, 5.0)
        life = [await store.append("server/s", t, {"to": t}, 6.0) for t in ("starting", "running")]
        mark = await store.append("server/s", "checkpoint", {"context_state": {}, "lifecycle_state": "running"}, 7.0)
        after = await store.append("server/s", "state_transition", {"to": "stopping"}, 8.0)
        assert await store.purge_entries(["steps/r1"]) == 3
        assert await store.purge_entries(["steps/r1"]) == 0
        assert await store.purge_entries(["server/s"], before_seq=mark.seq) == 2
        assert await store.entries(process_id="steps/r1") == []
        assert [e.seq for e in await store.entries(process_id="server/s")] == [mark.seq, after.seq]
        assert [e.seq for e in await store.entries()] == [kept.seq, mark.seq, after.seq]
        assert [e.seq for e in await store.entries(after=steps[0].seq, limit=2)] == [kept.seq, mark.seq]
        last = await store.last_checkpoint("server/s")
        assert last is not None and last.seq == mark.seq
        assert (await store.stats()).entries == 3
        assert life[0].seq < mark.seq
    finally:
        await store.aclose()
    store = journal_factory()  # what a purge dropped stays dropped over a reopen (or was kept: never half)
    await store.open()
    try:
        assert (await store.last_checkpoint("server/s")) is not None
        assert [e.seq for e in await store.entries(process_id="steps/r2")] == [kept.seq]
    finally:
        await store.aclose()
