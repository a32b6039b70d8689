"""The servers every case measures: one no-op tool, plain (`MCPServer`) and durable (`DurableServer`).

The tool is `async def noop(n: int) -> str`: the cheapest a tool can be, so the figures show
the framework's own cost and nothing else. The durable tool is registered idempotent with
no key source of its own, so its key is derived from the arguments: a new `n` is a miss (a new
key, the tool runs), the same `n` again is a replay.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from mcp_durable import DurableServer, ToolPolicy

TOOL = "noop"


async def noop(n: int) -> str:
    """Does nothing: returns "ok"."""
    return "ok"


def plain_server() -> MCPServer:
    server = MCPServer("bench-plain")
    server.add_tool(noop, name=TOOL)
    return server


def durable_server(journal: str) -> DurableServer:
    server = DurableServer("bench-durable", journal=journal)
    server.add_tool(noop, name=TOOL, durable=ToolPolicy(idempotent=True))
    return server
