"""The start-up check of FastMCP middleware that would undo a durable tool's guarantee.

FastMCP runs its middleware list outside in: `app.middleware[0]` sees a call first, and each
one's `call_next` is the rest of the list. Two of FastMCP's own middleware interfere with the
journal:

- `ResponseCachingMiddleware` answers `tools/call` from a cache keyed by tool, arguments and
  token, not by idempotency key. Before the durable middleware, a call with a new key and the
  same arguments gets the old answer (the old key's `_meta`) and nothing runs or is journaled;
  after it, the new key's run is answered from the cache and that old answer journaled under
  the new key. In either order an intended second effect never happens. Safe: leave durable
  tools out of its tool-call cache (`call_tool_settings={"excluded_tools": [...]}`).
- `RetryMiddleware` runs a call again after a `ConnectionError` or `TimeoutError` (by
  default). After the durable middleware, its retries run the tool again inside one durable
  run, whatever the tool's policy (`exceptions="persist"` cannot stop them). Safe: before it
  (added first), where each retry is a repeat of the key that the policy decides, as a client's
  retry would be.

`problems` says which of these a server's middleware list has; the durable middleware logs each
as a warning when the server starts.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from fastmcp.server.middleware import Middleware
from fastmcp.server.middleware.caching import ResponseCachingMiddleware
from fastmcp.server.middleware.error_handling import RetryMiddleware

from .internals import caches_tool_call


def problems(middleware: Sequence[Middleware], durable: Middleware, tools: Collection[str]) -> list[str]:
    """What in `middleware` (a server's list, outermost first, `durable` among it) would undo the
    guarantee of the durable `tools`, each with the safe order; empty when nothing would."""
    if durable not in middleware:
        return []
    position = middleware.index(durable)
    found: list[str] = []
    for index, other in enumerate(middleware):
        if isinstance(other, ResponseCachingMiddleware):
            cached = sorted(tool for tool in tools if caches_tool_call(other, tool))
            if cached:
                found.append(_caching(cached, before=index < position))
        elif isinstance(other, RetryMiddleware) and index > position and tools:
            found.append(_retrying(sorted(tools)))
    return found


def _caching(cached: list[str], *, before: bool) -> str:
    what = (
        "before the durable middleware, a call with a new idempotency key and the same arguments is "
        "answered from its cache with the old key's answer, and the tool does not run"
        if before
        else "after the durable middleware, a new idempotency key's run is answered from its cache and "
        "that old answer is journaled under the new key; the tool does not run"
    )
    return (
        f"ResponseCachingMiddleware caches tools/call of the durable tools {', '.join(cached)}: {what}. "
        "Safe: leave them out of its tool-call cache, ResponseCachingMiddleware(call_tool_settings="
        f"{{'excluded_tools': {cached!r}}}) (docs/fastmcp.md)"
    )


def _retrying(tools: list[str]) -> str:
    return (
        f"RetryMiddleware is after the durable middleware: a retried call of the durable tools "
        f"{', '.join(tools)} runs the tool again inside one durable run, whatever its policy. Safe: add "
        "RetryMiddleware before make_durable(...), so each retry is a repeat of the key that the tool's "
        "policy decides (docs/fastmcp.md)"
    )
