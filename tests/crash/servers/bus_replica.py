"""A test target for cross-replica notifications: a `DurableServer` on a `PgSubscriptionBus`.

Serve it with `MCP_DURABLE_JOURNAL=postgresql://…?schema=… mcp-durable serve
tests/crash/servers/bus_replica.py --transport http`; the server and the bus use that database
and schema (`serve --journal` hands its URL to the server only, not to the environment). The server's journal
notifier forwards every change of a call record on the bus, scoped to the record's principal,
so clients listening on any replica hear of it.
"""

from __future__ import annotations

import os
from typing import Any

from mcp_durable import DurableServer, ToolPolicy
from mcp_durable.server.pgbus import PgSubscriptionBus

bus = PgSubscriptionBus(os.environ["MCP_DURABLE_JOURNAL"])
server = DurableServer("bus-replica", subscriptions=bus, lifespan=bus.lifespan)


@server.tool(durable=ToolPolicy(key="required"))
async def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Pretend to refund; the point is the notification of its completion."""
    return {"order_id": order_id, "refunded_cents": amount_cents, "replica": os.getpid()}
