"""Payments over MCP: `refund` and `charge`, each run once per key.

Serve it with `mcp-durable serve tools/payments.py` (stdio) or `--transport http`. The money
moves in a local stand-in for a payment provider (`mcp_durable.demo.ledger`, a SQLite ledger at
`$PAYMENTS_LEDGER`) that honours idempotency keys like Stripe. Each tool passes its durable key
downstream, so even a crash between the refund and the journal write (the danger window) is
deduplicated by the provider when the call is retried with the same key.
"""

from __future__ import annotations

from typing import Any

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable.demo.ledger import PaymentProvider

server = DurableServer("payments", instructions="Refunds and charges that run once per idempotency key.")
provider = PaymentProvider()


@server.tool(durable=ToolPolicy(key_fields=("order_id",), in_doubt="retry"))
def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund `amount_cents` on order `order_id`. A repeat with the same key returns the first refund."""
    effect = provider.refund(order_id, amount_cents, idempotency_key=current_call().scoped_key)
    return effect.as_dict()


@server.tool(durable=ToolPolicy(key="required", in_doubt="retry"))
def charge(customer_id: str, amount_cents: int) -> dict[str, Any]:
    """Charge `customer_id`. Requires an idempotency key in _meta['mcp-durable/idempotency-key']."""
    effect = provider.charge(customer_id, amount_cents, idempotency_key=current_call().scoped_key)
    return effect.as_dict()


if __name__ == "__main__":
    server.run()
