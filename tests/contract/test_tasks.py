"""The journal contract for MCP tasks (records with a `task_id`): runs unchanged against every backend."""

from __future__ import annotations

from mcp_durable.journal import CallQuery, CallState, Journal
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0, pending


async def test_a_task_is_found_by_its_principal_and_id_only(journal: Journal) -> None:
    _, record = await journal.claim(pending("k1", principal="alice").evolve(task_id="tid-alice-1"), T0)
    await journal.claim(pending("k2", principal="alice"), T0 + 1)  # a plain call: not a task
    found = await journal.get_task("alice", "tid-alice-1")
    assert found is not None and found.identity == record.identity and found.task_id == "tid-alice-1"
    assert await journal.get_task("bob", "tid-alice-1") is None  # another principal: like an unknown id
    assert await journal.get_task("alice", "tid-unknown") is None


async def test_a_task_follows_its_record_through_swaps(journal: Journal) -> None:
    _, record = await journal.claim(pending("k").evolve(task_id="t-1"), T0)
    done = record.evolve(state=CallState.COMPLETED, result=b'{"content":[]}', owner=None)
    assert await journal.swap(record.version, done)
    found = await journal.get_task("local", "t-1")
    assert found is not None and found.state == CallState.COMPLETED and found.result == b'{"content":[]}'


async def test_a_task_id_can_be_attached_to_an_existing_record(journal: Journal) -> None:
    _, record = await journal.claim(pending("k"), T0)
    assert await journal.get_task("local", "t-late") is None
    assert await journal.swap(record.version, record.evolve(task_id="t-late"))
    found = await journal.get_task("local", "t-late")
    assert found is not None and found.identity == record.identity


async def test_listing_tasks_only_shows_records_that_are_tasks(journal: Journal) -> None:
    await journal.claim(pending("a", principal="alice").evolve(task_id="ta"), T0)
    await journal.claim(pending("b", principal="alice"), T0 + 1)
    await journal.claim(pending("c", principal="alice").evolve(task_id="tc"), T0 + 2)
    await journal.claim(pending("d", principal="bob").evolve(task_id="td"), T0 + 3)
    listed = await journal.list_calls(CallQuery(principal="alice", tasks_only=True))
    assert [r.task_id for r in listed] == ["tc", "ta"]
    first = await journal.list_calls(CallQuery(principal="alice", tasks_only=True, limit=1))
    from mcp_durable.journal import CallCursor

    rest = await journal.list_calls(CallQuery(principal="alice", tasks_only=True, cursor=CallCursor.after(first[0])))
    assert [r.task_id for r in first + rest] == ["tc", "ta"]


async def test_an_expired_task_is_gone_after_a_purge(journal: Journal) -> None:
    _, record = await journal.claim(pending("k").evolve(task_id="t-old"), T0)
    await journal.swap(record.version, record.evolve(state=CallState.COMPLETED, expires_at=T0 + 10, owner=None))
    assert await journal.purge_expired(T0 + 20) == 1
    assert await journal.get_task("local", "t-old") is None
    assert await journal.list_calls(CallQuery(tasks_only=True)) == []


async def test_tasks_survive_close_and_reopen(journal_factory: JournalFactory) -> None:
    first = journal_factory()
    await first.open()
    _, record = await first.claim(pending("k", principal="alice").evolve(task_id="t-durable"), T0)
    await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        found = await second.get_task("alice", "t-durable")
        assert found is not None and found.identity == record.identity
    finally:
        await second.aclose()


async def test_the_file_journal_keeps_tasks_in_its_snapshot(tmp_path: object) -> None:
    from pathlib import Path

    from mcp_durable.journal import create_journal
    from mcp_durable.journal.file import FileJournal

    url = f"file://{Path(str(tmp_path)) / 'j'}"
    first = create_journal(url)
    assert isinstance(first, FileJournal)
    await first.open()
    await first.claim(pending("k", principal="alice").evolve(task_id="t-snap"), T0)
    assert await first.snapshot() is not None
    await first.aclose()
    second = create_journal(url)
    await second.open()
    try:
        assert second.recovery is not None and second.recovery.snapshot_used is not None
        found = await second.get_task("alice", "t-snap")
        assert found is not None and found.identity.key == "k"
    finally:
        await second.aclose()
