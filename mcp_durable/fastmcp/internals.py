"""Every read of a FastMCP internal, in one module, each with why no public seam serves.

The rest of `mcp_durable.fastmcp` meets FastMCP through its public API only (`Middleware`,
`Provider.lifespan`, `FastMCP.get_tool` / `list_tools` / `middleware` / `add_provider`,
`ToolResult`, `get_access_token`). `tests/fastmcp/test_internals.py` fails, naming the internal,
when a FastMCP release renames or removes one of these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastmcp import FastMCP
from fastmcp.server.low_level import LowLevelServer
from fastmcp.server.middleware.caching import ResponseCachingMiddleware

__all__ = ["INTERNALS", "caches_tool_call", "low_level_server"]

#: Each FastMCP internal read, with why no public seam serves.
INTERNALS: Mapping[str, str] = {
    "ResponseCachingMiddleware._call_tool_settings": (
        "which tools its `tools/call` cache covers (`enabled`, `included_tools`, `excluded_tools`), "
        "so the start-up check warns only about durable tools it really caches; the middleware "
        "keeps its settings and has no public reader"
    ),
    "FastMCP._mcp_server": (
        "the SDK low-level server under FastMCP, whose `middleware` list takes the durable tasks' "
        'SDK middleware (tasks.py): a 2025-11-25 task-creating `tools/call` is answered `{"task": …}`, '
        "which a handler cannot return (the SDK validates it as a `CallToolResult`), and "
        "`initialize` gets `capabilities.tasks`; FastMCP's `Middleware` sees neither raw answer"
    ),
}


def caches_tool_call(cache: ResponseCachingMiddleware, tool: str) -> bool:
    """Whether `cache` answers `tools/call` of `tool` from its cache (its own rule,
    `_matches_tool_cache_settings`). True when its settings cannot be read: assume the default,
    every tool cached."""
    settings: Mapping[str, Any] = getattr(cache, "_call_tool_settings", None) or {}
    if settings.get("enabled") is False:
        return False
    included = settings.get("included_tools")
    if included and tool not in included:
        return False
    excluded = settings.get("excluded_tools")
    return not (excluded and tool in excluded)


def low_level_server(app: FastMCP[Any]) -> LowLevelServer[Any]:
    """The SDK low-level server FastMCP serves `app` with (its `_mcp_server`)."""
    server: LowLevelServer[Any] = app._mcp_server
    return server
