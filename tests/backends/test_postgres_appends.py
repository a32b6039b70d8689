"""The Postgres journal's process-entry appends: appends made together share one statement and one
commit, each still gets an entry and a `seq` of its own, in the order the appends were made
(across batches too: every batch goes through one pipelined connection, in the order the
batches opened), and a step entry counts as that step exactly as if the batch's appends had
been made one after the other (the real database, a schema per test)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_durable.errors import JournalError
from mcp_durable.journal import CallIdentity, CallRecord, CallState, JournalEntry, create_journal
from mcp_durable.journal.base import STEP, step_process_id
from mcp_durable.journal.postgres import PostgresJournal
from mcp_durable.journal.postgres.journal import BATCH_MAX_ITEMS
from tests.conftest import scratch_postgres_url

pytestmark = pytest.mark.postgres

T0 = 1_700_000_000.0


async def opened(url: str) -> PostgresJournal:
    journal = create_journal(url)
    assert isinstance(journal, PostgresJournal)
    await journal.open()
    return journal


@pytest.fixture
async def journal() -> AsyncIterator[PostgresJournal]:
    journal = await opened(scratch_postgres_url("appends"))
    try:
        yield journal
    finally:
        await journal.aclose()


async def append_together(journal: PostgresJournal, appends: list[tuple[str, str, dict[str, Any]]]) -> list[Any]:
    """Make `appends` (process, type, data) concurrently, each in a task of its own, started in
    list order; each task's entry, or the `JournalError` it raised."""
    outcomes: list[Any] = [None] * len(appends)

    async def append(n: int, process_id: str, entry_type: str, data: dict[str, Any]) -> None:
        try:
            outcomes[n] = await journal.append(process_id, entry_type, data, T0 + n)
        except JournalError as exc:
            outcomes[n] = exc

    async with anyio.create_task_group() as group:
        for n, (process_id, entry_type, data) in enumerate(appends):
            group.start_soon(append, n, process_id, entry_type, data)
    return outcomes


async def stored_steps(journal: PostgresJournal, process_id: str) -> list[tuple[int, int | None]]:
    """(seq, the step index it is stored as, or None) of each entry of `process_id`, in seq order."""
    async with journal._connection() as conn:
        cursor = await conn.execute(
            f"SELECT seq, step_index FROM {journal._entries} WHERE process_id = %s ORDER BY seq", (process_id,)
        )
        return [(int(seq), step) for seq, step in await cursor.fetchall()]


async def transactions(journal: PostgresJournal, entries: list[JournalEntry]) -> int:
    """How many transactions wrote `entries` (the distinct `xmin` of their rows): one per commit."""
    async with journal._connection() as conn:
        cursor = await conn.execute(
            f"SELECT count(DISTINCT xmin::text) FROM {journal._entries} WHERE seq = ANY(%s)",
            ([entry.seq for entry in entries],),
        )
        row = await cursor.fetchone()
    assert row is not None
    return int(row[0])


async def claimed(journal: PostgresJournal, key: str) -> CallRecord:
    record = CallRecord(
        identity=CallIdentity("local", "agent", key),
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner="A",
        lease_until=T0 + 30,
    )
    won, stored = await journal.claim(record, T0)
    assert won and stored.fence is not None
    return stored


async def test_concurrent_appends_share_statements_and_each_gets_its_own_seq_in_batch_order(
    journal: PostgresJournal,
) -> None:
    before = (journal._appends.batches, journal._appends.items)
    appends = [(f"p{n % 3}", "context_update", {"n": n, "text": "é\n\"'"}) for n in range(64)]
    entries = await append_together(journal, appends)
    batches, items = journal._appends.batches - before[0], journal._appends.items - before[1]
    assert items == 64 and batches <= 2  # 64 appends in one or two statements, not 64
    assert await transactions(journal, entries) == batches  # a commit per statement
    assert [entry.data for entry in entries] == [data for _, _, data in appends]
    seqs = [entry.seq for entry in entries]
    # Distinct, and in the order the appends were made: the batch went in as one statement in that order.
    assert seqs == sorted(seqs) and len(set(seqs)) == 64
    # Each caller's entry is the one stored under its seq.
    assert await journal.entries() == entries
    assert await journal.entries(process_id="p1") == [entries[n] for n in range(1, 64, 3)]


