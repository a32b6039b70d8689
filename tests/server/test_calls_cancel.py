"""A caller that gives up mid-call does not lose the call: the tool runs to completion (shielded),
its result is journaled, and the retry replays it without running the tool again."""

from __future__ import annotations

from pathlib import Path

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
            await anyio.sleep(0.02)


@pytest.mark.parametrize("transport", MEMORY)
async def test_a_caller_that_times_out_gets_the_journaled_result_on_retry(transport: str, tmp_path: Path) -> None:
    journal = f"sqlite:///{tmp_path}/journal.db"
    counter = Counter(tmp_path / "counter")
    server = make_server(journal=journal, counter=counter.path)
    arguments = {"text": "a", "delay": 0.6}
    async with connect(transport, target="", journal=journal, server=server) as client:
        if transport == "memory-legacy":
            with pytest.raises(Exception) as timed_out:  # the SDK's request-timeout error
                await client.call_tool("slow", arguments, read_timeout_seconds=0.1, meta={KEY_META: "c-1"})
            assert "tim" in str(timed_out.value).lower()
            assert counter.count("slow.done") == 0, "the call was expected to time out while the tool ran"
        else:
            # In-process 2026-07-28 the server handler runs in the caller's own task: the timeout
            # cancels it inside the shielded execution, which finishes first, so the caller gets
            # the (journaled) result instead of a timeout.
            first = await client.call_tool("slow", arguments, read_timeout_seconds=0.1, meta={KEY_META: "c-1"})
            assert not first.is_error and counter.count("slow.done") == 1
        await _wait_for(counter, "slow.done")
        record = await server.journal.get(CallIdentity("local", "slow", "c-1"))
        assert record is not None and record.state == CallState.COMPLETED
        retry = await client.call_tool("slow", arguments, meta={KEY_META: "c-1"})
    assert counter.count("slow") == 1
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
    arguments = {"text": "b", "delay": 0.6}
    async with connect(transport, target="", journal=journal, server=server) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: client.call_tool("slow", arguments, meta={KEY_META: "c-2"}))
            await _wait_for(counter, "slow")
            assert counter.count("slow.done") == 0  # cancelled while the tool runs
            tg.cancel_scope.cancel()
        await _wait_for(counter, "slow.done")
        record = await server.journal.get(CallIdentity("local", "slow", "c-2"))
        assert record is not None and record.state == CallState.COMPLETED
        retry = await client.call_tool("slow", arguments, meta={KEY_META: "c-2"})
        again = await client.call_tool("slow", arguments, meta={KEY_META: "c-2"})
    assert counter.count("slow") == 1
    assert retry.meta is not None and retry.meta["mcp-durable/replayed"] is True
    assert body_bytes(again) == body_bytes(retry)


@pytest.mark.parametrize("transport", ["http-legacy", "http-auto"])
async def test_a_caller_that_times_out_over_http_gets_the_journaled_result_on_retry(
    transport: str, tmp_path: Path
) -> None:
    counter = Counter(tmp_path / "counter")
    env = {"COUNTER_FILE": str(counter.path)}
    arguments = {"text": "c", "delay": 0.6}
    async with connect(transport, target=COUNTING, journal=f"sqlite:///{tmp_path}/j.db", env=env) as client:
        with pytest.raises(Exception):
            await client.call_tool("slow", arguments, read_timeout_seconds=0.1, meta={KEY_META: "c-3"})
        assert counter.count("slow.done") == 0
        await _wait_for(counter, "slow.done")
        retry = await client.call_tool("slow", arguments, meta={KEY_META: "c-3"})
    assert counter.count("slow") == 1
    assert not retry.is_error
    assert retry.meta is not None and retry.meta["mcp-durable/replayed"] is True
