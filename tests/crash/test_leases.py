"""Leases with real server processes: renewed while the tool runs, expired when the owner dies.

Servers are `mcp-durable serve tests.crash.crash_servers.leases:make_server` subprocesses (over
streamable HTTP, so the test can SIGKILL one by pid); the tool logs who ran it and when to a
file. Records are read straight from the journal the servers share.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp_types import CallToolResult

from mcp_durable import CallIdentity, CallRecord, CallState, JournalLockedError, create_journal
from tests.crash.crash_servers.harness import error_code, journal_url
from tests.crash.crash_servers.hooks import Counter
from tests.crash.replicas import serve_http_together
from tests.helpers import serve_http

TARGET = "tests.crash.crash_servers.leases:make_server"
LEASE = 0.6


def _starts(events: Counter, job: str) -> list[tuple[str, float]]:
    """(instance, epoch) of every start of `job`, in order."""
    found = []
    for line in events.lines():
        kind, name, *rest = line.split(" ")
        if kind == "start" and name == job:
            found.append((rest[0], float(rest[1])))
    return found


async def _record(url: str, job: str) -> CallRecord:
    journal = create_journal(url.split("?")[0])  # a reader beside the servers (never a second owner)
    await journal.open()
    try:
        record = await journal.get(CallIdentity("local", "long_task", job))
    finally:
        await journal.aclose()
    assert record is not None
    return record


async def _wait_started(events: Counter, job: str, count: int = 1) -> None:
    with anyio.fail_after(30):
        while len(_starts(events, job)) < count:
            await anyio.sleep(0.02)


async def test_a_tool_running_longer_than_three_leases_keeps_its_lease_and_a_second_server_never_takes_it(
    tmp_path: Path,
) -> None:
    url = journal_url("sqlite", tmp_path)
    events = Counter(tmp_path / "events.log")
    base = {"CRASH_COUNTER": str(events.path), "CRASH_LEASE": str(LEASE)}
    seconds = 5 * LEASE  # five lease periods: without renewals the lease would expire four times over
    result: dict[str, Any] = {}
    async with serve_http_together(
        (TARGET, url, {**base, "TASK_SECONDS": str(seconds)}), (TARGET, url, {**base, "TASK_SECONDS": "0"})
    ) as (first, second):
        async with Client(first.url, mode="legacy") as a, Client(second.url, mode="legacy") as b:

            async def run_first() -> None:
                result["first"] = await a.call_tool("long_task", {"job": "J"})

            async with anyio.create_task_group() as tg:
                tg.start_soon(run_first)
                await _wait_started(events, "J")
                owner = (await _record(url, "J")).owner
                leases: set[float] = set()
                answers: list[CallToolResult] = []
                while "first" not in result:
                    # Every duplicate on the other server latches on, then gets in_progress: never a takeover.
                    answers.append(await b.call_tool("long_task", {"job": "J"}))
                    record = await _record(url, "J")
                    if record.state == CallState.PENDING:
                        assert record.owner == owner
                        leases.add(record.lease_until or 0.0)
    first_result = result["first"]
    assert not first_result.is_error, first_result
    assert len(_starts(events, "J")) == 1, "the second server never ran the call"
    assert answers and all(error_code(r) in ("in_progress", None) for r in answers)
    finals = [r for r in answers if not r.is_error]
    assert all(r.structured_content == first_result.structured_content for r in finals)  # replays, if any
    assert len(leases) >= 3, f"the lease was renewed while the tool ran: {sorted(leases)}"
    done = await _record(url, "J")
    assert done.state == CallState.COMPLETED and done.attempts == 1


async def test_a_dead_servers_lease_expires_and_a_second_server_on_the_shared_journal_takes_the_call_over(
    tmp_path: Path,
) -> None:
    url = journal_url("sqlite", tmp_path)
    events = Counter(tmp_path / "events.log")
    base = {"CRASH_COUNTER": str(events.path), "CRASH_LEASE": str(LEASE)}
    async with serve_http_together(
        (TARGET, url, {**base, "TASK_SECONDS": "60"}), (TARGET, url, {**base, "TASK_SECONDS": "0"})
    ) as (first, second):
        async with anyio.create_task_group() as tg:

            async def doomed() -> None:
                try:
                    async with Client(first.url, mode="legacy") as a:
                        await a.call_tool("long_task", {"job": "K"})
                except Exception:  # noqa: BLE001 - the server is killed under this call
                    pass

            tg.start_soon(doomed)
            await _wait_started(events, "K")
            first.kill()  # SIGKILL mid-call
            at_kill = await _record(url, "K")
            assert at_kill.state == CallState.PENDING and at_kill.lease_until is not None
            tg.cancel_scope.cancel()
        async with Client(second.url, mode="legacy") as b:
            with anyio.fail_after(30):
                while True:
                    answer = await b.call_tool("long_task", {"job": "K"})
                    if error_code(answer) != "in_progress":
                        break
    assert not answer.is_error, answer
    starts = _starts(events, "K")
    assert [who for who, _ in starts] == [at_kill.owner, answer.structured_content["instance"]]
    assert starts[1][0] != starts[0][0], "taken over by the second server"
    assert at_kill.lease_until is not None
    assert starts[1][1] >= at_kill.lease_until, "not before the dead owner's lease expired"
    done = await _record(url, "K")
    assert done.state == CallState.COMPLETED and done.attempts == 2


@pytest.mark.parametrize("journal", ["sqlite-single-writer", "file"])
async def test_a_single_writer_journal_marks_the_previous_boots_pending_call_in_doubt_at_start(
    journal: str, tmp_path: Path
) -> None:
    url = journal_url(journal, tmp_path)
    events = Counter(tmp_path / "events.log")
    # A lease far longer than the test: only the single-writer rule can free the call in time.
    base = {"CRASH_COUNTER": str(events.path), "CRASH_LEASE": "300", "CRASH_WAIT": "0"}
    async with serve_http(TARGET, journal=url, env={**base, "TASK_SECONDS": "60"}) as first:
        async with anyio.create_task_group() as tg:

            async def doomed() -> None:
                try:
                    async with Client(first.url, mode="legacy") as a:
                        await a.call_tool("long_task", {"job": "S"})
                except Exception:  # noqa: BLE001 - the server is killed under this call
                    pass

            tg.start_soon(doomed)
            await _wait_started(events, "S")
            if journal == "sqlite-single-writer":
                with pytest.raises(JournalLockedError):  # a second writer is refused while the owner lives
                    await create_journal(url).open()
            first.kill()
            tg.cancel_scope.cancel()
    killed_at = time.time()
    async with serve_http(TARGET, journal=url, env={**base, "TASK_SECONDS": "0"}) as second:
        async with Client(second.url, mode="legacy") as b:
            answer = await b.call_tool("long_task", {"job": "S"})
    assert not answer.is_error, answer  # retried at once (a shared journal would say in_progress for 300 s)
    starts = _starts(events, "S")
    assert len(starts) == 2 and starts[1][0] == answer.structured_content["instance"]
    assert starts[1][1] < killed_at + 300, "ran before the dead owner's lease could have expired"
    if journal == "sqlite-single-writer":
        done = await _record(url, "S")
        assert done.state == CallState.COMPLETED and done.attempts == 2
