"""The Postgres journal's kept counts under replicas: rows per writing session, summed by readers,
folded into one row per group without waiting for any writer (`postgres/counts.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import anyio
import psycopg
import pytest

from mcp_durable.journal import CallQuery, CallRecord, CallState, CountQuery, Journal, create_journal
from mcp_durable.journal.postgres import PostgresJournal, PostgresSettings
from mcp_durable.journal.postgres.counts import SLACK_ROWS, KeptCounts
from tests.backends.pg_cluster import scratch_schema
from tests.conftest import postgres_or_skip
from tests.contract.test_calls import T0, pending

pytestmark = pytest.mark.postgres


@pytest.fixture
def schema_url() -> Iterator[str]:
    with scratch_schema() as url:
        yield url


def _schema(url: str) -> str:
    return f'"{PostgresSettings.from_url(url).schema}"'


def _count_rows(url: str) -> list[tuple[str, str, str, int, int]]:
    with psycopg.connect(postgres_or_skip()) as conn:
        return conn.execute(
            f"SELECT principal, tool, state, shard, n FROM {_schema(url)}.call_counts ORDER BY 1, 2, 3, 4"
        ).fetchall()


def _kept(journal: Journal) -> KeptCounts:
    assert isinstance(journal, PostgresJournal)
    return journal.kept_counts()


async def _agree(journal: Journal) -> None:
    records = await journal.list_calls(CallQuery(limit=10_000))
    for query in (CountQuery(), CountQuery(principal="alice"), CountQuery(since=T0, bucket_s=60)):
        assert await journal.count_calls(query) == query.count(records)


async def _completed(journal: Journal, key: str) -> None:
    """A COMPLETED record of alice's: what the kept rows count (an open one is counted when read)."""
    _, stored = await journal.claim(pending(key, principal="alice"), T0)
    assert await journal.swap(stored.version, stored.evolve(state=CallState.COMPLETED, owner=None))


async def test_replicas_writing_at_once_are_counted_and_a_fold_changes_no_count(schema_url: str) -> None:
    replicas = [create_journal(schema_url) for _ in range(2)]
    for replica in replicas:
        await replica.open()
    try:

        async def work(journal: Journal, n: int) -> None:
            principal = ("alice", "bob")[n % 2]
            record = pending(f"k{n}", principal=principal, tool=("refund", "ship")[n % 3 % 2], created=T0 + n)
            won, stored = await journal.claim(record, T0 + n)
            if n % 4:
                await journal.swap(stored.version, stored.evolve(state=CallState.COMPLETED, owner=None))

        async with anyio.create_task_group() as tg:
            for n in range(120):
                tg.start_soon(work, replicas[n % 2], n)
        assert len({row[3] for row in _count_rows(schema_url)}) >= 2  # rows of several sessions
        await _agree(replicas[0])
        await _kept(replicas[0]).fold()
        assert {row[3] for row in _count_rows(schema_url)} == {0}
        await _agree(replicas[1])
    finally:
        for replica in replicas:
            await replica.aclose()


async def test_a_fold_never_waits_for_a_writer_holding_its_rows(schema_url: str) -> None:
    journal = create_journal(schema_url)
    await journal.open()
    try:
        await _completed(journal, "a")
        async with await psycopg.AsyncConnection.connect(postgres_or_skip()) as writer:
            async with writer.transaction():
                # A final record written in flight (an import): the trigger's row of this session
                # is locked until commit.
                await writer.execute(
                    f"INSERT INTO {_schema(schema_url)}.calls (principal, tool, key, fingerprint, state, version, "
                    "run_id, attempts, created_at, updated_at) VALUES ('alice', 'refund', 'b', 'f', 'completed', 1, "
                    "'r', 1, %s, %s)",
                    (T0, T0),
                )
                with anyio.fail_after(30):  # a fold that waited for the writer would never end here
                    await _kept(journal).fold()
            rows = _count_rows(schema_url)
            assert [row[3] for row in rows if row[3] != 0] == [writer.info.backend_pid]  # left where it was
        await _agree(journal)
        assert (await journal.count_calls()).by_principal == {"alice": 2}
    finally:
        await journal.aclose()


