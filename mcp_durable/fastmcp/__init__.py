"""mcp-durable for FastMCP 4 servers, in process (`pip install 'mcp-durable[fastmcp]'`).

    from fastmcp import FastMCP
    from mcp_durable import ToolPolicy
    from mcp_durable.fastmcp import make_durable

    app = FastMCP("payments")
    ...
    make_durable(app, journal="sqlite:///payments.db", policies={"refund": ToolPolicy(key_fields=("order_id",))})

Modules: `middleware.py` (`make_durable`, `DurableMiddleware`: the call through the engine, the
engine's lifespan), `calls.py` (arguments, results, errors and principals of one call),
`order.py` (the start-up check of caching and retry middleware), `tasks.py` (durable MCP tasks,
both generations, through FastMCP's tasks-extension seam), `internals.py` (every read of a
FastMCP internal). docs/fastmcp.md says what is covered and what is not yet.
"""

try:
    import fastmcp as _fastmcp  # noqa: F401 - only to say what is missing
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError("mcp_durable.fastmcp needs FastMCP 4: pip install 'mcp-durable[fastmcp]'") from exc

from .middleware import DurableMiddleware, EngineLifespan, make_durable
from .tasks import DurableTasks, asks_first

__all__ = ["DurableMiddleware", "DurableTasks", "EngineLifespan", "asks_first", "make_durable"]
