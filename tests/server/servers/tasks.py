"""A test target for MCP tasks: a refund that runs as a task, waits on a gate, and counts its runs.

`refund(order_id, amount_cents)` (task_support optional, key = order_id) runs two durable steps:
`pay` moves the money on the payment provider's ledger under the call's scoped key (one effect
per key, however often it is asked), then `wait` blocks until the gate file `<gate dir>/<order_id>`
exists, so a test decides when a task finishes (or kills the server while it waits) without
timing anything. Every real run of a step appends `<step> <order_id>` to the counter file, and a
wait stopped by a cancellation appends `stopped <order_id>`.

`job(name)` is task-required (a `wait-…` job waits for the gate `<gate dir>/job-<name>` and
counts `stopped job <name>` when cancelled); `echo(text)` is durable without task support (as before tasks).
`$TASK_IN_DOUBT` (retry, refuse, reconcile) is the refund's in-doubt policy; `$TASK_LEASE` its
lease in seconds. Serve it with `mcp-durable serve tests/server/servers/tasks.py:make_server`
(`$COUNTER_FILE`, `$TASK_GATE`, `$PAYMENTS_LEDGER`), or build it with `make_server(...)`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mcp_durable import NOT_APPLIED, DurableServer, ToolPolicy, current_call  # noqa: E402
from mcp_durable.demo.ledger import PaymentProvider  # noqa: E402
from tests.server.servers.counting import Counter  # noqa: E402


def make_server(
    journal: str | None = None,
    counter: str | os.PathLike[str] | None = None,
    gate: str | os.PathLike[str] | None = None,
    ledger: str | os.PathLike[str] | None = None,
    in_doubt: str | None = None,
    lease: float | None = None,
    **server_kwargs: Any,
) -> DurableServer:
    env = os.environ
    counts = Counter(counter or env["COUNTER_FILE"])
    gates = Path(gate or env["TASK_GATE"])
    provider = PaymentProvider(ledger or env.get("PAYMENTS_LEDGER"))
    server = DurableServer("tasks", journal=journal, **server_kwargs)

    async def reconcile(key: str, arguments: Mapping[str, Any]) -> Any:
        counts.hit(f"reconcile {key}")
        effect = provider.find(current_call().scoped_key)
        if effect is None:
            return NOT_APPLIED
        return {"order_id": effect.subject, "effect_id": effect.id}

    mode = in_doubt or env.get("TASK_IN_DOUBT", "retry")
    policy = ToolPolicy(
        key_fields=("order_id",),
        task_support="optional",
        task_after=0.2,
        in_doubt=mode,  # type: ignore[arg-type]
        reconcile=reconcile if mode == "reconcile" else None,
        lease=lease or float(env.get("TASK_LEASE", "1.0")),
    )

    @server.tool(durable=policy)
    async def refund(order_id: str, amount_cents: int) -> dict[str, Any]:
        """Refund an order, then wait for the test's gate."""
        call = current_call()

        def pay() -> str:
            counts.hit(f"pay {order_id}")
            return provider.refund(order_id, amount_cents, idempotency_key=call.scoped_key).id

        effect_id = await call.step("pay", pay)

        async def wait() -> bool:
            counts.hit(f"wait {order_id}")
            try:
                while not (gates / order_id).exists():
                    await anyio.sleep(0.02)
            except anyio.get_cancelled_exc_class():
                counts.hit(f"stopped {order_id}")  # the task was cancelled while it waited
                raise
            return True

        await call.step("wait", wait)
        counts.hit(f"done {order_id}")
        return {"order_id": order_id, "effect_id": effect_id}

    @server.tool(durable=ToolPolicy(task_support="required"))
    async def job(name: str) -> str:
        """A task-required tool (a `wait-…` job waits for its gate, `<gate dir>/job-<name>`)."""
        counts.hit(f"job {name}")
        try:
            while name.startswith("wait-") and not (gates / f"job-{name}").exists():
                await anyio.sleep(0.02)
        except anyio.get_cancelled_exc_class():
            counts.hit(f"stopped job {name}")
            raise
        return f"job {name} done"

    @server.tool(durable=ToolPolicy(key="derived"))
    async def echo(text: str) -> str:
        """A durable tool without task support."""
        counts.hit(f"echo {text}")
        return text

    return server
