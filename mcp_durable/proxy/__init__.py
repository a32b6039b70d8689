"""`mcp-durable proxy`: durability for an MCP server you did not write, in any language.

    proxy = ProxyServer(UpstreamSpec(command=["npx", "-y", "@modelcontextprotocol/server-memory"]),
                        load_policies("policies.toml"), journal="sqlite:///proxy.db")
    proxy.run()                                    # or proxy.streamable_http_app(...)

`make_durable(server, policies)` is the same for a plain `MCPServer` object in this process.
Modules: `upstream.py` (the sessions with the upstream, one per set of client capabilities,
reconnected when they die), `router.py` (the capability sets; upstream requests and logs to the
calling client), `subscriptions.py` (resource subscriptions and list changes relayed),
`server.py` (`ProxyServer`), `inprocess.py` (`make_durable`).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .inprocess import make_durable
    from .server import ProxyServer
    from .upstream import UpstreamSpec


def __getattr__(name: str) -> object:
    # Loaded on first use: `mcp-durable --help` and the journal commands import this package's
    # cli module without paying for the MCP SDK.
    if name == "make_durable":
        from .inprocess import make_durable

        return make_durable
    if name == "ProxyServer":
        from .server import ProxyServer

        return ProxyServer
    if name == "UpstreamSpec":
        from .upstream import UpstreamSpec

        return UpstreamSpec
    raise AttributeError(f"module 'mcp_durable.proxy' has no attribute {name!r}")


__all__ = ["ProxyServer", "UpstreamSpec", "make_durable"]
