"""The engine's tasks on every backend: one run per key, the same task for a repeat, cancellation.

The MCP face's tests (tests/server/test_tasks*.py) drive these through real clients on the file
journal; here the engine alone runs them on each journal, so a backend's task index is exercised
by the whole task life (claim with a task id, swaps, attach, cancel).
"""

from __future__ import annotations

import anyio

from mcp_durable import Engine, ToolOutcome, ToolPolicy
from mcp_durable.journal import CallState, Journal

POLICY = ToolPolicy(task_support="optional", lease=1.0, key="derived")  # repeats keyed by their arguments
KEY_META = "mcp-durable/idempotency-key"


async def _until(engine: Engine, task_id: str, state: CallState) -> None:
    with anyio.fail_after(10):
        while (record := await engine.task("local", task_id)) is None or record.state != state:
            await anyio.sleep(0.01)


async def test_a_task_runs_once_and_a_repeat_of_its_key_answers_with_the_same_task(journal: Journal) -> None:
    engine = Engine(journal)
    runs: list[str] = []
    gate = anyio.Event()

    async def run(_call: object) -> ToolOutcome:
        runs.append("run")
        await gate.wait()
        return ToolOutcome("v", b'{"content":[]}', is_error=False)

    try:
        first = await engine.submit(tool="t", policy=POLICY, arguments={"a": 1}, meta=None, run=run)
        again = await engine.submit(tool="t", policy=POLICY, arguments={"a": 1}, meta=None, run=run)
        assert first.task_id is not None and again.task_id == first.task_id
        assert first.state == CallState.PENDING
        gate.set()
        await _until(engine, first.task_id, CallState.COMPLETED)
        done = await engine.submit(tool="t", policy=POLICY, arguments={"a": 1}, meta=None, run=run)
        assert done.task_id == first.task_id and done.state == CallState.COMPLETED
        assert await engine.task("someone-else", first.task_id) is None
    finally:
        await engine.aclose()
    assert runs == ["run"]


async def test_a_plain_call_gets_a_task_attached_when_it_is_asked_for_as_one(journal: Journal) -> None:
    engine = Engine(journal)

    async def run(_call: object) -> ToolOutcome:
        return ToolOutcome("v", b'{"content":[]}', is_error=False)

    try:
        await engine.execute(tool="t", policy=POLICY, arguments={"a": 2}, meta={KEY_META: "k"}, run=run)
        record = await engine.submit(tool="t", policy=POLICY, arguments={"a": 2}, meta={KEY_META: "k"}, run=run)
        assert record.task_id is not None and record.state == CallState.COMPLETED
        assert (await engine.task("local", record.task_id)) == record
    finally:
        await engine.aclose()


async def test_a_task_and_a_plain_call_fingerprint_the_same_arguments_under_the_policy(journal: Journal) -> None:
    # `note` is not fingerprinted: a plain call's repeat with another note is the same call, and
    # so is a task asking for it (before, a task fingerprinted every argument: key reuse).
    policy = ToolPolicy(task_support="optional", lease=1.0, key="derived", fingerprint_exclude=("note",))
    engine = Engine(journal)

    async def run(_call: object) -> ToolOutcome:
        return ToolOutcome("v", b'{"content":[]}', is_error=False)

    try:
        await engine.execute(tool="t", policy=policy, arguments={"a": 4, "note": "x"}, meta={KEY_META: "k4"}, run=run)
        record = await engine.submit(
            tool="t", policy=policy, arguments={"a": 4, "note": "y"}, meta={KEY_META: "k4"}, run=run
        )
        assert record.state == CallState.COMPLETED and record.task_id is not None
    finally:
        await engine.aclose()


async def test_cancelling_a_task_stops_its_tool_and_it_stays_cancelled(journal: Journal) -> None:
    engine = Engine(journal)
    stopped = anyio.Event()

    async def run(_call: object) -> ToolOutcome:
        try:
            await anyio.sleep_forever()
        finally:
            stopped.set()
        raise AssertionError("not reached")

    try:
        record = await engine.submit(tool="t", policy=POLICY, arguments={"a": 3}, meta=None, run=run)
        assert record.task_id is not None
        await anyio.sleep(0.05)
        cancelled, changed = await engine.cancel_task("local", record.task_id, POLICY.retention)
        assert changed and cancelled is not None and cancelled.cancelled
        with anyio.fail_after(5):
            await stopped.wait()
        again, changed_again = await engine.cancel_task("local", record.task_id, POLICY.retention)
        assert not changed_again and again is not None and again.cancelled
        repeat = await engine.submit(tool="t", policy=POLICY, arguments={"a": 3}, meta=None, run=run)
        assert repeat.task_id == record.task_id and repeat.cancelled  # never run again
    finally:
        await engine.aclose()
