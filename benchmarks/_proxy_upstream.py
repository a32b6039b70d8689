"""The upstream of the proxy case: a plain `MCPServer` over stdio with the benchmark's no-op tool.

`noop` is annotated `idempotentHint: true` (durable behind the proxy, keyed by `n` under the case's
policy `key = "derived"`);
`noop_pass` carries no hint (passed through). Run as `python -m benchmarks._proxy_upstream`.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from .servers import TOOL, noop

PASS_TOOL = "noop_pass"


def upstream_server() -> MCPServer:
    server = MCPServer("bench-upstream", log_level="WARNING")
    server.add_tool(noop, name=TOOL, annotations=ToolAnnotations(idempotent_hint=True))
    server.add_tool(noop, name=PASS_TOOL)
    return server


if __name__ == "__main__":
    upstream_server().run()
