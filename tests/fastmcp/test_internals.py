"""The FastMCP internals `mcp_durable/fastmcp/internals.py` reads are still there and still mean
what it reads them as: this fails, naming the internal, when a FastMCP release changes one."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fastmcp.servers import FastMCP  # noqa: F401 - skips (or fails under CI) without FastMCP


@pytest.mark.parametrize(
    ("settings", "cached"),
    [
        (None, {"a": True, "b": True}),
        ({"enabled": False}, {"a": False, "b": False}),
        ({"excluded_tools": ["a"]}, {"a": False, "b": True}),
        ({"included_tools": ["a"]}, {"a": True, "b": False}),
    ],
)
def test_which_tool_calls_response_caching_covers(settings: Any, cached: dict[str, bool]) -> None:
    from fastmcp.server.middleware.caching import ResponseCachingMiddleware

    from mcp_durable.fastmcp.internals import INTERNALS, caches_tool_call

    assert "ResponseCachingMiddleware._call_tool_settings" in INTERNALS
    cache = ResponseCachingMiddleware(call_tool_settings=settings)
    assert hasattr(cache, "_call_tool_settings"), (
        "FastMCP's ResponseCachingMiddleware._call_tool_settings is gone: see mcp_durable/fastmcp/internals.py"
    )
    assert {tool: caches_tool_call(cache, tool) for tool in cached} == cached
