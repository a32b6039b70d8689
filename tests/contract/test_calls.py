"""The journal contract for call records: runs unchanged against every backend."""

from __future__ import annotations

import dataclasses

import anyio
import pytest

from mcp_durable.journal import CallCursor, CallIdentity, CallQuery, CallRecord, CallState, Fence, Journal
from tests.conftest import JournalFactory

T0 = 1_700_000_000.0


def pending(
    key: str = "k",
    *,
    tool: str = "refund",
    principal: str = "local",
    created: float = T0,
    owner: str = "A",
    fingerprint: str = "f1",
) -> CallRecord:
    return CallRecord(
        identity=CallIdentity(principal, tool, key),
        fingerprint=fingerprint,
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=created,
        updated_at=created,
        owner=owner,
        lease_until=created + 30,
        arguments=b'{"a":1}',
    )


async def test_a_first_claim_wins_and_a_second_sees_the_first(journal: Journal) -> None:
    won, record = await journal.claim(pending(owner="A"), T0)
    assert won and record.owner == "A"
    won2, existing = await journal.claim(pending(owner="B"), T0)
    assert not won2
    assert existing.owner == "A" and existing.version == 1 and existing.arguments == b'{"a":1}'


async def test_of_many_concurrent_claims_exactly_one_wins(journal: Journal) -> None:
    winners: list[str] = []

    async def claim(owner: str) -> None:
        won, _ = await journal.claim(pending(owner=owner), T0)
        if won:
            winners.append(owner)

    async with anyio.create_task_group() as tg:
        for i in range(50):
            tg.start_soon(claim, f"owner-{i}")
    assert len(winners) == 1
    stored = await journal.get(CallIdentity("local", "refund", "k"))
    assert stored is not None and stored.owner == winners[0]


async def test_swap_moves_a_record_only_from_the_expected_version(journal: Journal) -> None:
    _, record = await journal.claim(pending(), T0)
    done = record.evolve(state=CallState.COMPLETED, result=b'{"content":[]}', completed_at=T0 + 1, owner=None)
    assert await journal.swap(1, done)
    assert not await journal.swap(1, record.evolve(state=CallState.RELEASED))
    stored = await journal.get(record.identity)
    assert stored == done
    assert stored is not None and stored.result == b'{"content":[]}' and stored.version == 2


async def test_swap_expecting_a_run_moves_only_a_record_of_that_run(journal_factory: JournalFactory) -> None:
    # A later record of the key (claimed after the first expired) starts again at version 1:
    # a swap that expects the first record's run must not land on it, whatever its state, and
    # also after a reopen (what a backend keeps of open records in memory is gone then).
    first = journal_factory()
    await first.open()
    _, old = await first.claim(pending(), T0)
    assert await first.swap(1, old.evolve(state=CallState.COMPLETED, result=b"{}", expires_at=T0 + 10), old.run_id)
    later = dataclasses.replace(pending(owner="B", created=T0 + 11), run_id="run-later", version=2)
    won, _ = await first.claim(dataclasses.replace(later, version=1), T0 + 11)
    assert won
    assert await first.swap(1, later, "run-later")  # the later record at version 2, PENDING
    stale = old.evolve(state=CallState.RELEASED, owner=None)  # what a stalled owner of `old` writes
    assert stale.version == 2
    assert not await first.swap(2, stale, old.run_id)
    assert await first.get(old.identity) == later
    await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        assert not await second.swap(2, stale, old.run_id)  # open, read back from storage
        done = later.evolve(state=CallState.COMPLETED, result=b'{"x":1}', owner=None)
        assert await second.swap(2, done, "run-later")
        assert not await second.swap(3, stale.evolve(), old.run_id)  # final
        assert await second.get(old.identity) == done
        # Without a run (what a reader that has the version only passes): the version decides.
        assert await second.swap(3, done.evolve())
    finally:
        await second.aclose()


async def test_swap_of_a_missing_record_fails(journal: Journal) -> None:
    assert not await journal.swap(1, pending("absent").evolve())


async def test_an_expired_record_can_be_claimed_anew(journal: Journal) -> None:
    _, record = await journal.claim(pending(), T0)
    done = record.evolve(state=CallState.COMPLETED, result=b"{}", expires_at=T0 + 10)
    assert await journal.swap(1, done)
    won, _ = await journal.claim(pending(owner="B"), T0 + 5)
    assert not won
    won, fresh = await journal.claim(pending(owner="B", created=T0 + 11), T0 + 11)
    assert won and fresh.owner == "B" and fresh.state == CallState.PENDING


async def test_renew_extends_only_the_owners_pending_lease(journal: Journal) -> None:
    _, record = await journal.claim(pending(owner="A"), T0)
    assert await journal.renew(record.identity, Fence("A", record.run_id, record.attempts), T0 + 100)
    assert not await journal.renew(record.identity, Fence("B", record.run_id, record.attempts), T0 + 200)
    stored = await journal.get(record.identity)
    assert stored is not None and stored.lease_until == T0 + 100 and stored.version == 1


