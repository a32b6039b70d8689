"""The SQLite journal's kept counts as schema 6 keeps them: written only where an index cannot
answer them.

- Calls: `call_counts` holds the final records only; the open ones (PENDING, IN_DOUBT) are
  counted from `calls_open` when read, so a claim writes no count. The invariant:
  `count_calls()` (all, and a principal's) equals the counts of the records themselves
  (`CountQuery.count`), and `find_calls` finds a tool's key under every principal, whoever wrote
  the records (this journal, or another connection: a release before this one).
- Process entries: a tally up to a mark, and the entries past the mark counted when read, so an
  append writes no tally row except when it folds. The invariant: `stats().entries` is the
  number of rows in `entries`, whoever inserted or deleted them (this journal's appends and
  durable steps, a step insert that found its step stored and used up a seq, another
  connection's inserts and deletes), and the entries past the mark stay fewer than about
  `ENTRY_FOLD` while this release appends.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_durable.journal import CallIdentity, CallQuery, CallState, CountQuery, Journal, create_journal
from mcp_durable.journal.base import step_process_id
from mcp_durable.journal.sql_rows import CALL_COLUMNS, call_row
from mcp_durable.journal.sqlite import _FIND, SQLiteJournal
from mcp_durable.journal.sqlite_schema import ENTRY_FOLD, OPEN_COUNTS, SCHEMA_VERSION
from tests.backends.test_open_index_sql import SQLITE_SCHEMA_4
from tests.contract.test_calls import T0, pending

#: Schema 5 as its release made it: schema 4, `calls_open`, the version. Its entries are counted
#: by the triggers of schema 4 (`entries_counted_insert` and `_delete`).
_SQLITE_SCHEMA_5 = SQLITE_SCHEMA_4.replace("'schema_version', '4'", "'schema_version', '5'") + (
    "CREATE INDEX calls_open ON calls (state, created_at, principal, tool, key, task_id) "
    "WHERE state IN ('pending', 'in_doubt');"
)


def _tallies(path: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return dict(conn.execute("SELECT name, n FROM tallies").fetchall())


def _rows(path: Path, where: str = "1") -> int:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        (n,) = conn.execute(f"SELECT count(*) FROM entries WHERE {where}").fetchone()
        return int(n)


def _kept(path: Path) -> dict[tuple[str, str], int]:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        return {(p, s): n for p, s, n in conn.execute("SELECT principal, state, n FROM call_counts WHERE n > 0")}


async def test_a_claim_writes_no_count_and_a_completion_one(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    try:
        _, alice = await journal.claim(pending("k", principal="alice"), T0)
        _, bob = await journal.claim(pending("k", principal="bob"), T0)
        assert _kept(path) == {}  # schema 5 kept a PENDING row for each
        assert (await journal.count_calls()).by_state == {"pending": 2}
        assert (await journal.count_calls(CountQuery(principal="bob"))).by_state == {"pending": 1}
        done = alice.evolve(state=CallState.COMPLETED, result=b"{}", owner=None, lease_until=None, completed_at=T0)
        assert await journal.swap(alice.version, done)
        assert _kept(path) == {("alice", "completed"): 1}
        assert (await journal.count_calls()).by_state == {"pending": 1, "completed": 1}
        # A key of the tool under every principal: bob's is open, so only `calls_open` knows him.
        assert {r.identity.principal for r in await journal.find_calls("refund", "k")} == {"alice", "bob"}
        assert bob.state is CallState.PENDING
    finally:
        await journal.aclose()


async def test_the_open_records_are_counted_from_calls_open_alone(tmp_path: Path) -> None:
    """Counting the open records reads `calls_open` (covering): not a principal's records by the
    primary key, which SQLite would pick for a principal's count if the index were not named."""
    path = tmp_path / "journal.db"
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    await journal.aclose()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for mine, args in (("", ()), ("AND principal = ?", ("alice",))):
            plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {OPEN_COUNTS.format(mine=mine)}", args)]
            assert plan == ["SEARCH calls USING COVERING INDEX calls_open (state=?)", "USE TEMP B-TREE FOR GROUP BY"]


