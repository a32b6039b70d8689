"""A call that outlives its timeout loses only itself: a durable one is left in doubt, a pass-through
one is answered with a timeout error, and the shared upstream session, with the other calls in
flight on it, goes on.

The upstream is the plain Python upstream over stdio (a real subprocess): `gated` (durable) and
`stall` (pass-through) both run until the test opens the gate, so which call outlives its
timeout is decided by the timeouts given, and the other call is still in flight when it does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import REQUEST_TIMEOUT

from mcp_durable.policy_file import parse_policies
from mcp_durable.proxy import ProxyServer
from tests.helpers import key_meta, meta_of
from tests.proxy.upstreams import plain_stdio_spec, upstream_env
from tests.server.servers.counting import Counter

WAIT = 30.0


async def _until(check: Callable[[], bool], what: str) -> None:
    with anyio.fail_after(WAIT):
        while not check():
            await anyio.sleep(0.02)
    assert check(), what


def _proxy(tmp_path: Path, policies: str, call_timeout: float | None) -> tuple[ProxyServer, Counter]:
    env = upstream_env(tmp_path)
    spec = dataclasses.replace(plain_stdio_spec(env), call_timeout=call_timeout)
    proxy = ProxyServer(spec, parse_policies(policies), journal=f"sqlite:///{tmp_path}/proxy.db")
    return proxy, Counter(env["COUNTER_FILE"])


async def test_a_durable_call_past_its_timeout_is_in_doubt_and_a_concurrent_call_completes(tmp_path: Path) -> None:
    proxy, counter = _proxy(tmp_path, "[tools.gated]\ntimeout = 1.0\n", call_timeout=None)
    other: list[Any] = []
    async with Client(proxy, mode="legacy") as client:
        async with anyio.create_task_group() as tg:

            async def stall() -> None:
                other.append(await client.call_tool("stall", {"text": "slow but in time"}))

            tg.start_soon(stall)
            try:
                await _until(lambda: counter.count("stall") == 1, "the pass-through call is in flight upstream")
                late = await client.call_tool("gated", {"text": "x"}, meta=key_meta("g-1"))
            finally:
                counter.open_gate()  # only now: the pass-through call was in flight all along
        connects = proxy.upstream.connects
        after = await client.call_tool("record", {"text": "after"})
    assert meta_of(late)["mcp-durable/error"]["error"] == "in_doubt"
    [stalled] = other
    assert not stalled.is_error, stalled
    assert not after.is_error, after
    assert connects == proxy.upstream.connects == 1  # one session throughout


async def test_a_pass_through_call_past_the_call_timeout_fails_alone_and_a_concurrent_call_completes(
    tmp_path: Path,
) -> None:
    proxy, counter = _proxy(tmp_path, "[tools.gated]\ntimeout = 600.0\n", call_timeout=1.0)
    other: list[Any] = []
    async with Client(proxy, mode="legacy") as client:
        async with anyio.create_task_group() as tg:

            async def gated() -> None:
                other.append(await client.call_tool("gated", {"text": "x"}, meta=key_meta("g-1")))

            tg.start_soon(gated)
            try:
                await _until(lambda: counter.count("gated") == 1, "the durable call is in flight upstream")
                with pytest.raises(MCPError) as timed_out, anyio.fail_after(WAIT):  # (a bound on a hang)
                    await client.call_tool("stall", {"text": "too slow"})
            finally:
                counter.open_gate()  # (also when the test fails: the upstream's tools then finish)
        after = await client.call_tool("record", {"text": "after"})
    assert timed_out.value.error.code == REQUEST_TIMEOUT, timed_out.value
    [durable] = other
    assert not durable.is_error, durable  # before the fix: in doubt, its session torn down
    assert meta_of(durable)["mcp-durable/key"] == "g-1"
    assert not after.is_error, after
    assert proxy.upstream.connects == 1