async def test_principals_tools_and_keys_are_separate_identities(journal: Journal) -> None:
    for principal, tool, key in [("alice", "refund", "k"), ("bob", "refund", "k"), ("alice", "charge", "k")]:
        won, _ = await journal.claim(pending(key, tool=tool, principal=principal), T0)
        assert won
    stored = await journal.get(CallIdentity("bob", "refund", "k"))
    assert stored is not None and stored.identity.principal == "bob"
    assert await journal.get(CallIdentity("carol", "refund", "k")) is None


async def test_identities_whose_parts_hold_separators_never_collide(journal: Journal) -> None:
    # Each part is stored on its own: no joining of principal, tool and key into one string.
    triples = [
        ("a", "refund", "b:K1"),
        ("a:b", "refund", "K1"),
        ("a", "refund:b", "K1"),
        ("a/b", "refund", "K1"),
        ("a", "b/refund", "K1"),
        ("a", "refund", "b/K1"),
        ("a", "refund", 'b","K1'),
    ]
    for principal, tool, key in triples:
        won, _ = await journal.claim(pending(key, tool=tool, principal=principal, owner=principal + tool + key), T0)
        assert won, (principal, tool, key)
    for principal, tool, key in triples:
        stored = await journal.get(CallIdentity(principal, tool, key))
        assert stored is not None and stored.owner == principal + tool + key


async def test_listing_is_newest_first_and_pages_without_gaps_or_repeats(journal: Journal) -> None:
    for i in range(25):
        await journal.claim(pending(f"k{i:02d}", created=T0 + i), T0 + i)
    seen: list[str] = []
    cursor: CallCursor | None = None
    while True:
        batch = await journal.list_calls(CallQuery(limit=7, cursor=cursor))
        if not batch:
            break
        seen.extend(r.identity.key for r in batch)
        cursor = CallCursor.after(batch[-1])
    assert seen == [f"k{i:02d}" for i in reversed(range(25))]


async def test_listing_filters_by_principal_tool_and_state(journal: Journal) -> None:
    await journal.claim(pending("a", principal="alice"), T0)
    await journal.claim(pending("b", principal="bob", created=T0 + 1), T0 + 1)
    _, c = await journal.claim(pending("c", principal="alice", tool="charge", created=T0 + 2), T0 + 2)
    await journal.swap(1, c.evolve(state=CallState.IN_DOUBT))
    assert [r.identity.key for r in await journal.list_calls(CallQuery(principal="alice"))] == ["c", "a"]
    assert [r.identity.key for r in await journal.list_calls(CallQuery(tool="refund"))] == ["b", "a"]
    assert [r.identity.key for r in await journal.list_calls(CallQuery(state=CallState.IN_DOUBT))] == ["c"]


async def test_purge_drops_only_expired_records(journal: Journal) -> None:
    _, a = await journal.claim(pending("a"), T0)
    _, b = await journal.claim(pending("b"), T0)
    await journal.swap(1, a.evolve(state=CallState.COMPLETED, expires_at=T0 + 10))
    await journal.swap(1, b.evolve(state=CallState.COMPLETED, expires_at=T0 + 100))
    assert await journal.purge_expired(T0 + 50) == 1
    assert await journal.get(a.identity) is None
    assert await journal.get(b.identity) is not None


async def test_a_waiter_wakes_when_the_record_changes(journal: Journal) -> None:
    _, record = await journal.claim(pending(), T0)
    woke_at: list[float] = []

    async def waiter() -> None:
        start = anyio.current_time()
        while True:
            await journal.wait_for_change(record.identity, 5.0)
            current = await journal.get(record.identity)
            if current is not None and current.state == CallState.COMPLETED:
                woke_at.append(anyio.current_time() - start)
                return

    async with anyio.create_task_group() as tg:
        tg.start_soon(waiter)
        await anyio.sleep(0.05)
        await journal.swap(1, record.evolve(state=CallState.COMPLETED, result=b"{}"))
    assert woke_at and woke_at[0] < 4.0


async def test_records_survive_close_and_reopen(journal_factory: JournalFactory) -> None:
    first = journal_factory()
    await first.open()
    _, record = await first.claim(pending(), T0)
    await first.swap(1, record.evolve(state=CallState.COMPLETED, result=b'{"x":1}', completed_at=T0 + 1))
    await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        stored = await second.get(record.identity)
        assert stored is not None
        assert stored.state == CallState.COMPLETED and stored.result == b'{"x":1}' and stored.version == 2
    finally:
        await second.aclose()


async def test_stats_count_records_by_state_and_tool(journal: Journal) -> None:
    _, a = await journal.claim(pending("a"), T0)
    await journal.claim(pending("b", tool="charge"), T0 + 1)
    await journal.swap(1, a.evolve(state=CallState.COMPLETED))
    stats = await journal.stats()
    assert stats.calls_by_state == {"completed": 1, "pending": 1}
    assert stats.calls_by_tool == {"refund": 1, "charge": 1}
    assert stats.oldest_record_at == T0


@pytest.mark.parametrize("size", [0, 1, 70_000])
async def test_results_of_any_size_come_back_byte_identical(journal: Journal, size: int) -> None:
    payload = b'{"content":[{"type":"text","text":"' + b"x" * size + b'"}]}'
    _, record = await journal.claim(pending(), T0)
    await journal.swap(1, record.evolve(state=CallState.COMPLETED, result=payload))
    stored = await journal.get(record.identity)
    assert stored is not None and stored.result == payload