async def test_journal_show_reads_the_open_principals_from_calls_open_whatever_other_index_leads_with_the_tool(
    tmp_path: Path,
) -> None:
    """`find_calls` (`journal show`) looks its key up by the primary key once per principal with
    a record of the tool, the principals with an open one read from `calls_open`. An index that
    leads with `tool` (here one on `(tool, key)`, as a later schema or an operator might add)
    must not take that part over: without statistics SQLite would walk every record of the tool
    with it."""
    path = tmp_path / "journal.db"
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    await journal.aclose()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE INDEX calls_by_tool_key ON calls (tool, key)")
        plan = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {_FIND}", ("t", "t", "t", "k"))]
    assert plan[0] == "SEARCH calls USING INDEX sqlite_autoindex_calls_1 (principal=? AND tool=? AND key=?)", plan
    assert "SEARCH calls USING COVERING INDEX calls_open (state=?)" in plan, plan
    assert not [step for step in plan if "calls_by_tool_key" in step or step.startswith("SCAN calls")], plan
    journal = create_journal(f"sqlite:///{path}")  # and the journal still finds the key under each principal
    await journal.open()
    try:
        _, alice = await journal.claim(pending("k", principal="alice"), T0)
        await journal.claim(pending("k", principal="bob"), T0)
        done = alice.evolve(state=CallState.COMPLETED, result=b"{}", owner=None, lease_until=None, completed_at=T0)
        assert await journal.swap(alice.version, done)
        assert {r.identity.principal for r in await journal.find_calls("refund", "k")} == {"alice", "bob"}
    finally:
        await journal.aclose()


async def test_an_append_writes_no_tally_row_until_its_seq_folds(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    try:
        assert SCHEMA_VERSION == 6
        before = _tallies(path)
        assert before == {"entries": 0, "entries_mark": 0}
        for n in range(ENTRY_FOLD - 1):
            await journal.append("p", "note", {"n": n}, T0)
        assert _tallies(path) == before  # no statement per appended row (schema 5 had a trigger)
        assert (await journal.stats()).entries == ENTRY_FOLD - 1
        await journal.append("p", "note", {"n": ENTRY_FOLD}, T0)
        assert _tallies(path) == {"entries": ENTRY_FOLD, "entries_mark": ENTRY_FOLD}
        for n in range(3 * ENTRY_FOLD + 5):
            await journal.append("q", "note", {"n": n}, T0)
        marked = _tallies(path)
        assert marked["entries_mark"] == 4 * ENTRY_FOLD
        assert _rows(path, f"seq > {marked['entries_mark']}") == 5  # read past the mark: a short range
        assert (await journal.stats()).entries == 4 * ENTRY_FOLD + 5
    finally:
        await journal.aclose()


async def test_a_database_of_schema_5_keeps_its_count_and_loses_the_insert_trigger(tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.executescript(_SQLITE_SCHEMA_5)
        insert = "INSERT INTO entries (process_id, entry_type, data, ts) VALUES (?, 'x', '{}', 1)"
        conn.executemany(insert, [(f"p{n % 3}",) for n in range(10)])
        conn.execute("DELETE FROM entries WHERE process_id = 'p0'")  # 4 of them: 6 left, seq up to 10
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    try:
        # The tally the triggers kept holds every entry up to the last one there (seq 9).
        assert _tallies(path) == {"entries": 6, "entries_mark": 9}
        with contextlib.closing(sqlite3.connect(path)) as conn:
            triggers = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert "entries_counted_insert" not in triggers and "entries_counted_delete" in triggers
        assert (await journal.stats()).entries == 6
        await journal.append("p1", "note", {}, T0)  # seq 11: past the mark
        await journal.purge_entries(["p1"], before_seq=3)  # seq 2: below the mark, leaves the tally
        assert _tallies(path) == {"entries": 5, "entries_mark": 9}
        assert (await journal.stats()).entries == _rows(path) == 6
    finally:
        await journal.aclose()
    again = create_journal(f"sqlite:///{path}")  # an open that finds nothing to migrate
    await again.open()
    try:
        assert _tallies(path) == {"entries": 5, "entries_mark": 9}
        assert (await again.stats()).entries == 6
    finally:
        await again.aclose()


_PROCESSES = ("a", "b")
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.sampled_from(_PROCESSES)),
        st.tuples(st.just("step"), st.integers(0, 3)),  # a step stored twice uses up a seq
        st.tuples(st.just("other"), st.sampled_from(_PROCESSES)),  # another connection, no fold
        st.tuples(st.just("purge"), st.sampled_from((*_PROCESSES, "steps"))),
        st.tuples(st.just("purge_before"), st.integers(1, 40)),
        st.tuples(st.just("delete_other"), st.integers(1, 40)),
    ),
    max_size=60,
)


