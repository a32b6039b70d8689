"""The journal contract for `find_calls` (a call of every principal, by tool and key): runs
unchanged against every backend."""

from __future__ import annotations

from mcp_durable.journal import CallIdentity, CallQuery, CallState, Journal
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0, pending


async def test_a_call_is_found_for_every_principal_newest_first_and_nothing_else(journal: Journal) -> None:
    for principal, tool, key, created in (
        ("alice", "refund", "o-1", T0 + 2),
        ("bob", "refund", "o-1", T0 + 5),
        ("carol", "refund", "o-1", T0 + 2),  # a tie on time: by identity, descending
        ("dave", "refund", "o-2", T0),  # another key
        ("erin", "ship", "o-1", T0),  # another tool
        ("frank", "refund", "o-10", T0),  # a key the first is a prefix of
    ):
        await journal.claim(pending(key, tool=tool, principal=principal, created=created), created)
    found = await journal.find_calls("refund", "o-1")
    assert [r.identity.principal for r in found] == ["bob", "carol", "alice"]
    assert found == [r for r in await journal.list_calls(CallQuery(tool="refund")) if r.identity.key == "o-1"]
    assert [r.identity.principal for r in await journal.find_calls("ship", "o-1")] == ["erin"]
    assert await journal.find_calls("refund", "o-3") == []
    assert await journal.find_calls("mail", "o-1") == []


async def test_found_records_are_the_stored_ones_expired_until_purged(journal: Journal) -> None:
    _, a = await journal.claim(pending("k", principal="alice"), T0)
    await journal.claim(pending("k", principal="bob", created=T0 + 1), T0 + 1)
    done = a.evolve(state=CallState.COMPLETED, owner=None, result=b"{}", expires_at=T0 + 10)
    assert await journal.swap(a.version, done)
    assert [r for r in await journal.find_calls("refund", "k") if r.identity.principal == "alice"] == [done]
    assert await journal.purge_expired(T0 + 10) == 1
    assert [r.identity for r in await journal.find_calls("refund", "k")] == [CallIdentity("bob", "refund", "k")]


async def test_calls_are_found_after_close_and_reopen(journal_factory: JournalFactory) -> None:
    first = journal_factory()
    await first.open()
    try:
        for principal in ("alice", "bob"):
            await first.claim(pending("k", principal=principal), T0)
    finally:
        await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        assert [r.identity.principal for r in await second.find_calls("refund", "k")] == ["bob", "alice"]
    finally:
        await second.aclose()
