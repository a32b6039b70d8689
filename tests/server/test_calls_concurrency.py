"""Concurrent calls with one key: exactly one runs the tool, the others latch on to its result
(or, with a short wait, get `in_progress` with a `retry_after`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_durable import KEY_META
from tests.crash.crash_servers.harness import journal_url
from tests.helpers import body_bytes, connect, key_meta
from tests.server.conftest import CountingSetup
from tests.server.servers.counting import Counter, make_server

COUNTING = "tests/server/servers/counting.py:make_server"


async def _call_concurrently(client: Any, n: int, tool: str, arguments: dict[str, Any], key: str) -> list[Any]:
    results: list[Any] = [None] * n

    async def one(i: int) -> None:
        results[i] = await client.call_tool(tool, arguments, meta={KEY_META: key})

    async with anyio.create_task_group() as tg:
        for i in range(n):
            tg.start_soon(one, i)
    return results


@pytest.mark.parametrize("journal_kind", ["memory", "sqlite", "file"])
@pytest.mark.parametrize("transport", ["memory-legacy", "memory-auto"])
async def test_a_hundred_concurrent_calls_with_one_key_run_the_tool_once_and_all_get_its_result(
    transport: str, journal_kind: str, tmp_path: Path
) -> None:
    journal = "memory://" if journal_kind == "memory" else journal_url(journal_kind, tmp_path)
    server = make_server(journal=journal, counter=tmp_path / "counter")
    async with connect(transport, target="", journal=journal, server=server) as client:
        results = await _call_concurrently(client, 100, "slow", {"text": "x", "delay": 0.3}, "one-key")
    counter = Counter(tmp_path / "counter")
    assert counter.count("slow") == 1 and counter.count("slow.done") == 1
    assert all(not result.is_error for result in results), [r for r in results if r.is_error][:1]
    assert len({body_bytes(result) for result in results}) == 1
    replayed = [bool(result.meta and result.meta.get("mcp-durable/replayed")) for result in results]
    assert replayed.count(False) == 1  # the one that ran; the 99 others got it from the journal


@pytest.mark.parametrize("journal_kind", ["sqlite", "file"])
@pytest.mark.parametrize("transport", ["memory-legacy", "memory-auto"])
async def test_duplicates_arriving_at_any_moment_of_a_fast_call_never_run_it_again(
    transport: str, journal_kind: str, tmp_path: Path
) -> None:
    # A fast tool, and each key's duplicates spread over a few milliseconds: some arrive while
    # the first call's claim or its result is still on its way to the journal, the moments in
    # which the instance must still count the call as its own live one (not a dead owner's).
    journal = journal_url(journal_kind, tmp_path)
    server = make_server(journal=journal, counter=tmp_path / "counter")
    rng = random.Random(5)
    keys = [f"key-{i:02d}" for i in range(30)]
    results: dict[str, list[Any]] = {key: [] for key in keys}
    async with connect(transport, target="", journal=journal, server=server) as client:

        async def one(key: str, delay: float) -> None:
            await anyio.sleep(delay)
            results[key].append(await client.call_tool("record", {"text": key}, meta=key_meta(key)))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for key in keys:
                    for _ in range(8):
                        tg.start_soon(one, key, rng.uniform(0, 0.02))
    assert Counter(tmp_path / "counter").count("record") == len(keys)
    for key, answers in results.items():
        assert [r for r in answers if r.is_error] == []
        assert len({body_bytes(r) for r in answers}) == 1, key  # one run id per key: one execution


async def test_a_hundred_concurrent_calls_over_http_run_the_tool_once(tmp_path: Path) -> None:
    env = {"COUNTER_FILE": str(tmp_path / "counter")}
    async with connect("http-auto", target=COUNTING, journal=f"sqlite:///{tmp_path}/j.db", env=env) as client:
        results = await _call_concurrently(client, 100, "slow", {"text": "x", "delay": 0.5}, "http-key")
    assert Counter(tmp_path / "counter").count("slow") == 1
    assert all(not result.is_error for result in results)
    assert len({body_bytes(result) for result in results}) == 1


@pytest.mark.parametrize("transport", ["memory-legacy", "memory-auto", "http-auto"])
async def test_with_a_short_wait_latecomers_get_in_progress_with_a_retry_after(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    arguments = {"text": "x"}
    async with connect(transport, **counting_setup(transport)) as client:
        results: list[Any] = []

        async def first() -> None:
            results.append(await client.call_tool("gated_short_wait", arguments, meta=key_meta("k")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(first)
            with anyio.fail_after(15):  # latecomers are sent once the first call is running
                while counter.count("gated_short_wait") == 0:
                    await anyio.sleep(0.01)
            late = await _call_concurrently(client, 10, "gated_short_wait", arguments, "k")
            counter.open_gate()  # only now can the first call finish
        after = await client.call_tool("gated_short_wait", arguments, meta=key_meta("k"))
    assert counter.count("gated_short_wait") == 1
    assert not results[0].is_error
    for result in late:
        assert result.is_error
        assert result.meta["mcp-durable/error"]["error"] == "in_progress"
        assert isinstance(result.meta["mcp-durable/error"]["retry_after"], int | float)
        assert result.meta["mcp-durable/error"]["retry_after"] > 0
        assert result.meta is not None and result.meta["mcp-durable/key"] == "k"
    # Once the first call finished, the retry gets its result.
    assert body_bytes(after) == body_bytes(results[0])
    assert after.meta is not None and after.meta["mcp-durable/replayed"] is True
