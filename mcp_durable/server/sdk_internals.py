"""Every use of an internal of the MCP SDK, in one module.

The rest of the package meets the SDK through its public API only (`MCPServer`'s methods,
`Tool.fn_metadata`, `Context`, the low-level `Server`'s handler registry once reached, the
`Extension` API). What that API does not offer is reached here, each through one function, and
`INTERNALS` names every internal with the reason it is used. `tests/unit/test_sdk_internals.py`
fails, naming the internal, when an SDK release renames or removes one of them, and fails when
any other module of the package uses an SDK or asyncio private name. `mcp>=2.3,<3` does not
protect these: that test is what does.

Nothing here reads asyncio's private state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

# The proxy's HTTP upstream client with the SDK's own defaults (timeouts, redirects) that its
# streamable HTTP client expects; the SDK has no public factory for it.
from mcp.shared._httpx_utils import create_mcp_http_client

if TYPE_CHECKING:
    from mcp.client.session import ClientSession
    from mcp.server.lowlevel import Server
    from mcp.server.mcpserver import Context, MCPServer
    from mcp.server.mcpserver.tools import Tool
    from mcp.server.session import ServerSession
    from mcp.server.subscriptions import SubscriptionBus

__all__ = [
    "INTERNALS",
    "bare_tools_call_handler",
    "connection_of",
    "create_mcp_http_client",
    "lowlevel_server",
    "registered_tool",
    "request_meta",
    "send_raw_request",
    "subscription_bus",
]

#: Each SDK internal used, with why no public seam serves (checked by tests/unit/test_sdk_internals.py).
INTERNALS: Mapping[str, str] = {
    "MCPServer._tool_manager": (
        "the registered `Tool` (its `fn_metadata`: the argument model the face validates with before "
        "the claim, the result conversion a reconcile hook's value goes through); `MCPServer` lists "
        "tools only as wire descriptions"
    ),
    "MCPServer._lowlevel_server": (
        "the low-level `Server`, to register request handlers `MCPServer` has no API for: "
        "`resources/subscribe`/`unsubscribe` scoped by principal, `subscriptions/listen`, the "
        "`resources/read` wrapper that tells a resource who reads it, the `tools/call` handler below"
    ),
    "MCPServer._subscriptions": (
        "the server's `SubscriptionBus`, which journal change notifications are published on and "
        "a background task's `Context` is built with (the SDK builds its own the same way)"
    ),
    "MCPServer._handle_call_tool": (
        "the `tools/call` handler without the extensions' interceptor chain, for calls the tasks "
        "interceptor would pass straight on (server/tasks.py `skip_idle_interceptor`): the chain "
        "is three coroutine layers on every call"
    ),
    "Context._request_context (read through __pydantic_private__)": (
        "the request's `_meta` (where the idempotency key is) on every durable call: the public "
        "`Context.request_context` goes through pydantic's `__getattr__` for private attributes; "
        "the public property is the fallback when the storage is not there"
    ),
    "ServerSession._connection": (
        "which client connection a request came on, so a `resources/subscribe` made on one request "
        "keeps its updates flowing on that connection after the request ended; the session object "
        "is built per request and has no public connection identity"
    ),
    "ClientSession._dispatcher": (
        "a 2025-11-25 task-augmented `tools/call` sent upstream by the proxy (proxy/upstream_tasks.py): "
        "`ClientSession.send_request` validates every `tools/call` answer as a `CallToolResult`, and "
        "the answer is a `CreateTaskResult`; the SDK client has no tasks API for that era"
    ),
    "mcp.shared._httpx_utils.create_mcp_http_client": (
        "the proxy's HTTP client for a streamable HTTP upstream, with the SDK's own defaults"
    ),
}


def registered_tool(server: MCPServer[Any], name: str) -> Tool | None:
    """The SDK's `Tool` registered under `name` (None: no such tool)."""
    return server._tool_manager.get_tool(name)


def lowlevel_server(server: MCPServer[Any]) -> Server[Any]:
    """The low-level `Server` under `server` (its request-handler registry)."""
    return server._lowlevel_server


def subscription_bus(server: MCPServer[Any]) -> SubscriptionBus:
    """The `SubscriptionBus` `server` publishes resource updates on."""
    return server._subscriptions


def bare_tools_call_handler(server: MCPServer[Any]) -> Callable[..., Awaitable[Any]]:
    """`server`'s own `tools/call` handler, outside the extensions' interceptors."""
    return server._handle_call_tool


def request_meta(context: Context[Any, Any]) -> Any:
    """The `_meta` of the request `context` serves; raises as `Context.request_context` does
    (`ValueError` outside a request)."""
    private = context.__pydantic_private__
    request = private.get("_request_context") if private else None
    return (request if request is not None else context.request_context).meta


def connection_of(session: ServerSession) -> object:
    """An object that identifies the client connection `session` belongs to (the session itself
    when the SDK's connection is not there)."""
    return getattr(session, "_connection", session)


async def send_raw_request(session: ClientSession, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send `method` with `params` on a client `session` and return the answer unvalidated
    (raises `MCPError` on an error answer, as `send_request` does)."""
    answered: dict[str, Any] = await session._dispatcher.send_raw_request(method, params, None)
    return answered