async def test_a_read_that_finds_rows_of_many_sessions_folds_them(schema_url: str) -> None:
    journal = create_journal(schema_url)
    await journal.open()
    try:
        await _completed(journal, "a")
        await journal.append("p", "x", {}, T0)
        s = _schema(schema_url)
        with psycopg.connect(postgres_or_skip(), autocommit=True) as conn:
            # Sessions long gone, whose rows sum to nothing: what a pool's replaced connections leave.
            for shard in range(1_000_000, 1_000_000 + SLACK_ROWS + 10):
                conn.execute(f"INSERT INTO {s}.call_counts VALUES ('bob', 'ship', 'completed', %s, 1)", (shard,))
                conn.execute(f"INSERT INTO {s}.call_counts VALUES ('bob', 'ship', 'completed', %s, -1)", (-shard,))
                conn.execute(f"INSERT INTO {s}.entry_counts VALUES (%s, 0)", (shard,))
        assert len(_count_rows(schema_url)) > 2 * SLACK_ROWS
        await _agree(journal)  # the first read folded
        assert len(_count_rows(schema_url)) == 1
        assert (await journal.stats()).entries == 1
        with psycopg.connect(postgres_or_skip()) as conn:
            assert conn.execute(f"SELECT count(*) FROM {s}.entry_counts").fetchone() == (1,)
    finally:
        await journal.aclose()


async def test_a_claim_writes_no_count_and_open_records_are_counted_when_read(schema_url: str) -> None:
    """Migration 7: PENDING and IN_DOUBT records are counted from `calls_open` when read, so a
    claim (and a repeat's claim) writes no count row; a completion moves the record into the kept
    rows, written by the swap statement itself (its session is trusted to: the update trigger
    leaves it alone, or the completion would be counted twice)."""
    journal = create_journal(schema_url)
    await journal.open()
    try:
        stored = []
        for n in range(5):
            _, record = await journal.claim(pending(f"k{n}", principal=("alice", "bob")[n % 2]), T0 + n)
            stored.append(record)
        await journal.claim(pending("k0", principal="alice"), T0 + 9)  # a repeat
        assert _count_rows(schema_url) == []
        assert (await journal.count_calls()).by_state == {"pending": 5}
        assert (await journal.count_calls(CountQuery(principal="bob"))).by_state == {"pending": 2}
        first = stored[0]
        assert await journal.swap(first.version, first.evolve(state=CallState.COMPLETED, owner=None))
        assert [(p, t, st, n) for p, t, st, _, n in _count_rows(schema_url)] == [("alice", "refund", "completed", 1)]
        await _agree(journal)
        assert [r.identity.key for r in await journal.find_calls("refund", "k1")] == ["k1"]  # found while open
    finally:
        await journal.aclose()


async def test_swaps_made_together_from_open_and_final_records_are_each_decided_and_counted(schema_url: str) -> None:
    """The batch statement swaps only records left open (their state leaves no count); a record
    left final (re-run or rewritten) and a swap that lost are decided alone by the statement
    that reads the state left. Every answer, and the kept counts, are as if each swap ran alone."""
    journal = create_journal(schema_url)
    await journal.open()
    assert isinstance(journal, PostgresJournal)
    try:
        opened = [(await journal.claim(pending(f"open{n}", principal="alice"), T0))[1] for n in range(6)]
        finals = []
        for n in range(6):
            _, record = await journal.claim(pending(f"final{n}", principal="alice"), T0)
            done = record.evolve(state=CallState.COMPLETED, owner=None)
            assert await journal.swap(record.version, done)
            finals.append(done)
        swaps = [(r.version, r.evolve(state=CallState.COMPLETED, owner=None), True) for r in opened[:4]]
        swaps += [(r.version + 5, r.evolve(state=CallState.COMPLETED, owner=None), False) for r in opened[4:]]
        swaps += [(r.version, r.evolve(state=CallState.FAILED), True) for r in finals[:2]]
        swaps += [(r.version, r.evolve(state=CallState.PENDING, owner="B"), True) for r in finals[2:4]]
        swaps += [(r.version + 5, r.evolve(state=CallState.FAILED), False) for r in finals[4:]]
        outcomes: dict[str, bool] = {}

        async def swap(version: int, record: CallRecord) -> None:
            outcomes[record.identity.key] = await journal.swap(version, record)

        batches = journal._swaps.batches
        async with anyio.create_task_group() as group:
            for version, record, _ in swaps:
                group.start_soon(swap, version, record)
        assert journal._swaps.batches - batches < len(swaps)  # made together
        assert outcomes == {record.identity.key: expected for _, record, expected in swaps}
        for _, record, expected in swaps:
            stored = await journal.get(record.identity)
            assert stored is not None and (stored == record) is expected
        assert (await journal.count_calls()).by_state == {"completed": 6, "failed": 2, "pending": 4}
        await _agree(journal)
    finally:
        await journal.aclose()