async def test_a_wave_of_64_appends_goes_out_as_two_full_statements_and_a_larger_one_spills_into_a_third(
    journal: PostgresJournal,
) -> None:
    # Appends batch as the other kinds (32 a statement): a wave of 64 writers in step is two
    # statements, the second sent into the pipeline while the first commits, two commits.
    assert BATCH_MAX_ITEMS == 32
    before = (journal._appends.batches, journal._appends.items)
    wave = await append_together(journal, [(f"p{n % 4}", "tick", {"n": n}) for n in range(64)])
    assert (journal._appends.batches - before[0], journal._appends.items - before[1]) == (2, 64)
    assert await transactions(journal, wave[:32]) == 1 and await transactions(journal, wave) == 2
    # One more than two batches hold: the 65th opens a third, which commits after the others,
    # and seqs still increase in the order the appends were made.
    before = (journal._appends.batches, journal._appends.items)
    spill = await append_together(journal, [("p", "tick", {"n": n}) for n in range(65)])
    assert (journal._appends.batches - before[0], journal._appends.items - before[1]) == (3, 65)
    assert await transactions(journal, spill) == 3
    seqs = [entry.seq for entry in wave + spill]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert await journal.entries() == wave + spill


async def test_batches_queued_behind_the_lock_keep_the_order_the_appends_were_made(journal: PostgresJournal) -> None:
    # Another session holds the entries' lock. A lone append goes out and waits for it; 10
    # appends open a batch whose leader waits for the batch slot; 60 more fill that batch and a
    # full one after it, which finds the slot kept for full batches free. Sent on connections
    # of their own, the later full batch could take the lock first (its seqs below the earlier
    # batch's); the batches start in the order they opened and share one pipelined connection,
    # so every seq follows the order the appends were made.
    lock = journal._entries_lock
    entries: dict[int, JournalEntry] = {}

    async def append(n: int) -> None:
        entries[n] = await journal.append("p", "context_update", {"n": n}, T0 + n)

    async with await psycopg.AsyncConnection.connect(journal.settings.conninfo) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
        async with anyio.create_task_group() as group:
            group.start_soon(append, 0)
            with anyio.fail_after(10):
                while not await lock_awaited(holder, lock):
                    await anyio.sleep(0.01)
            for n in range(1, 11):
                group.start_soon(append, n)
            await anyio.sleep(0.05)  # the second batch's leader now waits for the batch slot
            for n in range(11, 71):
                group.start_soon(append, n)
            await anyio.sleep(0.05)
            await holder.commit()
    assert len(entries) == 71
    seqs = [entries[n].seq for n in range(71)]
    assert seqs == sorted(seqs), seqs
    assert await journal.entries() == [entries[n] for n in range(71)]


async def test_appends_in_flight_when_the_pipeline_connection_dies_fail_and_the_next_ones_reconnect(
    journal: PostgresJournal,
) -> None:
    # The appends' connection is killed while a batch waits in the database for the entries'
    # lock: every append of it fails as the database being unavailable (none is stored: the
    # transaction died with its session), and the next appends connect again and are stored.
    await journal.append("p", "context_update", {"n": -1}, T0)
    pipeline = journal._pipeline
    assert pipeline is not None and pipeline.connections == 1
    lock = journal._entries_lock
    async with await psycopg.AsyncConnection.connect(journal.settings.conninfo, autocommit=True) as holder:
        await holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (lock,))
        outcomes: list[Any] = []

        async def appends() -> None:
            outcomes.extend(await append_together(journal, [("p", "context_update", {"n": n}) for n in range(8)]))

        async with anyio.create_task_group() as group:
            group.start_soon(appends)
            with anyio.fail_after(10):
                while not await lock_awaited(holder, lock):
                    await anyio.sleep(0.01)
            await holder.execute("SELECT pg_terminate_backend(%s)", (pipeline.backend_pid,))
        await holder.execute("SELECT pg_advisory_unlock(hashtext(%s))", (lock,))
    assert len(outcomes) == 8 and all(isinstance(outcome, JournalError) for outcome in outcomes)
    assert all("unavailable" in str(outcome) for outcome in outcomes)
    after = await append_together(journal, [("p", "context_update", {"n": n}) for n in range(3)])
    assert all(isinstance(entry, JournalEntry) for entry in after) and pipeline.connections == 2
    assert [entry.data["n"] for entry in await journal.entries()] == [-1, 0, 1, 2]


