"""A test target with `journal_lookup` on: a refund tool whose results carry a fresh run id.

`mcp-durable serve tests/server/servers/lookup.py:make_server` (bearer tokens from `$MCP_DURABLE_TOKENS`).
"""

from __future__ import annotations

import uuid
from typing import Any

from mcp_durable import DurableServer, ToolPolicy, current_call


def make_server(journal: str | None = None) -> DurableServer:
    server = DurableServer("lookup", journal=journal, lookup_tool=True)

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), sensitive=("card",)))
    def refund(order_id: str, amount_cents: int, card: str = "") -> dict[str, Any]:
        return {
            "order_id": order_id,
            "amount_cents": amount_cents,
            "principal": current_call().identity.principal,
            "run": uuid.uuid4().hex,
            "card": card,
        }

    return server
