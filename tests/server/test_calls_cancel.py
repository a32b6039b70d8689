"""A caller that gives up mid-call does not lose the call: the tool runs to completion (shielded),
its result is journaled, and the retry replays it without running the tool again.

The tool (`gated`) runs until the test opens its gate, so "mid-call" is a fact, not a timing bet.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_durable import KEY_META, CallIdentity, CallState
from tests.helpers import body_bytes, connect
from tests.server.servers.counting import Counter, make_server

COUNTING = "tests/server/servers/counting.py:make_server"
MEMORY = ["memory-legacy", "memory-auto"]


async def _wait_for(counter: Counter, event: str, timeout: float = 15.0) -> None:
    with anyio.fail_after(timeout):
        while counter.count(event) == 0:
            await anyio.sleep(0.01)


async def _record_state(server: Any, key: str, timeout: float = 15.0) -> CallState:
    """The record's state once it has left PENDING (the result is persisted just after the tool returns)."""
    with anyio.fail_after(timeout):
        while True:
            record = await server.journal.get(CallIdentity("local", "gated", key))
            if record is not None and record.state != CallState.PENDING:
                return CallState(record.state)
            await anyio.sleep(0.01)


async def _open_gate_once_running(counter: Counter) -> None:
    await _wait_for(counter, "gated")
    counter.open_gate()


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_caller_that_times_out_gets_the_journaled_result_on_retry(transport: str, tmp_path: Path) -> None:
    journal = f"sqlite:///{tmp_path}/journal.db"
    counter = Counter(tmp_path / "counter")
    server = make_server(journal=journal, counter=counter.path)
    call: dict[str, Any] = {"name": "gated", "arguments": {"text": "a"}, "meta": {KEY_META: "c-1"}}
    async with connect(transport, target="", journal=journal, server=server) as client:
        if transport == "memory-legacy":
            with pytest.raises(Exception) as timed_out:  # the SDK's request-timeout error
                await client.call_tool(**call, read_timeout_seconds=0.5)
            assert "tim" in str(timed_out.value).lower()
            await _wait_for(counter, "gated")
            assert counter.count("gated.done") == 0  # timed out mid-call: the gate is still shut
            counter.open_gate()
        else:
            # In-process 2026-07-28 the server handler runs in the caller's own task: the timeout
            # cancels it inside the shielded execution, which runs on until the gate opens, so
            # the caller gets the (journaled) result instead of a timeout.
            async with anyio.create_task_group() as tg:
                tg.start_soon(_open_gate_once_running, counter)
                first = await client.call_tool(**call, read_timeout_seconds=0.1)
            assert not first.is_error
        await _wait_for(counter, "gated.done")
        assert await _record_state(server, "c-1") == CallState.COMPLETED
        retry = await client.call_tool(**call)
    assert counter.count("gated") == 1
    assert not retry.is_error
    assert retry.meta is not None and retry.meta["mcp-durable/replayed"] is True
    assert retry.structured_content is not None and retry.structured_content["text"] == "a"


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_caller_whose_task_is_cancelled_mid_call_gets_the_journaled_result_on_retry(
    transport: str, tmp_path: Path
) -> None:
    journal = f"sqlite:///{tmp_path}/journal.db"
    counter = Counter(tmp_path / "counter")
    server = make_server(journal=journal, counter=counter.path)
    call: dict[str, Any] = {"name": "gated", "arguments": {"text": "b"}, "meta": {KEY_META: "c-2"}}
    async with connect(transport, target="", journal=journal, server=server) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.call_tool(**call))
            await _wait_for(counter, "gated")
            tg.cancel_scope.cancel()  # cancelled mid-call: the tool is waiting for its gate
            if transport == "memory-auto":
                # In-process 2026-07-28 the cancelled task is the one running the shielded
                # execution, so the cancellation lands only once the tool finishes.
                counter.open_gate()
        assert counter.count("gated") == 1
        counter.open_gate()
        await _wait_for(counter, "gated.done")
        assert await _record_state(server, "c-2") == CallState.COMPLETED
        retry = await client.call_tool(**call)
        again = await client.call_tool(**call)
    assert counter.count("gated") == 1
    assert retry.meta is not None and retry.meta["mcp-durable/replayed"] is True
    assert body_bytes(again) == body_bytes(retry)


@pytest.mark.parametrize("transport", ["http-legacy", "stdio-auto"])
async def test_a_caller_that_times_out_over_a_real_transport_gets_the_journaled_result_on_retry(
    transport: str, tmp_path: Path
) -> None:
    counter = Counter(tmp_path / "counter")
    env = {"COUNTER_FILE": str(counter.path)}
    call: dict[str, Any] = {"name": "gated", "arguments": {"text": "c"}, "meta": {KEY_META: "c-3"}}
    async with connect(transport, target=COUNTING, journal=f"sqlite:///{tmp_path}/j.db", env=env) as client:
        with pytest.raises(Exception):  # noqa: B017 - the SDK's request-timeout error
            # A second is ample for the call to reach the tool; the gate keeps it running past it.
            await client.call_tool(**call, read_timeout_seconds=1.0)
        await _wait_for(counter, "gated")
        assert counter.count("gated.done") == 0
        counter.open_gate()
        await _wait_for(counter, "gated.done")
        retry = await client.call_tool(**call)
    assert counter.count("gated") == 1
    assert not retry.is_error
    assert retry.meta is not None and retry.meta["mcp-durable/replayed"] is True


@pytest.mark.parametrize("transport", ["http-auto", "stdio-legacy"])
async def test_a_caller_cancelled_mid_call_over_a_real_transport_gets_the_journaled_result_on_retry(
    transport: str, tmp_path: Path
) -> None:
    counter = Counter(tmp_path / "counter")
    env = {"COUNTER_FILE": str(counter.path)}
    call: dict[str, Any] = {"name": "gated", "arguments": {"text": "d"}, "meta": {KEY_META: "c-4"}}
    async with connect(transport, target=COUNTING, journal=f"sqlite:///{tmp_path}/j.db", env=env) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.call_tool(**call))
            await _wait_for(counter, "gated")
            tg.cancel_scope.cancel()
        assert counter.count("gated.done") == 0
        counter.open_gate()
        await _wait_for(counter, "gated.done")
        retry = await client.call_tool(**call)
    assert counter.count("gated") == 1
    assert not retry.is_error
    assert retry.meta is not None and retry.meta["mcp-durable/replayed"] is True
