"""The journal answers while the upstream is down: a repeat of a key whose result is journaled is
replayed without the upstream; only a miss needs it (and is refused `upstream_unavailable`,
journaling nothing).

The upstream is the plain Python upstream over HTTP (a real subprocess, SIGKILLed); the proxy
runs in process behind a real client.
"""

from __future__ import annotations

from pathlib import Path

import anyio
from mcp import Client

from mcp_durable.journal import CallQuery, CallState, create_journal
from mcp_durable.proxy import ProxyServer, UpstreamSpec
from mcp_durable.proxy.upstream import QUIET_BEFORE_PING
from tests.helpers import key_meta, meta_of, wire
from tests.proxy.upstreams import plain_http_upstream, upstream_env
from tests.server.servers.counting import Counter


async def _states(url: str) -> list[CallState]:
    journal = create_journal(url)
    await journal.open()
    try:
        return sorted(record.state for record in await journal.list_calls(CallQuery(limit=100)))
    finally:
        await journal.aclose()


async def test_a_journaled_result_is_replayed_while_the_upstream_is_down(tmp_path: Path) -> None:
    env = upstream_env(tmp_path)
    counter = Counter(env["COUNTER_FILE"])
    journal = f"sqlite:///{tmp_path}/proxy.db"
    async with plain_http_upstream(env) as upstream:
        proxy = ProxyServer(UpstreamSpec(url=upstream.url, connect_timeout=10), journal=journal)
        async with Client(proxy, mode="legacy") as client:
            first = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
            upstream.kill()
            # Quiet for longer than QUIET_BEFORE_PING, so the proxy checks the session before the
            # next durable call and finds it dead (an ordering, not a timed assertion).
            await anyio.sleep(QUIET_BEFORE_PING + 0.2)
            replayed = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
            # The dead session is dropped now: the journal is asked before any connect attempt.
            again = await client.call_tool("record", {"text": "a"}, meta=key_meta("k-1"))
            miss = await client.call_tool("record", {"text": "b"}, meta=key_meta("k-2"))
    assert not first.is_error, first
    for repeat in (replayed, again):
        assert not repeat.is_error, repeat  # before the fix: upstream_unavailable
        assert meta_of(repeat)["mcp-durable/replayed"] is True
        assert wire(repeat)["structuredContent"] == wire(first)["structuredContent"]
    assert meta_of(miss)["mcp-durable/error"]["error"] == "upstream_unavailable"
    assert counter.count("record") == 1
    assert await _states(journal) == [CallState.COMPLETED]  # the refused miss journaled nothing
