"""The journal contract for `count_calls` (and `stats`, which counts the same records): runs
unchanged against every backend, each answer compared with `CountQuery.count` over the records
`list_calls` lists (the reference)."""

from __future__ import annotations

import random

import pytest

from mcp_durable.journal import CallCounts, CallQuery, CallRecord, CallState, CountQuery, Journal
from mcp_durable.journal.base import Maintainable
from tests.conftest import JournalFactory
from tests.contract.test_calls import T0, pending


async def every_record(journal: Journal) -> list[CallRecord]:
    return await journal.list_calls(CallQuery(limit=100_000))


async def assert_counts_agree(journal: Journal, *queries: CountQuery) -> None:
    """`count_calls(q)` equals the reference count of every listed record, for each query."""
    records = await every_record(journal)
    for query in queries:
        assert await journal.count_calls(query) == query.count(records), query


def done(record: CallRecord, state: CallState = CallState.COMPLETED, expires_at: float | None = None) -> CallRecord:
    return record.evolve(
        state=state, owner=None, result=b"{}", completed_at=record.created_at + 1, expires_at=expires_at
    )


async def three_principals(journal: Journal) -> None:
    """alice: 3 calls of 2 tools in 3 states; bob: 2 calls; carol: 1 call, created later."""
    for key, tool, principal, created in (
        ("a1", "refund", "alice", T0),
        ("a2", "refund", "alice", T0 + 61),
        ("a3", "ship", "alice", T0 + 125),
        ("b1", "refund", "bob", T0 + 30),
        ("b2", "ship", "bob", T0 + 300),
        ("c1", "mail", "carol", T0 + 3600),
    ):
        await journal.claim(pending(key, tool=tool, principal=principal, created=created), created)
    a1 = await journal.get(pending("a1", principal="alice").identity)
    a2 = await journal.get(pending("a2", principal="alice").identity)
    assert a1 is not None and a2 is not None
    assert await journal.swap(a1.version, done(a1))
    assert await journal.swap(a2.version, done(a2, CallState.FAILED))


async def test_counts_by_state_tool_and_principal_with_the_oldest_record(journal: Journal) -> None:
    assert await journal.count_calls() == CallCounts({}, {}, {}, {}, None)
    await three_principals(journal)
    counts = await journal.count_calls()
    assert counts.by_state == {"completed": 1, "failed": 1, "pending": 4}
    assert counts.by_tool == {"mail": 1, "refund": 3, "ship": 2}
    assert counts.by_principal == {"alice": 3, "bob": 2, "carol": 1}
    assert counts.by_bucket == {} and counts.total == 6
    assert counts.oldest_created_at == T0
    await assert_counts_agree(journal, CountQuery())


async def test_a_principals_counts_never_include_another_principals_records(journal: Journal) -> None:
    await three_principals(journal)
    bob = await journal.count_calls(CountQuery(principal="bob"))
    assert bob == CallCounts({"pending": 2}, {"refund": 1, "ship": 1}, {"bob": 2}, {}, T0 + 30)
    carol = await journal.count_calls(CountQuery(principal="carol", since=T0, bucket_s=60))
    assert carol.by_principal == {"carol": 1} and carol.by_bucket == {60: 1}
    nobody = await journal.count_calls(CountQuery(principal="mallory"))
    assert nobody == CallCounts({}, {}, {}, {}, None)
    assert await journal.count_calls(CountQuery(principal="mallory", since=T0 - 1)) == nobody
    await assert_counts_agree(
        journal, *(CountQuery(principal=p) for p in ("alice", "bob", "carol")), CountQuery(principal="alic")
    )


async def test_a_time_range_counts_records_created_from_since_until_before_until(journal: Journal) -> None:
    await three_principals(journal)
    ranged = await journal.count_calls(CountQuery(since=T0 + 30, until=T0 + 300))
    assert ranged.by_principal == {"alice": 2, "bob": 1}  # T0+30 counts, T0+300 does not
    assert ranged.oldest_created_at == T0 + 30
    alice = await journal.count_calls(CountQuery(principal="alice", until=T0 + 61))
    assert alice.by_principal == {"alice": 1} and alice.oldest_created_at == T0
    assert (await journal.count_calls(CountQuery(since=T0 + 4000))).total == 0
    await assert_counts_agree(
        journal,
        CountQuery(since=T0),
        CountQuery(since=T0 + 0.5),
        CountQuery(until=T0 + 125),
        CountQuery(since=T0 + 61, until=T0 + 61),
        CountQuery(principal="bob", since=T0 + 31),
    )