async def test_a_reader_tailing_by_seq_never_misses_an_entry_committed_by_a_batch() -> None:
    # Two journals on one schema (two replicas) append in batches while a reader tails
    # `entries(after=last seq seen)`: seq order is commit order, so no batch commits after a
    # reader has seen a larger seq than its own.
    url = scratch_postgres_url("appends_tail")
    journal, other = await opened(url), await opened(url)
    written: list[JournalEntry] = []
    seen: list[JournalEntry] = []
    writing = True

    async def writer(replica: PostgresJournal, name: str) -> None:
        for round_ in range(20):
            written.extend(await append_together(replica, [(name, "tick", {"r": round_, "i": i}) for i in range(16)]))

    async def tail() -> None:
        while True:
            done = not writing  # read once more after the writers finished
            seen.extend(await journal.entries(after=seen[-1].seq if seen else 0))
            if done:
                return
            await anyio.sleep(0)

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(tail)
            async with anyio.create_task_group() as writers:
                writers.start_soon(writer, journal, "a")
                writers.start_soon(writer, other, "b")
            writing = False
    finally:
        await journal.aclose()
        await other.aclose()
    assert len(written) == 640 and all(isinstance(entry, JournalEntry) for entry in written)
    assert seen == sorted(written, key=lambda entry: entry.seq)


async def test_a_step_entry_in_a_batch_counts_as_its_step_as_if_appended_one_after_the_other(
    journal: PostgresJournal,
) -> None:
    record = await claimed(journal, "k")
    fence = record.fence
    assert fence is not None
    process = step_process_id(record.run_id)
    stored = await journal.append_step(record.identity, fence, 1, {"by": "run"}, T0)
    assert stored is not None
    appends = [
        (process, STEP, {"index": 0, "copy": "a"}),  # the step 0
        (process, STEP, {"index": 0, "copy": "b"}),  # after a: a plain entry
        (process, STEP, {"index": 1, "copy": "c"}),  # step 1 is stored: a plain entry
        (process, "note", {"index": 2, "copy": "d"}),  # not a step entry: step 2 stays free
        (process, STEP, {"index": 3, "copy": "e"}),  # the step 3
        (step_process_id("other-run"), STEP, {"index": 0, "copy": "f"}),  # another run's step 0
    ]
    before = (journal._appends.batches, journal._appends.items)
    entries = await append_together(journal, appends)
    assert (journal._appends.batches - before[0], journal._appends.items - before[1]) == (1, 6)
    assert await transactions(journal, entries) == 1  # one statement, one commit: not one each
    assert [entry.data["copy"] for entry in entries] == ["a", "b", "c", "d", "e", "f"]
    assert [entry.seq for entry in entries] == sorted(entry.seq for entry in entries)
    a, b, c, d, e, f = (entry.seq for entry in entries)
    assert await stored_steps(journal, process) == [(stored.seq, 1), (a, 0), (b, None), (c, None), (d, None), (e, 3)]
    assert await stored_steps(journal, step_process_id("other-run")) == [(f, 0)]
    # The same appends made one at a time store the same steps.
    one_by_one = await claimed(journal, "one-by-one")
    assert one_by_one.fence is not None
    assert await journal.append_step(one_by_one.identity, one_by_one.fence, 1, {"by": "run"}, T0) is not None
    for _, entry_type, data in appends[:5]:
        await journal.append(step_process_id(one_by_one.run_id), entry_type, data, T0)
    steps = [step for _, step in await stored_steps(journal, step_process_id(one_by_one.run_id))]
    assert steps == [step for _, step in await stored_steps(journal, process)]
    # The run sees the batch's steps as written, and only those.
    for index, written in ((0, True), (1, True), (2, False), (3, True)):
        assert (await journal.append_step(record.identity, fence, index, {}, T0) is None) == written


async def test_a_step_committed_while_a_batch_waits_for_the_lock_is_kept_and_the_batch_stored(
    journal: PostgresJournal,
) -> None:
    # The batch's statement takes its snapshot, then waits for the entries' lock, held by another
    # transaction that stores step 0 of the same process and commits: the statement cannot see
    # that step, its insert of step 0 meets the unique index, and the statement fails whole. Each
    # append is then made alone, so every one is stored and step 0 stays the other writer's.
    lock = journal._entries_lock
    async with await psycopg.AsyncConnection.connect(journal.settings.conninfo) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
        entries: list[Any] = []
        async with anyio.create_task_group() as group:

            async def append() -> None:
                entries.extend(
                    await append_together(
                        journal, [("steps/r", STEP, {"index": 0, "by": "batch"}), ("steps/r", "note", {"n": 1})]
                    )
                )

            group.start_soon(append)
            with anyio.fail_after(10):
                while not await lock_awaited(holder, lock):
                    await anyio.sleep(0.01)
            await holder.execute(
                f"INSERT INTO {journal._entries} (process_id, entry_type, data, ts, step_index) "
                "VALUES ('steps/r', 'step', '{\"index\": 0, \"by\": \"other\"}', 0, 0)"
            )
            await holder.commit()
    assert all(isinstance(entry, JournalEntry) for entry in entries)
    stored = await journal.entries(process_id="steps/r")
    assert stored[0].data["by"] == "other" and stored[1:] == sorted(entries, key=lambda entry: entry.seq)
    steps = await stored_steps(journal, "steps/r")
    assert [step for _, step in steps] == [0, None, None]


