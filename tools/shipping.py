"""Shipping over MCP: `ship_order` in three durable steps — reserve stock, buy a label, notify.

Serve it with `mcp-durable serve tools/shipping.py`. Each step is journaled when it completes
(`current_call().step(...)`), so a crash between steps resumes at the first unfinished step on
the retry: stock is not reserved again, no second label is bought. A crash *inside* a step
(its effect made, its journal entry not yet written) re-runs only that step, and the warehouse
(`mcp_durable.demo.warehouse`, `$WAREHOUSE_DB`) deduplicates it by the step's key.

The call is keyed by `order_id`: shipping one order twice ships it once.
"""

from __future__ import annotations

from typing import Any

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable.demo.warehouse import Warehouse

warehouse = Warehouse()

server = DurableServer("shipping", instructions="Ship an order once, resuming after a crash where it stopped.")


@server.tool(durable=ToolPolicy(key_fields=("order_id",), in_doubt="retry"))
async def ship_order(order_id: str, sku: str = "SKU-1") -> dict[str, Any]:
    """Reserve one unit of `sku`, buy a shipping label and notify the customer, once per order."""
    call = current_call()
    reservation = await call.step(
        "reserve stock", warehouse.reserve, order_id, sku, key=call.step_key("reserve stock")
    )
    tracking = await call.step("buy label", warehouse.buy_label, order_id, key=call.step_key("buy label"))
    notification = await call.step(
        "notify", warehouse.notify, order_id, tracking, key=call.step_key("notify")
    )
    return {"order_id": order_id, "reservation": reservation, "tracking": tracking, "notification": notification}


if __name__ == "__main__":
    server.run()
