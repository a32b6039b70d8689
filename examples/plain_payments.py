"""The same refund tool on a plain `MCPServer`: no journal, no key — the baseline crash_demo compares against.

    mcp-durable serve examples/plain_payments.py

`refund(order_id, amount_cents)` moves money through the same stand-in provider as
tools/payments.py (`$PAYMENTS_LEDGER`), but passes no idempotency key: a client that retries a
refund whose answer it never got (the server died) refunds again. `idempotentHint` is a hint.
"""

from __future__ import annotations

from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from mcp_durable.demo.ledger import PaymentProvider

server = MCPServer("payments-plain", instructions="Refunds on a plain MCP server (no idempotency).")
provider = PaymentProvider()


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund `amount_cents` on order `order_id` (the hint says idempotent; nothing enforces it)."""
    return provider.refund(order_id, amount_cents).as_dict()


if __name__ == "__main__":
    server.run()