async def lock_awaited(conn: psycopg.AsyncConnection[Any], lock: str) -> bool:
    """Whether a session waits for the advisory lock `hashtext(lock)` (taken as a bigint key)."""
    return await lock_waiters(conn, lock) > 0


async def test_a_batch_that_fails_fails_every_append_in_it_and_stores_none() -> None:
    url = scratch_postgres_url("appends_fail")
    journal = await opened(f"{url}&statement_timeout=0.5")
    try:
        # Another session holds the entries' lock: the batch's statement waits for it until the
        # statement timeout cancels it (the database answering, but not in time).
        async with await psycopg.AsyncConnection.connect(journal.settings.conninfo, autocommit=True) as holder:
            await holder.execute("SELECT pg_advisory_lock(hashtext(%s))", (journal._entries_lock,))
            before = (journal._appends.batches, journal._appends.items)
            outcomes = await append_together(journal, [("p", "context_update", {"n": n}) for n in range(8)])
            assert (journal._appends.batches - before[0], journal._appends.items - before[1]) == (1, 8)
            assert all(isinstance(outcome, JournalError) for outcome in outcomes)
        assert await journal.entries() == []
        # The journal appends again once the lock is free.
        after = await append_together(journal, [("p", "context_update", {"n": n}) for n in range(8)])
        assert await journal.entries() == after
    finally:
        await journal.aclose()


async def test_an_append_the_database_refuses_fails_alone_not_its_batch(journal: PostgresJournal) -> None:
    # Postgres text cannot hold NUL (append 3), nor carry a lone surrogate (append 6): the
    # statement of their batch fails, each append is then made alone, and only those two fail.
    bad = {3: ("p\x00", "context_update"), 6: ("p", "bad\udc80type")}
    appends = [(*bad.get(n, ("p", "context_update")), {"n": n}) for n in range(10)]
    outcomes = await append_together(journal, appends)
    assert isinstance(outcomes.pop(6), JournalError) and isinstance(outcomes.pop(3), JournalError)
    assert await journal.entries() == sorted(outcomes, key=lambda entry: entry.seq)
    assert sorted(entry.data["n"] for entry in outcomes) == [0, 1, 2, 4, 5, 7, 8, 9]


async def test_the_step_lookup_of_an_append_batch_goes_through_the_step_index(journal: PostgresJournal) -> None:
    # Whether a batch's step entry is the step is one index probe per row, never a pass over the
    # whole table (a NOT EXISTS in the select list is planned as a hashed subplan that reads every
    # entry, each batch).
    for i in range(50):
        await journal.append(f"steps/r{i % 5}", STEP, {"index": i}, T0)
    rows = '[{"n": 0, "p": "steps/r1", "t": "step", "d": {"index": 1}, "ts": 1.0, "s": 1}]'
    async with journal._connection() as conn:
        cursor = await conn.execute(
            "EXPLAIN " + journal._append_many_sql.replace("$1", "%s").replace("$2", "%s"), (journal._entries_lock, rows)
        )
        plan = "\n".join(row[0] for row in await cursor.fetchall())
    assert "Seq Scan on entries" not in plan and "hashed SubPlan" not in plan and "entries_by_step" in plan, plan


async def test_a_second_full_statement_goes_out_beside_the_one_in_flight(journal: PostgresJournal) -> None:
    # A wave of twice `BATCH_MAX_ITEMS` appends: two full statements. The first waits in the
    # database (another session holds the entries' lock) while the second forms; the second
    # takes the slot kept for full batches (`FULL_BATCH_SLOTS`) and is sent into the pipeline
    # behind it rather than after its answer. Both land once the lock is free, in order.
    lock = journal._entries_lock
    wave = 2 * BATCH_MAX_ITEMS
    async with await psycopg.AsyncConnection.connect(journal.settings.conninfo) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
        before = (journal._appends.batches, journal._appends.items, journal._appends.beside)
        outcomes: list[Any] = []

        async def wave_of_appends() -> None:
            outcomes.extend(await append_together(journal, [("p", "context_update", {"n": n}) for n in range(wave)]))

        async with anyio.create_task_group() as group:
            group.start_soon(wave_of_appends)
            with anyio.fail_after(10):
                while not await lock_awaited(holder, lock) or journal._appends.beside == before[2]:
                    await anyio.sleep(0.01)
            assert journal._appends.batches - before[0] == 2  # both sent while the first waited
            await holder.commit()
    assert (journal._appends.batches - before[0], journal._appends.items - before[1]) == (2, wave)
    assert await transactions(journal, outcomes) == 2
    assert await journal.entries() == outcomes  # in the order the appends were made


