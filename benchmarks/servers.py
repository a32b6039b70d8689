"""The servers every case measures: one no-op tool, plain (`MCPServer`) and durable (`DurableServer`).

The tool is `async def noop(n: int) -> str`: the cheapest a tool can be, so the figures show
the framework's own cost and nothing else. The durable tool is registered idempotent with
`key="derived"` and no key source of its own, so its key is derived from the arguments: a new `n` is a miss (a new
key, the tool runs), the same `n` again is a replay.

Every server logs at WARNING: the SDK's default (INFO, through rich) prints a line per HTTP
session, which costs the measured process CPU and buries the tables.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import CallToolResult, InputRequiredResult

from mcp_durable import DurableServer, ToolPolicy

TOOL = "noop"


async def noop(n: int) -> str:
    """Does nothing: returns "ok"."""
    return "ok"


def plain_server() -> MCPServer:
    server = MCPServer("bench-plain", log_level="WARNING")
    server.add_tool(noop, name=TOOL)
    return server


#: What a replay carries in `_meta` (docs/guarantees.md), with values of the usual size.
REPLAY_META = {
    "mcp-durable/key": "sha256:" + "0" * 64,
    "mcp-durable/replayed": True,
    "mcp-durable/first-completed-at": "2026-11-29T09:00:00.123456Z",
}


class MetaServer(MCPServer):
    """A control: the plain server whose results carry a replay's `_meta`, to show what the
    contract's result metadata alone costs on the wire (both eras), apart from any journal."""

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: Context[Any, Any] | None = None
    ) -> CallToolResult | InputRequiredResult:
        result = await super().call_tool(name, arguments, context)
        if isinstance(result, CallToolResult):
            result = result.model_copy(update={"meta": REPLAY_META})
        return result


def plain_server_with_meta() -> MCPServer:
    server = MetaServer("bench-plain-meta", log_level="WARNING")
    server.add_tool(noop, name=TOOL)
    return server


#: How long the waiting tool of case 2's control asks to sleep: about one journal sync on this
#: machine. The sleep lasts longer: asyncio's selector waits in whole milliseconds (~1.1 ms for a
#: lone call), and with 64 callers the loop serves every ready task before it looks at its timers
#: again (5-14 ms, 10th-90th percentile, measured on 2026-12-02). `SLEPT` records what each sleep
#: lasted, so the control reports it instead of the figure asked for.
WAIT_S = 0.0003
#: Seconds each sleep of `waiting_noop` lasted (cleared by whoever reads it).
SLEPT: list[float] = []


async def waiting_noop(n: int) -> str:
    """Sleeps `WAIT_S` (as a tool doing I/O would), records how long that took, returns "ok"."""
    began = time.perf_counter()
    await anyio.sleep(WAIT_S)
    SLEPT.append(time.perf_counter() - began)
    return "ok"


def plain_waiting_server() -> MCPServer:
    """The plain server with a tool that awaits `WAIT_S` (registered as `TOOL`)."""
    server = MCPServer("bench-plain-waiting", log_level="WARNING")
    server.add_tool(waiting_noop, name=TOOL)
    return server


def durable_waiting_server(journal: str) -> DurableServer:
    """The durable server with the same waiting tool."""
    server = DurableServer("bench-durable-waiting", journal=journal, log_level="WARNING")
    server.add_tool(waiting_noop, name=TOOL, durable=ToolPolicy(idempotent=True, key="derived"))
    return server


def durable_server(journal: str) -> DurableServer:
    server = DurableServer("bench-durable", journal=journal, log_level="WARNING")
    server.add_tool(noop, name=TOOL, durable=ToolPolicy(idempotent=True, key="derived"))
    return server


def task_server(journal: str) -> DurableServer:
    """The durable no-op, callable as an MCP task (`task_support="optional"`)."""
    server = DurableServer("bench-tasks", journal=journal, log_level="WARNING")
    server.add_tool(noop, name=TOOL, durable=ToolPolicy(idempotent=True, key="derived", task_support="optional"))
    return server
