"""A test target for tasks that ask their requestor: a refund approved by its user.

`approve_refund(order_id, amount_cents)` (interactive, task support optional, retried when in doubt)
runs a durable step `quote`, asks its user to approve the refund (`ctx.elicit`, question
`input-0`), runs a durable step `pay` if approved, asks where to send the receipt (`input-1`) and
answers with both answers. Every real run of a step appends `<step> <order_id>` to the counter
file (`$COUNTER_FILE`), so a test in another process (after a SIGKILL, a restart) counts how often
each step ran. Serve it with `mcp-durable serve tests/tasks/servers/asking.py:make_server`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context
from pydantic import BaseModel

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mcp_durable import DurableServer, ToolPolicy, current_call  # noqa: E402
from tests.server.servers.counting import Counter  # noqa: E402


class Approval(BaseModel):
    approve: bool = False


class Receipt(BaseModel):
    email: str = ""


def make_server(
    journal: str | None = None, counter: str | os.PathLike[str] | None = None, **kwargs: Any
) -> DurableServer:
    counts = Counter(counter or os.environ["COUNTER_FILE"])
    server = DurableServer("asking", journal=journal, **kwargs)

    @server.tool(durable=ToolPolicy(interactive=True, task_support="optional", task_after=0.1, in_doubt="retry"))
    async def approve_refund(order_id: str, amount_cents: int, ctx: Context) -> str:
        call = current_call()
        quote = await call.step("quote", lambda: counts.hit(f"quote {order_id}") and f"{amount_cents} cents")
        approval = await ctx.elicit(f"Refund {quote} for {order_id}?", Approval)
        if approval.action != "accept" or not approval.data.approve:
            return f"refund of {order_id} not approved ({approval.action})"
        await call.step("pay", lambda: counts.hit(f"pay {order_id}"))
        receipt = await ctx.elicit(f"Where should the receipt for {order_id} go?", Receipt)
        email = receipt.data.email if receipt.action == "accept" else "nowhere"
        return f"refunded {quote} for {order_id}, receipt to {email}"

    return server
