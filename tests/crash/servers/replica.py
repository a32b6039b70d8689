"""A test target for replica tests: refunds through a payment provider that honours keys.

Serve it with `mcp-durable serve tests/crash/servers/replica.py --transport http --journal
postgresql://…`; the provider's ledger is `$PAYMENTS_LEDGER` (a SQLite file the test reads, so
every money movement is counted outside the servers, across SIGKILLs).

- `refund`: the effect, at once. Key required.
- `slow_refund` / `slow_refund_refused`: the effect first, then `$SLOW_TOOL_SECONDS` (default 3)
  of sleep before returning, i.e. a long danger window: a SIGKILL in it leaves an effect made
  and no result journaled. Lease 1 s (renewed while the tool runs), so another replica takes
  over soon after a death; the in-doubt policy is `retry` resp. `refuse`.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import anyio.to_thread

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable.demo.ledger import PaymentProvider

server = DurableServer("replica")
provider = PaymentProvider()
SLOW_SECONDS = float(os.environ.get("SLOW_TOOL_SECONDS", "3"))


async def _refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    key = current_call().key
    effect = await anyio.to_thread.run_sync(lambda: provider.refund(order_id, amount_cents, idempotency_key=key))
    return {**effect.as_dict(), "replica": os.getpid()}


@server.tool(durable=ToolPolicy(key="required"))
async def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order (the provider deduplicates by the call's key)."""
    return await _refund(order_id, amount_cents)


@server.tool(durable=ToolPolicy(key="required", lease=1.0, in_doubt="retry"))
async def slow_refund(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund, then linger inside the danger window; in doubt: run again with the same key."""
    result = await _refund(order_id, amount_cents)
    await anyio.sleep(SLOW_SECONDS)
    return result


@server.tool(durable=ToolPolicy(key="required", lease=1.0, in_doubt="refuse"))
async def slow_refund_refused(order_id: str, amount_cents: int) -> dict[str, Any]:
    """Refund, then linger inside the danger window; in doubt: refuse until an operator resolves."""
    result = await _refund(order_id, amount_cents)
    await anyio.sleep(SLOW_SECONDS)
    return result
