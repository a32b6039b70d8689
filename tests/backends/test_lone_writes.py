"""A call alone skips the batching turn; calls made together still share commits (journal/callers.py).

The engine counts the calls it is inside (`engine/live_owners.py`); the file journal's group
commit and the SQLite writer skip the pass of the event loop a batch waits for only when their
write belongs to the one call in flight. Seen from outside: a task ready beside a sequential
miss has not run when the miss is answered (the miss gave the loop no pass), and calls made
together commit in a few batches. Real journals; durability relaxed (no sync) and the commits'
moving averages reset so that every commit is the inline one whatever the disk does.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_durable import ToolPolicy
from mcp_durable.engine import Engine, ToolOutcome
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Journal, callers
from mcp_durable.journal.file import FileJournal
from mcp_durable.journal.sqlite import SQLiteJournal
from mcp_durable.keys import KEY_META
from mcp_durable.steps import DurableCall

T0 = 1_700_000_000.0


@pytest.fixture(params=["file", "sqlite"])
async def journal(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Journal]:
    opened: Journal
    if request.param == "file":
        opened = FileJournal(tmp_path / "j", durability="relaxed")
    else:
        opened = SQLiteJournal(tmp_path / "j.db", synchronous="OFF")
    await opened.open()
    try:
        yield opened
    finally:
        await opened.aclose()


def commits(journal: Journal) -> int:
    """Batches the journal has committed (each one write and one sync, or one transaction)."""
    if isinstance(journal, FileJournal):
        assert journal._commit is not None
        return journal._commit.batches
    assert isinstance(journal, SQLiteJournal) and journal._writer is not None
    return journal._writer.batches


def fast_commits(journal: Journal) -> None:
    """Recent commits were fast: the next ones are inline (on the event loop's thread)."""
    if isinstance(journal, FileJournal):
        assert journal._commit is not None
        journal._commit.flush_s = 0.0
    else:
        assert isinstance(journal, SQLiteJournal) and journal._writer is not None
        journal._writer.commit_s = 0.0


def pending(key: str) -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "refund", key),
        fingerprint="f",
        state=CallState.PENDING,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=T0,
        updated_at=T0,
        owner="A",
        lease_until=T0 + 30,
        arguments=b'{"a":1}',
    )


async def probed(work: Awaitable[object]) -> bool:
    """Whether a task made ready just before `work` was awaited ran before `work` finished."""
    ran: list[bool] = []

    async def probe() -> None:
        ran.append(True)

    task = asyncio.get_running_loop().create_task(probe())
    await work
    passed = bool(ran)
    await task
    return passed


async def test_a_lone_write_takes_the_turn_unless_its_call_is_the_only_one_in_flight(journal: Journal) -> None:
    callers.enter()  # a stretch of one call: overlapping calls of the tests before no longer count
    callers.leave()
    await anyio.sleep(0)
    fast_commits(journal)
    assert await probed(journal.claim(pending("nobody"), T0))  # no call counted: the turn, as before
    callers.enter()
    try:
        fast_commits(journal)
        assert not await probed(journal.claim(pending("one"), T0))
        callers.enter()
        try:
            fast_commits(journal)
            assert await probed(journal.claim(pending("two"), T0))
        finally:
            callers.leave()
    finally:
        callers.leave()
    for key in ("nobody", "one", "two"):
        assert await journal.get(CallIdentity("local", "refund", key)) is not None


async def tool(call: DurableCall | None) -> ToolOutcome:
    return ToolOutcome({"ok": True}, b'{"ok":true}', False)


async def test_a_sequential_miss_gives_the_loop_no_pass_and_calls_made_together_share_commits(
    journal: Journal,
) -> None:
    engine = Engine(journal)
    await engine.start()
    policy = ToolPolicy()
    try:

        async def call(key: str) -> None:
            outcome = await engine.execute(tool="refund", policy=policy, arguments={}, meta={KEY_META: key}, run=tool)
            assert outcome.payload == b'{"ok":true}' and not outcome.replayed

        await call("warm")  # a stretch of one call: overlapping calls of the tests before no longer count
        fast_commits(journal)
        before = commits(journal)
        assert not await probed(call("alone")), "a sequential miss gave the event loop a pass"
        assert commits(journal) - before == 2  # its claim and its outcome
        assert callers.in_flight() == 0

        # 16 calls ready together. Each finishes without a pass of the loop once it has the journal
        # to itself, so each of them would find itself the only call in flight: the first goes alone
        # (two commits), the second takes the turn and the rest join it (a commit of 15 claims, one
        # of 15 outcomes). Taking every lone write's turn (before) made 2 commits; skipping it for
        # every call counted alone, without `callers.alone`'s check of the pass, made 27-32.
        fast_commits(journal)
        before = commits(journal)
        await together(call, "first-wave", 16)
        assert commits(journal) - before <= 4
        # The next waves of callers in step: the count was 0 between waves, but calls overlapped in
        # the wave before, so the first call of a wave takes the turn and the others join it: one
        # commit of claims and one of outcomes a wave (without that, the first went alone: 4).
        for wave in range(3):
            fast_commits(journal)
            before = commits(journal)
            await together(call, f"wave-{wave}", 16)
            assert commits(journal) - before <= 2, f"wave {wave}"
        assert callers.in_flight() == 0
        # (A lone call after the waves takes the turn once, then skips it again: that is stepped
        # through in tests/unit/test_batching_turn.py. Here the SQLite writer has begun writing its
        # WAL ahead by then, and an op finding the connection busy goes to the thread: a pass.)
    finally:
        await engine.aclose()


async def together(call: Callable[[str], Coroutine[Any, Any, None]], prefix: str, calls: int) -> None:
    """`calls` calls started in one pass of the event loop; returns when all are answered."""
    async with anyio.create_task_group() as group:
        for n in range(calls):
            group.start_soon(call, f"{prefix}-{n}")


async def test_a_writer_appending_in_a_loop_skips_the_turn_and_writers_started_together_share_commits(
    journal: Journal,
) -> None:
    # A process journal's appends outside any call (an agent's steps, a worker's): the task's
    # first two take the turn, its later ones give the loop no pass (each was one pass before).
    callers.enter()  # a stretch of one call: overlapping calls of the tests before no longer count
    callers.leave()

    async def writer(process: str) -> list[bool]:
        passes = []
        for n in range(4):
            fast_commits(journal)
            passes.append(await probed(journal.append(process, "context_update", {"n": n}, T0)))
        return passes

    assert await asyncio.get_running_loop().create_task(writer("alone")) == [True, True, False, False]
    assert len(await journal.entries(process_id="alone")) == 4

    # Eight new writers started together, twice each: each round is one commit, as when every
    # append took the turn (the first of them does not go alone).
    async def twice(process: str) -> None:
        for n in range(2):
            await journal.append(process, "context_update", {"n": n}, T0)

    fast_commits(journal)
    before = commits(journal)
    async with anyio.create_task_group() as group:
        for n in range(8):
            group.start_soon(twice, f"w{n}")
    assert commits(journal) - before == 2
    assert callers.in_flight() == 0
    for n in range(8):
        assert len(await journal.entries(process_id=f"w{n}")) == 2
