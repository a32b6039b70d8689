"""The Postgres journal's batching: concurrent claims, swaps and reads share statements, and each
call is still decided on its own row (the real database, a schema per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from mcp_durable import ToolPolicy
from mcp_durable.engine import Engine, ToolOutcome
from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Journal, create_journal
from mcp_durable.journal.base import CountQuery
from mcp_durable.journal.postgres import PostgresJournal
from mcp_durable.journal.postgres.batch import Batcher
from mcp_durable.journal.postgres.journal import BATCH_MAX_ITEMS
from mcp_durable.journal.postgres.journal import _rows_json as rows_json
from tests.conftest import scratch_postgres_url

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0


def pending(key: str, owner: str = "A", created: float = T0) -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f",
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


@pytest.fixture
async def journal() -> AsyncIterator[PostgresJournal]:
    journal = create_journal(scratch_postgres_url("batch"))
    assert isinstance(journal, PostgresJournal)
    await journal.open()
    try:
        yield journal
    finally:
        await journal.aclose()


async def test_concurrent_claims_share_statements_and_each_is_decided_on_its_row(journal: PostgresJournal) -> None:
    # One identity already claimed, one expired (a new claim replaces it), one contested by 8.
    _, taken = await journal.claim(pending("taken", owner="old"), T0)
    _, stale = await journal.claim(pending("stale", owner="old"), T0)
    assert await journal.swap(1, stale.evolve(state=CallState.COMPLETED, result=b"{}", expires_at=T0 + 1))
    statements = journal._claims.batches
    results: dict[str, tuple[bool, CallRecord]] = {}

    async def claim(name: str, record: CallRecord) -> None:
        results[name] = await journal.claim(record, T0 + 5)

    async with anyio.create_task_group() as group:
        for i in range(48):
            group.start_soon(claim, f"fresh{i}", pending(f"k{i}", created=T0 + 5))
        for i in range(8):
            group.start_soon(claim, f"contest{i}", pending("contested", owner=f"B{i}", created=T0 + 5))
        group.start_soon(claim, "taken", pending("taken", owner="new", created=T0 + 5))
        group.start_soon(claim, "stale", pending("stale", owner="new", created=T0 + 5))
    assert journal._claims.batches - statements < 58 / 4  # shared: far fewer statements than claims
    assert all(results[f"fresh{i}"] == (True, pending(f"k{i}", created=T0 + 5)) for i in range(48))
    contest = [results[f"contest{i}"] for i in range(8)]
    winners = [record.owner for won, record in contest if won]
    assert len(winners) == 1 and all(record.owner == winners[0] for _, record in contest)
    assert results["taken"] == (False, taken)
    assert results["stale"][0] and results["stale"][1].owner == "new"
    for key, owner in (("contested", winners[0]), ("stale", "new"), ("taken", "old"), ("k7", "A")):
        stored = await journal.get(CallIdentity("local", "refund", key))
        assert stored is not None and stored.owner == owner


async def test_concurrent_swaps_are_compare_and_set_per_row(journal: PostgresJournal) -> None:
    records = [(await journal.claim(pending(f"k{i}"), T0))[1] for i in range(21)]
    outcomes: dict[str, bool] = {}

    async def swap(name: str, expected: int, record: CallRecord, run: str | None = None) -> None:
        outcomes[name] = await journal.swap(expected, record, run)

    statements = journal._swaps.batches
    async with anyio.create_task_group() as group:
        for i, record in enumerate(records[:16]):
            group.start_soon(swap, f"done{i}", 1, record.evolve(state=CallState.COMPLETED, result=b"{}"), record.run_id)
        for i, record in enumerate(records[16:18], start=16):  # a writer that does not name the run
            group.start_soon(swap, f"done{i}", 1, record.evolve(state=CallState.COMPLETED, result=b"{}"))
        group.start_soon(swap, "stale-version", 7, records[18].evolve(state=CallState.RELEASED))
        # The right version of another run's record (a later record of the key): not moved.
        group.start_soon(swap, "stale-run", 1, records[20].evolve(state=CallState.RELEASED), "an-earlier-run")
        # Two swaps of one record from the same version: exactly one moves it.
        group.start_soon(swap, "twin-a", 1, records[19].evolve(state=CallState.COMPLETED, result=b"a"))
        group.start_soon(swap, "twin-b", 1, records[19].evolve(state=CallState.RELEASED))
    assert journal._swaps.batches - statements < 10
    assert all(outcomes[f"done{i}"] for i in range(18)) and not outcomes["stale-version"]
    assert not outcomes["stale-run"] and await journal.get(records[20].identity) == records[20]
    assert outcomes["twin-a"] != outcomes["twin-b"]
    twin = await journal.get(records[19].identity)
    assert twin is not None and twin.version == 2
    assert twin.state == (CallState.COMPLETED if outcomes["twin-a"] else CallState.RELEASED)
    stored = await journal.get(records[18].identity)
    assert stored == records[18]


async def test_a_record_the_database_refuses_fails_alone_not_its_batch(journal: PostgresJournal) -> None:
    records = [(await journal.claim(pending(f"k{i}"), T0))[1] for i in range(10)]
    outcomes: dict[int, object] = {}

    async def swap(i: int, record: CallRecord) -> None:
        try:
            outcomes[i] = await journal.swap(1, record)
        except JournalError as exc:
            outcomes[i] = exc

    async with anyio.create_task_group() as group:
        for i, record in enumerate(records):
            # Postgres text cannot hold NUL (row 3), JSON cannot carry a lone surrogate (row 6):
            # those rows are refused, and only those.
            error = {3: "bad\x00reason", 6: "bad\udc80reason"}.get(i)
            group.start_soon(swap, i, record.evolve(state=CallState.RELEASED, error=error))
    assert isinstance(outcomes.pop(3), JournalError) and isinstance(outcomes.pop(6), JournalError)
    assert all(outcome is True for outcome in outcomes.values())
    assert await journal.get(records[3].identity) == records[3]
    assert await journal.get(records[6].identity) == records[6]


async def test_a_batch_statement_the_server_cannot_plan_fails_instead_of_going_row_by_row(
    journal: PostgresJournal,
) -> None:
    # A batch statement broken by an item (a NUL, above) is retried one item at a time. One the
    # server cannot parse or plan is broken for every batch: retried row by row it would hide
    # (a swap statement naming a column its rows lacked once passed every test that way).
    assert await journal._batch_rows(lambda: journal._fetchall("SELECT 1")) == [(1,)]
    with pytest.raises(JournalError):
        await journal._batch_rows(lambda: journal._fetchall("SELECT v.missing FROM (SELECT 1 AS present) AS v"))
    assert await journal._batch_rows(lambda: journal._fetchall("SELECT %s::text", ("bad\x00text",))) is None
    # The same through the appends' pipeline (its statements take `$n` parameters, as text).
    assert await journal._batch_rows(lambda: journal._pipelined("SELECT 1", ())) == [(b"1",)]
    with pytest.raises(JournalError):
        await journal._batch_rows(lambda: journal._pipelined("SELECT v.missing FROM (SELECT 1 AS present) AS v", ()))
    assert (
        await journal._batch_rows(lambda: journal._pipelined("SELECT $1::json ->> 'a'", (b'{"a": "\\u0000"}',))) is None
    )


async def test_the_engine_sends_no_read_before_a_claim(journal: PostgresJournal) -> None:
    engine = Engine(journal)
    await engine.start()
    policy = ToolPolicy(idempotent=True, key="derived")
    runs = 0

    async def run(call: object) -> ToolOutcome:
        nonlocal runs
        runs += 1
        return ToolOutcome("ok", b'{"content":[]}', False)

    reads = journal._gets.items
    first = await engine.execute(tool="refund", policy=policy, arguments={"n": 1}, meta=None, run=run)
    # (No replay cache on a journal other processes write: the repeat is answered from the journal.)
    again = await engine.execute(tool="refund", policy=policy, arguments={"n": 1}, meta=None, run=run)
    assert runs == 1 and not first.replayed and again.replayed and again.payload == first.payload
    assert journal._gets.items == reads  # the miss and the repeat were each answered by the claim


async def test_batch_statements_find_rows_by_key_whatever_the_table_size(journal: PostgresJournal) -> None:
    # On a small table the planner, estimating a batch at 100 rows, would hash the whole table;
    # a statement prepared then keeps that plan as the table grows. The journal's sessions never
    # join by hashing or merging: each batch row is found through the primary key.
    records = [(await journal.claim(pending(f"k{i}"), T0))[1] for i in range(20)]
    done = [record.evolve(state=CallState.COMPLETED, result=b"{}") for record in records]
    identities = [record.identity for record in records]
    statements = {
        "claim": (journal._claim_many_sql, (rows_json(records),)),
        "swap": (journal._swap_many_sql, (rows_json(done, [1] * len(done)),)),
        "get": (
            journal._get_many_sql,
            ([i.principal for i in identities], [i.tool for i in identities], [i.key for i in identities]),
        ),
    }
    async with journal._connection() as conn:
        for name, (sql, params) in statements.items():
            cursor = await conn.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in await cursor.fetchall())
            assert "Seq Scan on calls" not in plan and "calls_pkey" in plan, (name, plan)


async def test_statements_are_never_jit_compiled_however_costly_the_planner_guesses_them(
    journal: PostgresJournal,
) -> None:
    # At 10^7 records the planner guessed the console's count of the last hour at 60,000 rows
    # (it read 1,000), past `jit_above_cost`, and compiling the statement took 15-50 ms of a
    # query that runs in 1-4 ms. The journal's statements are all short lookups: its sessions
    # run with JIT off, whatever the server's default and whatever the guess.
    for i in range(20):
        await journal.claim(pending(f"j{i}", created=T0 + i), T0)
    query = CountQuery(since=T0, bucket_s=60)
    # The statement the journal sends for that count, taken from its real `_fetchall`.
    sent: list[tuple[str, Any]] = []
    fetchall = journal._fetchall

    async def recorded(sql: str, params: Any = (), lane: Any = None) -> Any:
        sent.append((sql, params))
        return await fetchall(sql, params, lane)

    journal._fetchall = recorded  # type: ignore[method-assign]  # the real method, recorded
    assert (await journal.count_calls(query)).total == 20
    journal._fetchall = fetchall  # type: ignore[method-assign]
    [(sql, args)] = sent
    async with journal._connection() as conn:
        assert (await (await conn.execute("SHOW jit")).fetchall()) == [("off",)]
        await conn.execute("SET jit_above_cost = 0")  # every statement costly enough for JIT
        try:
            cursor = await conn.execute("EXPLAIN ANALYZE " + sql, args)
            plan = "\n".join(row[0] for row in await cursor.fetchall())
        finally:
            await conn.execute("RESET jit_above_cost")
    assert "JIT" not in plan, plan


async def test_calls_made_together_share_statements_and_a_call_alone_is_sent_alone(journal: PostgresJournal) -> None:
    # One caller: each claim is a statement of its own (the single-row one).
    before = (journal._claims.batches, journal._claims.items)
    for i in range(3):
        won, record = await journal.claim(pending(f"solo{i}"), T0)
        assert won and await journal.swap(1, record.evolve(state=CallState.COMPLETED, result=b"{}"))
    assert (journal._claims.batches - before[0], journal._claims.items - before[1]) == (3, 3)
    # Sixteen callers in step stay in step: one claim statement and one swap statement per round.
    before = (journal._claims.batches, journal._claims.items)
    await _callers_in_step(journal, "c", callers=16, rounds=10)
    assert (journal._claims.items - before[1], journal._claims.batches - before[0]) == (160, 10)


async def _callers_in_step(journal: PostgresJournal, prefix: str, *, callers: int, rounds: int) -> None:
    """`callers` tasks, each claiming and completing `rounds` new identities one after another."""

    async def caller(n: int) -> None:
        for i in range(rounds):
            won, record = await journal.claim(pending(f"{prefix}{n}-{i}"), T0)
            assert won and await journal.swap(1, record.evolve(state=CallState.COMPLETED, result=b"{}"))

    async with anyio.create_task_group() as group:
        for n in range(callers):
            group.start_soon(caller, n)


async def test_two_processes_claiming_the_same_keys_in_opposite_orders_never_deadlock() -> None:
    # Two journals on one schema stand for two replicas. Each round, 64 new identities reach
    # one as a batch in one order and the other in the reverse order: without one lock order
    # for every batch, the two statements wait for each other's rows and the database breaks
    # the deadlock by failing one of them (all its calls answered `journal_unavailable`).
    url = scratch_postgres_url("lock_order")
    first, second = create_journal(url), create_journal(url)
    await first.open()
    await second.open()
    try:
        for round_ in range(30):
            records = [pending(f"r{round_}-{i:02d}", created=T0 + round_) for i in range(64)]
            won: list[bool] = []
            async with anyio.create_task_group() as group:
                for record in records:
                    group.start_soon(_claim_into, won, first, record.evolve(owner="first"), T0 + round_)
                for record in reversed(records):
                    group.start_soon(_claim_into, won, second, record.evolve(owner="second"), T0 + round_)
            assert sorted(won) == [False] * 64 + [True] * 64, f"round {round_}: each identity claimed once"
    finally:
        await first.aclose()
        await second.aclose()


async def _claim_into(won: list[bool], journal: Journal, record: CallRecord, now: float) -> None:
    won.append((await journal.claim(record, now))[0])


async def test_a_wave_of_callers_goes_out_as_full_statements(journal: PostgresJournal) -> None:
    # 64 callers in step: each round's claims fill two statements of BATCH_MAX_ITEMS (32) items,
    # not one of 64 or 64 of one. Whether a round's second statement goes out beside the first (a
    # slot kept for full batches) depends on whether the database has answered the first by then:
    # held to wait, it does (tests/backends/test_postgres_appends.py, the same `Batcher` and
    # settings); the rule itself is stepped through in `test_only_full_batches_take_the_slot_kept_for_them`.
    assert BATCH_MAX_ITEMS == 32
    before = (journal._claims.items, journal._claims.batches)
    await _callers_in_step(journal, "w", callers=64, rounds=5)
    assert (journal._claims.items - before[0], journal._claims.batches - before[1]) == (320, 10)


@pytest.mark.parametrize(
    ("items", "most_side_by_side", "sizes"),
    [
        (8, 2, [4, 4]),  # two full batches: the second runs beside the first
        (6, 1, [4, 2]),  # the second is not full: it waits for the batch slot
        (12, 2, [4, 4, 4]),  # a third full batch waits for a slot to free
    ],
)
async def test_only_full_batches_take_the_slot_kept_for_them(
    items: int, most_side_by_side: int, sizes: list[int]
) -> None:
    running = 0
    most = 0
    seen: list[int] = []

    async def run_batch(batch: list[int]) -> list[int]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        seen.append(len(batch))
        await anyio.sleep(0.05)  # a statement in flight: every other batch has formed by now
        running -= 1
        return [item * 10 for item in batch]

    batcher: Batcher[int, int] = Batcher(run_batch, slots=1, max_items=4, full_slots=1)
    answers: dict[int, int] = {}

    async def submit(item: int) -> None:
        answers[item] = await batcher.submit(item)

    async with anyio.create_task_group() as group:
        for item in range(items):
            group.start_soon(submit, item)
    assert answers == {item: item * 10 for item in range(items)}
    assert (most, seen, batcher.beside) == (most_side_by_side, sizes, most_side_by_side - 1)


@pytest.mark.parametrize(("ordered", "started"), [(False, [0, 5, 1]), (True, [0, 1, 5])])
async def test_an_ordered_batcher_starts_its_batches_in_the_order_they_opened(
    ordered: bool, started: list[int]
) -> None:
    # A (item 0) is in flight on the batch slot. B (items 1-4) opens, and its leader waits for
    # that slot while B fills; C (items 5-8) fills next and finds the slot kept for full batches
    # free. Unordered, C is sent before B; the appends' batcher (ordered) sends B first, since
    # their statements take the entries' lock in the order they are sent.
    order: list[int] = []

    async def run_batch(batch: list[int]) -> list[int]:
        order.append(batch[0])
        await anyio.sleep(0.1)
        return batch

    batcher: Batcher[int, int] = Batcher(run_batch, slots=1, max_items=4, full_slots=1, ordered=ordered)
    async with anyio.create_task_group() as group:
        group.start_soon(batcher.submit, 0)
        await anyio.sleep(0.02)
        for item in (1, 2):
            group.start_soon(batcher.submit, item)
        await anyio.sleep(0.02)  # B's leader now waits for the batch slot, B not full yet
        for item in range(3, 9):
            group.start_soon(batcher.submit, item)
    assert order == started


async def test_claims_made_together_that_meet_stored_records_are_answered_by_their_statement(
    journal: PostgresJournal,
) -> None:
    # The batch statement reads back the records that stand (repeats) only when some row was not
    # inserted; either way each claim is answered by it, none decided alone afterwards.
    stored = [(await journal.claim(pending(f"k{i}"), T0))[1] for i in range(8)]
    alone = 0
    fetchall = journal._fetchall

    async def counted(sql: str, *args: object, **kwargs: object) -> object:
        nonlocal alone
        alone += sql == journal._claim_sql
        return await fetchall(sql, *args, **kwargs)  # type: ignore[arg-type]

    journal._fetchall = counted  # type: ignore[method-assign,assignment]  # the real method, counted
    outcomes: dict[str, tuple[bool, CallRecord]] = {}

    async def claim(record: CallRecord) -> None:
        outcomes[record.identity.key] = await journal.claim(record, T0)

    for keys in (range(16), range(16, 32)):  # half repeats, then all new
        batches = journal._claims.batches
        async with anyio.create_task_group() as group:
            for i in keys:
                group.start_soon(claim, pending(f"k{i}", owner="B"))
        assert journal._claims.batches - batches < len(keys)  # made together
    assert alone == 0
    for i in range(32):
        won, record = outcomes[f"k{i}"]
        assert won is (i >= 8)
        assert record == (stored[i] if i < 8 else pending(f"k{i}", owner="B"))