async def lock_waiters(conn: psycopg.AsyncConnection[Any], lock: str) -> int:
    """How many sessions wait for the advisory lock `hashtext(lock)`."""
    cursor = await conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
        "AND objid::bigint = hashtext(%s)::bigint & 4294967295",
        (lock,),
    )
    row = await cursor.fetchone()
    return 0 if row is None else int(row[0])


async def test_callers_cancelled_while_their_batch_waits_still_learn_their_entries(journal: PostgresJournal) -> None:
    # Another session holds the entries' lock, so the batch's statement waits in the database;
    # meanwhile every caller's cancel scope is cancelled. Each caller still gets its entry (its
    # append may be committed: it learns that it was), and is cancelled at its next checkpoint.
    lock = journal._entries_lock
    returned: list[JournalEntry] = []
    went_on: list[int] = []
    scopes: list[anyio.CancelScope] = []

    async def append(n: int) -> None:
        with anyio.CancelScope() as scope:
            scopes.append(scope)
            returned.append(await journal.append("p", "context_update", {"n": n}, T0 + n))
            await anyio.lowlevel.checkpoint()  # the cancellation reaches the caller here
            went_on.append(n)

    async with await psycopg.AsyncConnection.connect(journal.settings.conninfo) as holder:
        await holder.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (lock,))
        before = (journal._appends.batches, journal._appends.items)
        async with anyio.create_task_group() as group:
            for n in range(8):
                group.start_soon(append, n)
            with anyio.fail_after(10):
                while not await lock_awaited(holder, lock):
                    await anyio.sleep(0.01)
            for scope in scopes:
                scope.cancel()
            await anyio.sleep(0.05)  # the cancellations are delivered while the statement waits
            await holder.commit()
    assert (journal._appends.batches - before[0], journal._appends.items - before[1]) == (1, 8)
    assert sorted(entry.data["n"] for entry in returned) == list(range(8)) and went_on == []
    assert await journal.entries() == sorted(returned, key=lambda entry: entry.seq)


_WAVES = st.lists(
    st.one_of(
        st.tuples(st.just("wave"), st.integers(1, 70), st.booleans()),  # appends started together; some steps
        st.tuples(st.just("pause"), st.integers(0, 20), st.just(False)),  # milliseconds
        st.tuples(st.just("lock"), st.just(0), st.just(False)),  # another session takes the entries' lock
        st.tuples(st.just("unlock"), st.just(0), st.just(False)),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=25, deadline=None)
@given(waves=_WAVES)
def test_seqs_follow_the_order_appends_were_made_under_any_waves_and_lock_holds(
    waves: list[tuple[str, int, bool]],
) -> None:
    # Whatever batches form (full or not, waiting for a slot or beside one in flight, plain or
    # with step entries) and however long the entries' lock is held elsewhere, the seqs of
    # one journal's appends follow the order its `append` calls were made.
    asyncio.run(_run_waves(waves))


async def _run_waves(waves: list[tuple[str, int, bool]]) -> None:
    journal = await opened(scratch_postgres_url("appends_order"))
    made: list[JournalEntry | None] = []
    try:
        async with await psycopg.AsyncConnection.connect(journal.settings.conninfo, autocommit=True) as holder:
            held = False
            lock = "SELECT pg_advisory_{}lock(hashtext(%s))"

            async def append(n: int, step: bool) -> None:
                data: dict[str, Any] = {"index": n} if step else {"n": n}
                made[n] = await journal.append("steps/order" if step else "order", STEP if step else "tick", data, T0)

            async with anyio.create_task_group() as group:
                for kind, size, steps in waves:
                    if kind == "wave":
                        for i in range(size):
                            made.append(None)
                            group.start_soon(append, len(made) - 1, steps and i % 3 == 0)
                    elif kind == "pause":
                        await anyio.sleep(size / 1000)
                    elif (kind == "lock") != held:
                        await holder.execute(lock.format("" if kind == "lock" else "un"), (journal._entries_lock,))
                        held = not held
                if held:
                    await anyio.sleep(0.01)
                    await holder.execute(lock.format("un"), (journal._entries_lock,))
        entries = [entry for entry in made if entry is not None]
        assert len(entries) == len(made)
        seqs = [entry.seq for entry in entries]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
        assert await journal.entries() == entries
    finally:
        await journal.aclose()
