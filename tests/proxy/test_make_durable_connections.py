"""A server made durable with `make_durable` serves its upstream, and runs its background jobs,
while any in-memory connection is open, whichever leaves first; the last one to leave stops both.

The plain upstream (a real `MCPServer`, connected in process) records when its own lifespan is
entered and left, so the test sees the upstream session start and end. Before the fix the first
connection's exit waited for the last one (an in-memory 2026-07-28 client could not close), and
a 2025-11-25 one was cut off after the transport's grace period, taking the upstream with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from mcp_durable import CallIdentity
from mcp_durable.operations.retention import RetentionSchedule
from mcp_durable.policy_file import parse_policies
from mcp_durable.proxy import ProxyServer, make_durable
from tests.helpers import meta_of
from tests.server.connections import two_connections

INTERVAL = 0.05
POLICIES = """
[tools.job]
key = "fields"
key_fields = ["job"]
retention = 0.3
"""


def make(tmp_path: Path, lifespans: list[str]) -> ProxyServer:
    @asynccontextmanager
    async def recorded(app: MCPServer[Any]) -> AsyncIterator[dict[str, Any]]:
        lifespans.append("entered")
        try:
            yield {}
        finally:
            lifespans.append("left")

    upstream: MCPServer[Any] = MCPServer("plain", lifespan=recorded)

    @upstream.tool(annotations=ToolAnnotations(idempotent_hint=True))
    def job(job: str) -> dict[str, Any]:
        return {"job": job}

    return make_durable(
        upstream,
        parse_policies(POLICIES),
        journal=f"sqlite:///{tmp_path}/journal.db",
        retention_schedule=RetentionSchedule(interval=INTERVAL, compact_garbage_ratio=None),
    )


async def purged(proxy: ProxyServer, key: str) -> None:
    with anyio.fail_after(10):  # a bound on a hang: without a retention pass it never goes
        while await proxy.journal.get(CallIdentity("local", "job", key)) is not None:
            await anyio.sleep(INTERVAL)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_the_upstream_and_retention_outlive_the_first_connection_and_stop_with_the_last(
    tmp_path: Path, mode: str
) -> None:
    lifespans: list[str] = []
    proxy = make(tmp_path, lifespans)
    retention = proxy.face.retention
    assert retention is not None
    async with two_connections(proxy, mode) as (first, last):
        await first.close()  # before the fix: waited for the last connection to close
        done = await last.client.call_tool("job", {"job": "J-1"})
        assert not done.is_error and meta_of(done)["mcp-durable/key"] == "J-1"
        await purged(proxy, "J-1")
        assert lifespans == ["entered"]  # one upstream session, still open
        await last.close()
        passes = retention.report.passes
        await anyio.sleep(10 * INTERVAL)  # room for passes that should no longer run
    assert lifespans == ["entered", "left"]  # the last connection's exit closed the upstream session
    assert retention.report.passes == passes
