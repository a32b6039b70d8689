"""`mcp-durable proxy`: durability for an MCP server you did not write, in any language.

    proxy = ProxyServer(UpstreamSpec(command=["npx", "-y", "@modelcontextprotocol/server-memory"]),
                        load_policies("policies.toml"), journal="sqlite:///proxy.db")
    proxy.run()                                    # or proxy.streamable_http_app(...)

`make_durable(server, policies)` is the same for a plain `MCPServer` object in this process.
Modules: `upstream.py` (the one session with the upstream, reconnected when it dies),
`router.py` (upstream requests and logs to the calling client), `server.py` (`ProxyServer`),
`inprocess.py` (`make_durable`).
"""

from .inprocess import make_durable
from .server import ProxyServer
from .upstream import UpstreamSpec

__all__ = ["ProxyServer", "UpstreamSpec", "make_durable"]