async def _run(path: Path, ops: list[tuple[str, object]]) -> None:
    journal = SQLiteJournal(path)
    # Fold every 4 seqs, so a short run of operations folds many times (the rule is the same at
    # any interval; `ENTRY_FOLD` itself is exercised above).
    journal.entry_fold = 4
    await journal.open()
    try:
        _, call = await journal.claim(pending("k"), T0)
        fence = call.fence
        assert fence is not None
        steps = step_process_id(fence.run_id)
        other = sqlite3.connect(path, timeout=30, isolation_level=None)
        try:
            for op, arg in ops:
                if op == "append":
                    await journal.append(str(arg), "note", {}, T0)
                elif op == "step":
                    await journal.append_step(call.identity, fence, int(str(arg)), {}, T0)
                elif op == "other":
                    other.execute(
                        "INSERT INTO entries (process_id, entry_type, data, ts) VALUES (?, 'x', '{}', 1)", (arg,)
                    )
                elif op == "purge":
                    await journal.purge_entries([steps if arg == "steps" else str(arg)])
                elif op == "purge_before":
                    await journal.purge_entries([*_PROCESSES, steps], before_seq=int(str(arg)))
                else:
                    other.execute("DELETE FROM entries WHERE seq < ?", (arg,))
                assert (await journal.stats()).entries == _rows(path), (op, arg, _tallies(path))
        finally:
            other.close()
    finally:
        await journal.aclose()


@settings(max_examples=150, deadline=None)
@given(ops=_OPS)
def test_the_entry_count_is_exact_under_any_mix_of_writers(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, object]]
) -> None:
    path = tmp_path_factory.mktemp("tally") / "journal.db"
    asyncio.run(_run(path, ops))


_IDENTITIES = st.tuples(st.sampled_from(("alice", "bob")), st.sampled_from(("refund", "ship")), st.sampled_from("kl"))
_CALL_OPS = st.lists(
    st.tuples(
        st.sampled_from(("claim", "move", "other_move", "other_insert", "other_delete")),
        _IDENTITIES,
        st.sampled_from(list(CallState)),
    ),
    max_size=40,
)


async def _check_calls(journal: Journal, step: object) -> None:
    records = await journal.list_calls(CallQuery(limit=10_000))
    assert await journal.count_calls() == CountQuery().count(records), step
    for principal in ("alice", "bob"):
        mine = CountQuery(principal=principal)
        assert await journal.count_calls(mine) == mine.count(records), step
    for tool in ("refund", "ship"):
        for key in "kl":
            found = {r.identity for r in await journal.find_calls(tool, key)}
            assert found == {r.identity for r in records if (r.identity.tool, r.identity.key) == (tool, key)}, step
    stats, counts = await journal.stats(), CountQuery().count(records)
    assert (stats.calls_by_state, stats.calls_by_tool) == (counts.by_state, counts.by_tool), step


async def _run_calls(path: Path, ops: list[tuple[str, tuple[str, str, str], CallState]]) -> None:
    journal = create_journal(f"sqlite:///{path}")
    await journal.open()
    other = sqlite3.connect(path, timeout=30, isolation_level=None)
    marks = ", ".join("?" * len(CALL_COLUMNS.split(", ")))
    try:
        for op, (principal, tool, key), state in ops:
            where, identity = "principal = ? AND tool = ? AND key = ?", (principal, tool, key)
            if op == "claim":
                await journal.claim(pending(key, principal=principal, tool=tool), T0)
            elif op == "move":
                record = await journal.get(CallIdentity(*identity))
                if record is not None:
                    assert await journal.swap(record.version, record.evolve(state=state))
            elif op == "other_move":
                other.execute(f"UPDATE calls SET state = ? WHERE {where}", (state.value, *identity))
            elif op == "other_insert":
                row = call_row(pending(key, principal=principal, tool=tool).evolve(state=state))
                other.execute(f"INSERT OR IGNORE INTO calls ({CALL_COLUMNS}) VALUES ({marks})", row)
            else:
                other.execute(f"DELETE FROM calls WHERE {where}", identity)
            await _check_calls(journal, (op, identity, state))
    finally:
        other.close()
        await journal.aclose()


@settings(max_examples=100, deadline=None)
@given(ops=_CALL_OPS)
def test_the_call_counts_are_exact_under_any_mix_of_writers(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, tuple[str, str, str], CallState]]
) -> None:
    path = tmp_path_factory.mktemp("counts") / "journal.db"
    asyncio.run(_run_calls(path, ops))
