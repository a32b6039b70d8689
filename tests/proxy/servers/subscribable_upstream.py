"""A low-level MCP server (no mcp-durable in it) that serves resource subscriptions and changes
its tool list, as the proxy's upstream over stdio: `python tests/proxy/servers/subscribable_upstream.py`.

It declares `resources.subscribe` and `tools.listChanged` and keeps, per process, the URIs its one
session (the proxy's) is subscribed to.

- resources `note://a`, `note://b` (text).
- `touch(uri)`: sends `notifications/resources/updated` for `uri` if it is subscribed to, before
  it answers; returns `{"sent": bool}`.
- `subscriptions()`: `{"uris": [...]}`, the URIs subscribed to now, sorted.
- `pid()`: `{"pid": ...}`, this process's id.
- `grow()`: adds the tool `extra` and sends `notifications/tools/list_changed` before it answers.
- `extra()` (after `grow`): `idempotentHint: true`; returns a new `run` id each time it runs.

`SUBSCRIBABLE_SLOW_LIST_S` (seconds, default 0): how long `tools/list` takes to answer after
`grow`, so a test can act while a listing of the changed tools is under way.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import anyio
from mcp.server import NotificationOptions, Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp_types import (
    CallToolRequestParams,
    CallToolResult,
    EmptyResult,
    ListResourcesResult,
    ListToolsResult,
    PaginatedRequestParams,
    ReadResourceRequestParams,
    ReadResourceResult,
    Resource,
    SubscribeRequestParams,
    TextContent,
    TextResourceContents,
    Tool,
    ToolAnnotations,
    UnsubscribeRequestParams,
)

NOTES = {"note://a": "note a", "note://b": "note b"}
SUBSCRIBED: set[str] = set()
GROWN: list[bool] = []

_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
TOOLS = [
    Tool(
        name="touch",
        description="Announce an update of a resource to its subscriber.",
        input_schema={"type": "object", "properties": {"uri": {"type": "string"}}, "required": ["uri"]},
    ),
    Tool(name="subscriptions", description="The URIs subscribed to now.", input_schema=_NO_ARGUMENTS),
    Tool(name="pid", description="This process's id.", input_schema=_NO_ARGUMENTS),
    Tool(name="grow", description="Add the tool `extra` and announce the change.", input_schema=_NO_ARGUMENTS),
]
EXTRA = Tool(
    name="extra",
    description="A tool that exists after `grow`.",
    input_schema=_NO_ARGUMENTS,
    annotations=ToolAnnotations(idempotent_hint=True, read_only_hint=False),
)


def _answer(value: dict[str, Any]) -> CallToolResult:
    return CallToolResult(content=[TextContent(type="text", text=str(value))], structured_content=value)


async def list_tools(ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None) -> ListToolsResult:
    if GROWN:
        await anyio.sleep(float(os.environ.get("SUBSCRIBABLE_SLOW_LIST_S", "0")))
    return ListToolsResult(tools=TOOLS + ([EXTRA] if GROWN else []))


async def call_tool(ctx: ServerRequestContext[Any], params: CallToolRequestParams) -> CallToolResult:
    arguments = params.arguments or {}
    if params.name == "touch":
        uri = str(arguments["uri"])
        sent = uri in SUBSCRIBED
        if sent:
            await ctx.session.send_resource_updated(uri)
        return _answer({"sent": sent})
    if params.name == "subscriptions":
        return _answer({"uris": sorted(SUBSCRIBED)})
    if params.name == "pid":
        return _answer({"pid": os.getpid()})
    if params.name == "grow":
        GROWN.append(True)
        await ctx.session.send_tool_list_changed()
        return _answer({"tools": len(TOOLS) + 1})
    if params.name == "extra" and GROWN:
        return _answer({"run": uuid.uuid4().hex})
    return CallToolResult(content=[TextContent(type="text", text=f"no tool {params.name}")], is_error=True)


async def list_resources(ctx: ServerRequestContext[Any], params: PaginatedRequestParams | None) -> ListResourcesResult:
    return ListResourcesResult(resources=[Resource(uri=uri, name=uri, mime_type="text/plain") for uri in NOTES])


async def read_resource(ctx: ServerRequestContext[Any], params: ReadResourceRequestParams) -> ReadResourceResult:
    uri = str(params.uri)
    return ReadResourceResult(contents=[TextResourceContents(uri=uri, text=NOTES[uri], mime_type="text/plain")])


async def subscribe(ctx: ServerRequestContext[Any], params: SubscribeRequestParams) -> EmptyResult:
    SUBSCRIBED.add(str(params.uri))
    return EmptyResult()


async def unsubscribe(ctx: ServerRequestContext[Any], params: UnsubscribeRequestParams) -> EmptyResult:
    SUBSCRIBED.discard(str(params.uri))
    return EmptyResult()


server: Server[Any] = Server(
    "subscribable-upstream",
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_read_resource=read_resource,
    on_subscribe_resource=subscribe,
    on_unsubscribe_resource=unsubscribe,
)


async def main() -> None:
    async with stdio_server() as (read, write):
        await server.run(read, write, server.create_initialization_options(NotificationOptions(tools_changed=True)))


if __name__ == "__main__":
    anyio.run(main)
