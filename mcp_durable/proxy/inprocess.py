"""`make_durable(server, policies)`: a plain `MCPServer` object made durable without rewriting it.

The plain server becomes the upstream of a `ProxyServer` connected in process (the SDK's
in-memory transport, 2025-11-25 era so sampling and elicitation still reach the client): its
tools, resources, prompts and completions are served unchanged, its durable tools (by the
policies, else by their own `idempotentHint`) go through the engine, and it gains the journal
resources. Only the SDK's public `Client(server)` touches the plain server, so nothing private
of it is read or patched. A tool reads its key (the scoped key) from its request's `_meta`:
`ctx.request_context.meta["mcp-durable/idempotency-key"]`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..policy_file import Policies, load_policies
from .server import ProxyServer
from .upstream import UpstreamSpec


def make_durable(server: Any, policies: Policies | str | Path | None = None, **kwargs: Any) -> ProxyServer:
    """Serve the plain `MCPServer` `server` with durable tools by `policies` (a `Policies`, a
    TOML file path, or None for the tools' own annotations). `kwargs` are `DurableServer`'s options
    (`journal=`, `tokens=`, …). Returns the server to run in its place."""
    if policies is not None and not isinstance(policies, Policies):
        policies = load_policies(policies)
    name = kwargs.pop("name", None) or getattr(server, "name", None)
    return ProxyServer(UpstreamSpec(server=server), policies, name=name, **kwargs)
