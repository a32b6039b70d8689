"""Change listeners (resources, notifications) can neither duplicate a call nor fail it."""

from __future__ import annotations

import logging

import anyio
import pytest

from mcp_durable import Engine, ToolOutcome, ToolPolicy
from mcp_durable.journal import CallRecord, CallState, create_journal


async def _run_concurrently(engine: Engine, calls: int) -> list[int]:
    runs: list[int] = []

    async def run(_call: object) -> ToolOutcome:
        runs.append(1)
        await anyio.sleep(0.05)
        return ToolOutcome("value", b'{"content":[]}', is_error=False)

    async def call() -> None:
        await engine.execute(
            tool="t", policy=ToolPolicy(), arguments={"a": 1}, meta={"mcp-durable/idempotency-key": "k"}, run=run
        )

    async with anyio.create_task_group() as tg:
        for _ in range(calls):
            tg.start_soon(call)
    return runs


async def test_a_listener_that_yields_between_claim_and_run_does_not_let_a_duplicate_run_the_tool() -> None:
    engine = Engine(create_journal("memory://"))

    async def slow_listener(record: CallRecord) -> None:
        await anyio.sleep(0.01)  # yields the loop right after the claim

    engine.listeners.append(slow_listener)
    assert len(await _run_concurrently(engine, 20)) == 1
    await engine.aclose()


async def test_a_failing_listener_does_not_fail_or_strand_the_call() -> None:
    engine = Engine(create_journal("memory://"))

    async def broken_listener(record: CallRecord) -> None:
        raise RuntimeError("listener bug")

    engine.listeners.append(broken_listener)
    assert len(await _run_concurrently(engine, 5)) == 1
    records = await engine.journal.list_calls()
    assert [r.state for r in records] == [CallState.COMPLETED]
    await engine.aclose()


async def test_a_synchronous_listener_hears_the_claim_and_the_result_with_no_failure_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = Engine(create_journal("memory://"))
    heard: list[CallState] = []

    def listener(record: CallRecord) -> None:  # no coroutine: what the engine's own listeners are
        heard.append(record.state)

    engine.listeners.append(listener)
    with caplog.at_level(logging.ERROR):
        assert len(await _run_concurrently(engine, 3)) == 1
    assert heard == [CallState.PENDING, CallState.COMPLETED]
    assert not [r for r in caplog.records if "listener failed" in r.getMessage()]
    await engine.aclose()