async def test_buckets_count_records_per_width_from_since(journal: Journal) -> None:
    await three_principals(journal)
    minutes = await journal.count_calls(CountQuery(since=T0, bucket_s=60))
    # T0 and T0+30 in minute 0, T0+61 in 1, T0+125 in 2, T0+300 in 5, T0+3600 in 60.
    assert minutes.by_bucket == {0: 2, 1: 1, 2: 1, 5: 1, 60: 1}
    hour = await journal.count_calls(CountQuery(since=T0 + 0.5, until=T0 + 3600, bucket_s=60))
    assert hour.by_bucket == {0: 1, 1: 1, 2: 1, 4: 1}  # T0+30.0 - T0+0.5 is 29.5: minute 0
    await assert_counts_agree(
        journal,
        CountQuery(since=T0 - 3600, bucket_s=60),
        CountQuery(since=T0 + 1, bucket_s=0.25),
        CountQuery(principal="alice", since=T0 - 7, until=T0 + 3600, bucket_s=7),
    )


async def test_counts_follow_swaps_purges_and_claims_of_expired_records(journal: Journal) -> None:
    _, a = await journal.claim(pending("a", created=T0), T0)
    _, b = await journal.claim(pending("b", created=T0 + 1), T0 + 1)
    assert await journal.swap(a.version, done(a, expires_at=T0 + 100))
    assert await journal.swap(b.version, done(b, CallState.FAILED, expires_at=T0 + 200))
    assert (await journal.count_calls()).by_state == {"completed": 1, "failed": 1}
    # An expired record counts until it is purged or claimed anew.
    assert (await journal.count_calls()).total == 2
    won, again = await journal.claim(pending("a", created=T0 + 150), T0 + 150)
    assert won
    counts = await journal.count_calls()
    assert counts.by_state == {"failed": 1, "pending": 1} and counts.oldest_created_at == T0 + 1
    assert (await journal.count_calls(CountQuery(until=T0 + 100))).total == 1  # `a` was created anew
    assert await journal.purge_expired(T0 + 200) == 1
    counts = await journal.count_calls()
    assert counts.by_state == {"pending": 1} and counts.oldest_created_at == T0 + 150
    assert await journal.swap(again.version, again.evolve(state=CallState.RELEASED, owner=None))
    await assert_counts_agree(journal, CountQuery(), CountQuery(since=T0, bucket_s=60))


async def test_stats_counts_what_count_calls_counts(journal: Journal) -> None:
    await three_principals(journal)
    counts = await journal.count_calls()
    stats = await journal.stats()
    assert stats.calls_by_state == counts.by_state and stats.calls_by_tool == counts.by_tool
    assert stats.oldest_record_at == counts.oldest_created_at
    await journal.append("p", "x", {}, T0)
    await journal.append("p", "x", {}, T0)
    await journal.append("q", "x", {}, T0)
    assert (await journal.stats()).entries == 3
    assert await journal.purge_entries(["p"]) == 2
    assert (await journal.stats()).entries == 1


@pytest.mark.parametrize("snapshot", [False, True], ids=["segments", "snapshot"])
async def test_counts_survive_close_and_reopen(journal_factory: JournalFactory, snapshot: bool) -> None:
    first = journal_factory()
    await first.open()
    try:
        await three_principals(first)
        _, gone = await first.claim(pending("gone", created=T0 + 5), T0 + 5)
        assert await first.swap(gone.version, done(gone, expires_at=T0 + 10))
        assert await first.purge_expired(T0 + 10) == 1
        if snapshot and isinstance(first, Maintainable):
            await first.snapshot()
        queries = (CountQuery(), CountQuery(principal="alice"), CountQuery(since=T0, until=T0 + 301, bucket_s=60))
        before = [await first.count_calls(q) for q in queries]
    finally:
        await first.aclose()
    second = journal_factory()
    await second.open()
    try:
        assert [await second.count_calls(q) for q in queries] == before
        await assert_counts_agree(second, *queries)
    finally:
        await second.aclose()


@pytest.mark.parametrize("seed", range(3))
async def test_counts_agree_with_the_records_through_random_changes(journal: Journal, seed: int) -> None:
    rng = random.Random(seed)
    principals, tools = ("alice", "bob", "carol"), ("refund", "ship")
    states = [CallState.COMPLETED, CallState.FAILED, CallState.IN_DOUBT, CallState.RELEASED, CallState.PENDING]
    now = T0
    for _ in range(120):
        now += rng.choice((0.0, 1.0, 29.5, 61.0))
        key, tool, principal = f"k{rng.randrange(25)}", rng.choice(tools), rng.choice(principals)
        record = pending(key, tool=tool, principal=principal, created=now)
        won, stored = await journal.claim(record, now)
        if not won and rng.random() < 0.7:
            expires = now + rng.choice((5.0, 100.0)) if rng.random() < 0.5 else None
            await journal.swap(stored.version, done(stored, rng.choice(states), expires))
        if rng.random() < 0.05:
            await journal.purge_expired(now)
    queries = [CountQuery(), CountQuery(since=T0, bucket_s=60), CountQuery(since=now - 600, until=now)]
    queries += [CountQuery(principal=p, since=T0 + 100, bucket_s=30) for p in principals]
    queries += [CountQuery(principal=p) for p in principals]
    await assert_counts_agree(journal, *queries)
