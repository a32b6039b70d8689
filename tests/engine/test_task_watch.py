"""The task watch and the start-up sweep on every backend: one pass sees every open record it
looks for, however many pages they fill.

The watch (`TaskRuns.watch_once`, run every `watch_interval` on a shared journal) read one
page of 500 PENDING tasks and one of 500 IN_DOUBT tasks, with no cursor: a task past the first
500 was never resumed. Now both passes page through the journal's index of open records
(`each_call`). The journal is the real one; the resumer is the face's seam (`task_resumer`),
here a function that notes what it was handed.
"""

from __future__ import annotations

import asyncio
import time

import anyio

from mcp_durable import Engine, ToolPolicy
from mcp_durable.engine.lifecycle import SWEEP_PAGE
from mcp_durable.engine.tasks import TASK_PAGE
from mcp_durable.journal import CallIdentity, CallQuery, CallRecord, CallState, Journal
from mcp_durable.journal.model import Reason

POLICY = ToolPolicy(task_support="optional", lease=1.0, in_doubt="retry")
#: An hour ago: every lease below has run out by the engine's clock (real time).
T0 = time.time() - 3600


def _orphan(key: str, *, task: bool, state: CallState = CallState.PENDING, n: int = 0) -> CallRecord:
    """A record whose owner is gone: its lease ran out long ago, and no engine is its owner."""
    created = T0 + n * 0.001
    return CallRecord(
        identity=CallIdentity("alice" if n % 2 else "bob", "work", key),
        fingerprint="f",
        state=state,
        version=1,
        run_id=f"run-{key}",
        attempts=1,
        created_at=created,
        updated_at=created,
        owner="gone" if state == CallState.PENDING else None,
        lease_until=created + 1 if state == CallState.PENDING else None,
        task_id=f"task-{key}" if task else None,
        reason=Reason.LOST_OWNER if state == CallState.IN_DOUBT else None,
    )


async def _claim_all(journal: Journal, records: list[CallRecord]) -> None:
    async def claim(record: CallRecord) -> None:
        won, _ = await journal.claim(record, record.created_at)
        assert won

    async with anyio.create_task_group() as tg:  # together: group commits, batches
        for record in records:
            tg.start_soon(claim, record)


def _watching(journal: Journal, resumed: list[CallIdentity]) -> Engine:
    engine = Engine(journal)

    async def resumer(record: CallRecord) -> None:
        resumed.append(record.identity)

    engine.task_resumer = resumer
    engine.task_policy = lambda tool: POLICY if tool == "work" else None
    return engine


async def _background_done(engine: Engine) -> None:
    while engine.background:
        await asyncio.gather(*list(engine.background))


async def test_one_look_of_the_task_watch_resumes_every_orphaned_task_past_a_page(journal: Journal) -> None:
    pending = [_orphan(f"p{n:04d}", task=True, n=n) for n in range(TASK_PAGE + 25)]
    in_doubt = [_orphan(f"d{n:04d}", task=True, state=CallState.IN_DOUBT, n=n) for n in range(30)]
    plain = [_orphan(f"c{n:04d}", task=False, n=n) for n in range(40)]  # orphans too, but no tasks
    done = [_orphan(f"x{n:04d}", task=True, state=CallState.COMPLETED, n=n) for n in range(20)]
    await _claim_all(journal, pending + in_doubt + plain + done)
    resumed: list[CallIdentity] = []
    engine = _watching(journal, resumed)
    try:
        looked = await engine.tasks.watch_once()
        await _background_done(engine)
    finally:
        await engine.aclose()
    assert looked == len(pending) + len(in_doubt)
    assert sorted(resumed) == sorted(r.identity for r in pending + in_doubt)  # each once


async def test_a_look_of_the_task_watch_with_no_open_task_hands_nothing_on(journal: Journal) -> None:
    plain = [_orphan(f"c{n}", task=False, n=n) for n in range(5)]
    done = [_orphan(f"x{n}", task=True, state=CallState.COMPLETED, n=n) for n in range(5)]
    await _claim_all(journal, plain + done)
    resumed: list[CallIdentity] = []
    engine = _watching(journal, resumed)
    try:
        assert await engine.tasks.watch_once() == 0
    finally:
        await engine.aclose()
    assert resumed == []


async def test_resume_all_hands_on_every_in_doubt_task_past_a_page(journal: Journal) -> None:
    in_doubt = [_orphan(f"d{n:04d}", task=True, state=CallState.IN_DOUBT, n=n) for n in range(TASK_PAGE + 3)]
    await _claim_all(journal, in_doubt + [_orphan("p", task=True)])
    resumed: list[CallIdentity] = []
    engine = _watching(journal, resumed)
    try:
        assert await engine.tasks.resume_all() == len(in_doubt)
        await _background_done(engine)
    finally:
        await engine.aclose()
    assert sorted(resumed) == sorted(r.identity for r in in_doubt)


async def test_the_sweep_marks_every_orphan_past_a_page_in_doubt(journal: Journal) -> None:
    orphans = [_orphan(f"p{n:04d}", task=n % 3 == 0, n=n) for n in range(SWEEP_PAGE + 10)]
    await _claim_all(journal, orphans + [_orphan("d", task=False, state=CallState.IN_DOUBT)])
    engine = Engine(journal)
    try:
        assert await engine.sweep() == len(orphans)
    finally:
        await engine.aclose()
    assert await journal.list_calls(CallQuery(state=CallState.PENDING)) == []
    marked = await journal.list_calls(CallQuery(state=CallState.IN_DOUBT, limit=10_000))
    assert len(marked) == len(orphans) + 1
    assert all(r.reason == Reason.LOST_OWNER for r in marked)
