"""`retry_after` of an `in_progress` refusal follows the tool's observed run time, not the lease.

The server runs on an injected clock, and the tool "works" by moving that clock on, so every
duration is exact: a job of one second under a 30 s lease advises about one second, not ~30.
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy
from tests.helpers import key_meta


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def build(clock: Clock, started: anyio.Event, gate: anyio.Event) -> DurableServer:
    server = DurableServer("jobs", journal="memory://", clock=clock)

    @server.tool(durable=ToolPolicy(key="required", wait=0.0, lease=30.0))
    async def job(seconds: float, hold: bool = False) -> dict[str, Any]:
        if hold:
            started.set()
            await gate.wait()  # runs until the test lets it finish
        clock.now += seconds  # the work takes `seconds` on the server's clock
        return {"done": True}

    return server


def retry_after(result: Any) -> float:
    assert result.is_error and result.meta["mcp-durable/error"]["error"] == "in_progress", result
    value = result.meta["mcp-durable/error"]["retry_after"]
    assert isinstance(value, float)
    return value


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_retry_after_is_the_median_run_time_left_not_the_lease(mode: str) -> None:
    clock, started, gate = Clock(), anyio.Event(), anyio.Event()
    server = build(clock, started, gate)
    async with Client(server, mode=mode) as client:
        for i, seconds in enumerate([1.0, 1.0, 5.0]):  # median 1 s (one slow run does not skew it)
            done = await client.call_tool("job", {"seconds": seconds}, meta=key_meta(f"k-{i}"))
            assert not done.is_error
        held: dict[str, Any] = {}
        async with anyio.create_task_group() as group:

            async def first() -> None:
                arguments = {"seconds": 0.0, "hold": True}
                held["result"] = await client.call_tool("job", arguments, meta=key_meta("k-held"))

            group.start_soon(first)
            await started.wait()  # the first call runs (its claim is made)
            try:  # the held call is let go whatever happens, so a failure never hangs the test
                duplicate = {"seconds": 0.0, "hold": True}
                answer = await client.call_tool("job", duplicate, meta=key_meta("k-held"))
                assert retry_after(answer) == pytest.approx(1.0)  # the median, the call just started
                clock.now += 0.75
                answer = await client.call_tool("job", duplicate, meta=key_meta("k-held"))
                assert retry_after(answer) == pytest.approx(0.25)
                clock.now += 5.0  # running far longer than usual: expected soon, half the median
                answer = await client.call_tool("job", duplicate, meta=key_meta("k-held"))
                assert retry_after(answer) == pytest.approx(0.5)
            finally:
                gate.set()
        assert not held["result"].is_error


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_retry_after_without_any_run_seen_is_the_time_the_call_has_run(mode: str) -> None:
    clock, started, gate = Clock(), anyio.Event(), anyio.Event()
    server = build(clock, started, gate)
    async with Client(server, mode=mode) as client:
        async with anyio.create_task_group() as group:
            group.start_soon(lambda: client.call_tool("job", {"seconds": 0.0, "hold": True}, meta=key_meta("k")))
            await started.wait()
            try:
                duplicate = {"seconds": 0.0, "hold": True}
                answer = await client.call_tool("job", duplicate, meta=key_meta("k"))
                assert retry_after(answer) == pytest.approx(0.1)  # just claimed: the floor
                clock.now += 2.0
                answer = await client.call_tool("job", duplicate, meta=key_meta("k"))
                assert retry_after(answer) == pytest.approx(2.0)
                clock.now += 27.0  # 29 s into a 30 s lease: bounded by what is left of it, not 29 s
                answer = await client.call_tool("job", duplicate, meta=key_meta("k"))
                assert retry_after(answer) == pytest.approx(1.0)
            finally:
                gate.set()
