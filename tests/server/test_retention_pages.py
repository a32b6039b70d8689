"""A retention pass purges in pages and lets the server serve between them: a durable call made
while many expired records are being deleted is answered before the last of them goes (issue 34).

Before, a pass dropped 1,000 records per journal call without a pause (SQLite: one transaction
holding the writer; the file journal: every expired record at once on the event loop, seconds
for 10^4), and calls made meanwhile waited for it (benchmark case 13)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Journal, create_journal
from mcp_durable.journal.base import PurgedCalls, step_process_id
from mcp_durable.operations.retention import MIN_PAGE, BackgroundRetention, RetentionSchedule, retention_pass
from tests.conftest import scratch_postgres_url

EXPIRED = 20 * MIN_PAGE
NOW = 1_700_000_000.0  # in the past: the server's clock finds every expiry passed


def _url(kind: str, tmp_path: Path) -> str:
    if kind == "file":
        return f"file://{tmp_path}/journal"
    if kind == "sqlite":
        return f"sqlite:///{tmp_path}/journal.db"
    return scratch_postgres_url("retention_pages")


async def _expired(journal: Journal, count: int, first: int = 0) -> None:
    """`count` completed records (keys from R-`first`), each with one durable step, expired (a
    second apart) before NOW."""
    for n in range(first, first + count):
        created = NOW - 86400.0 + n
        pending = CallRecord(
            CallIdentity("local", "refund", f"R-{n}"),
            "f",
            CallState.PENDING,
            1,
            f"run-{n}",
            1,
            created,
            created,
            owner="writer",
            lease_until=NOW + 3600.0,
        )
        won, _ = await journal.claim(pending, NOW)
        assert won and pending.fence is not None
        assert await journal.append_step(pending.identity, pending.fence, 0, {"value": n}, created)
        done = pending.evolve(
            state=CallState.COMPLETED, owner=None, lease_until=None, result=b"{}", expires_at=created + 60.0
        )
        assert await journal.swap(1, done)


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
async def test_a_call_made_during_a_pass_is_answered_while_expired_records_are_left_to_delete(
    kind: str, tmp_path: Path
) -> None:
    url = _url(kind, tmp_path)
    seeding = create_journal(url)
    await seeding.open()
    try:
        await _expired(seeding, EXPIRED)
    finally:
        await seeding.aclose()
    server = DurableServer("pages", journal=url, retention_schedule=None, reconcile_interval=None)

    async def noop(n: int) -> str:
        return "ok"

    server.add_tool(noop, name="noop", durable=ToolPolicy(key="derived"))
    # A tiny budget keeps every page at MIN_PAGE records: the pass takes many pages.
    schedule = RetentionSchedule(compact_garbage_ratio=None, purge_page_s=1e-9)
    async with Client(server) as client:
        journal = server.engine.journal
        assert (await journal.count_calls()).total == EXPIRED
        passes = []
        async with anyio.create_task_group() as group:

            async def run_pass() -> None:
                passes.append(await retention_pass(server.engine, schedule))

            group.start_soon(run_pass)
            with anyio.fail_after(60):  # a bound on a hang, never a timing assertion
                while (await journal.count_calls()).total == EXPIRED:
                    await anyio.sleep(0)  # the pass has not deleted anything yet
            result = await client.call_tool("noop", {"n": 1})
            left = (await journal.count_calls(), bool(passes))
        assert not result.is_error
        counts, finished_early = left
        # One record is the call's own; the rest are expired records the pass had not reached.
        assert counts.total - 1 > 0 and not finished_early, "the call waited until the pass had deleted every record"
        (finished,) = passes
        assert (finished.records_purged, finished.step_entries_dropped) == (EXPIRED, EXPIRED)
        assert (await journal.count_calls()).total == 1
        assert await journal.entries(process_id=step_process_id("run-0")) == []


async def test_the_file_journal_purges_a_page_of_the_earliest_expiries_and_a_reopen_agrees(tmp_path: Path) -> None:
    url = f"file://{tmp_path}/journal"
    journal = create_journal(url)
    await journal.open()
    try:
        await _expired(journal, 40)
        first = await journal.purge_expired_calls(NOW, 10)
        assert sorted(identity.key for identity, _ in first.calls) == sorted(f"R-{n}" for n in range(10))
        assert first.step_entries == 10
        assert (await journal.count_calls()).total == 30
    finally:
        await journal.aclose()
    reopened = create_journal(url)
    await reopened.open()
    try:
        # The page's purge frame replays as exactly that page: the 30 later expiries stand.
        assert (await reopened.count_calls()).total == 30
        assert await reopened.get(CallIdentity("local", "refund", "R-9")) is None
        assert await reopened.get(CallIdentity("local", "refund", "R-10")) is not None
        rest = await reopened.purge_expired_calls(NOW, 1000)
        assert len(rest.calls) == 30 and rest.step_entries == 30
    finally:
        await reopened.aclose()


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
async def test_a_schedule_s_passes_start_at_the_page_size_the_last_one_settled_on_and_stop_at_a_short_page(
    kind: str, tmp_path: Path
) -> None:
    # Every page is a commit that a call may wait behind (benchmark case 11: with records kept
    # 1 s and a pass every 0.5 s, each pass ramped up from MIN_PAGE again and asked once more
    # for nothing, and the p99 of calls made meanwhile doubled on SQLite).
    server = DurableServer("pages", journal=_url(kind, tmp_path), retention_schedule=None, reconcile_interval=None)
    # A budget no page comes near: each full page doubles the next (16, 32, 64, 128, ...).
    retention = BackgroundRetention(server.engine, RetentionSchedule(compact_garbage_ratio=None, purge_page_s=60.0))
    async with Client(server):
        journal = server.engine.journal
        pages: list[int] = []
        purge = journal.purge_expired_calls

        async def counted(now: float, limit: int = 1000) -> PurgedCalls:
            done = await purge(now, limit)
            pages.append(len(done.calls))
            return done

        journal.purge_expired_calls = counted  # type: ignore[method-assign]  # counts, then the journal's own
        await _expired(journal, 200)
        first = await retention.run_once()
        # 16 + 32 + 64, then a page of 128 finds the last 88: the pass ends there.
        assert (first.records_purged, pages) == (200, [16, 32, 64, 88])
        pages.clear()
        await _expired(journal, 100, first=200)
        second = await retention.run_once()
        assert (second.records_purged, second.step_entries_dropped, pages) == (100, 100, [100])
        pages.clear()
        assert (await retention.run_once()).records_purged == 0 and pages == [0]
        assert (await journal.count_calls()).total == 0
