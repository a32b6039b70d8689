"""An upstream answering a durable `tools/call` with a JSON-RPC error never leaves the proxy's
record PENDING: the error is taken like a Python tool raising `MCPError`, by the tool's
`exceptions` policy.

- `persist`: kept as an `isError` result (the upstream's message as text, its code in
  `_meta["mcp-durable/jsonrpc-error"]`) and replayed: the upstream is not asked again;
- `release` (the default): the caller gets the upstream's error as sent, the record is
  released, and a retry is forwarded again.

The upstream is a real MCP server, reached in process (`make_durable`, the SDK's in-memory
transport) and over streamable HTTP (uvicorn); the caller speaks both protocol eras.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from mcp_durable import CallIdentity, CallState
from mcp_durable.policy_file import parse_policies
from mcp_durable.proxy import ProxyServer, make_durable
from mcp_durable.proxy.upstream import UpstreamSpec
from tests.helpers import body_bytes, first_text, meta_of, serve_app

DECLINED = 4001  # an application-defined JSON-RPC error code (outside -32768…-32000, which JSON-RPC reserves)
POLICIES = """
[tools.kept]
key = "fields"
key_fields = ["order_id"]
exceptions = "persist"

[tools.released]
key = "fields"
key_fields = ["order_id"]
"""


def make_upstream(runs: Counter[str]) -> MCPServer[Any]:
    """A plain MCP server (no mcp-durable in it) whose tools answer a JSON-RPC error."""
    upstream: MCPServer[Any] = MCPServer("declining-upstream")
    hint = ToolAnnotations(idempotent_hint=True)

    @upstream.tool(annotations=hint)
    def kept(order_id: str) -> dict[str, Any]:
        runs["kept"] += 1
        raise MCPError(code=DECLINED, message=f"provider declined {order_id}", data={"order_id": order_id})

    @upstream.tool(annotations=hint)
    def released(order_id: str) -> dict[str, Any]:
        runs["released"] += 1
        raise MCPError(code=DECLINED, message=f"provider declined {order_id}")

    return upstream


@asynccontextmanager
async def proxied(where: str, journal: str, runs: Counter[str]) -> AsyncIterator[ProxyServer]:
    """The proxy in front of the declining upstream, reached `where` ("memory" or "http")."""
    upstream = make_upstream(runs)
    policies = parse_policies(POLICIES)
    if where == "memory":
        yield make_durable(upstream, policies, journal=journal)
        return
    async with serve_app(upstream.streamable_http_app(streamable_http_path="/mcp")) as base:
        yield ProxyServer(UpstreamSpec(url=f"{base}/mcp", connect_timeout=10), policies, journal=journal)


async def state_of(proxy: ProxyServer, tool: str, key: str) -> CallState:
    record = await proxy.journal.get(CallIdentity("local", tool, key))
    assert record is not None
    return CallState(record.state)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("where", ["memory", "http"])
async def test_an_upstream_jsonrpc_error_is_kept_under_persist_and_released_under_release(
    tmp_path: Path, where: str, mode: str
) -> None:
    runs: Counter[str] = Counter()
    async with proxied(where, f"sqlite:///{tmp_path}/proxy.db", runs) as proxy:
        async with Client(proxy, mode=mode) as client:
            first = await client.call_tool("kept", {"order_id": "O-1"})
            again = await client.call_tool("kept", {"order_id": "O-1"})
            kept = await state_of(proxy, "kept", "O-1")
            with pytest.raises(MCPError) as refused:
                await client.call_tool("released", {"order_id": "O-2"})
            released = await state_of(proxy, "released", "O-2")
            with pytest.raises(MCPError) as retried:
                await client.call_tool("released", {"order_id": "O-2"})
    assert first.is_error and first_text(first) == "provider declined O-1"
    assert meta_of(first)["mcp-durable/jsonrpc-error"] == {
        "code": DECLINED,
        "message": "provider declined O-1",
        "data": {"order_id": "O-1"},
    }
    assert kept == CallState.FAILED  # before the fix: PENDING, with no call outstanding upstream
    assert meta_of(again)["mcp-durable/replayed"] is True and body_bytes(again) == body_bytes(first)
    assert runs["kept"] == 1  # the repeat was answered from the journal
    assert refused.value.error.code == DECLINED and refused.value.error.message == "provider declined O-2"
    assert released == CallState.RELEASED
    assert retried.value.error.code == DECLINED and runs["released"] == 2  # the retry was forwarded again
