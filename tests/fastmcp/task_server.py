"""A FastMCP 4 server whose tools run as durable MCP tasks: in process (`task_app`) for the tasks
tests (test_tasks.py), and as a process of its own over streamable HTTP for the restart tests
(test_tasks_restart.py, which SIGKILL it).

    python tests/fastmcp/task_server.py --journal URL --port P

- `refund(order_id, amount_cents)`: FastMCP's own `task=True` and `idempotentHint: true`; its
  policy (`make_durable(policies=…)`) adds only `key_fields=("order_id",)`, `task_after`, the
  lease and the in-doubt policy, so its task support is the tool's own declaration. It runs two
  durable steps: `pay` moves the money on the payment provider's ledger under the call's scoped
  key (one effect per key however often it is asked), then `wait` blocks until the gate file
  `<gates>/<order_id>` exists, so a test decides when a task finishes (or kills the server while
  it waits) without timing anything. Every real run of a step appends `<step> <order_id>` to the
  counter file; a wait stopped by a cancellation appends `stopped <order_id>`, the end `done
  <order_id>`.
- `job(name)`: a plain FastMCP tool made task-required by its policy (`task_support="required"`).
- `note(text)`: `task=True` and nothing else: a task whose tool is not idempotent.
- `echo(text)`: not durable, not a task.
- `approve_refund(order_id, amount_cents)`: `task=True`, interactive by its policy (retried when
  in doubt): a durable step `quote`, then it asks its requestor to approve (`ctx.elicit`, question
  `input-0`), a durable step `pay` if approved, then asks where the receipt goes (`input-1`); each
  real run of a step appends `<step> <order_id>` to the counter file (tests/tasks/servers/asking.py's
  tool, for FastMCP).

Settings (the subprocess reads them from the environment): `COUNTER_FILE`, `TASK_GATE` (the gate
directory), `PAYMENTS_LEDGER`, `TASK_IN_DOUBT` (retry, refuse), `TASK_LEASE` (seconds).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

# Run by path, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio  # noqa: E402
from fastmcp import Context, FastMCP  # noqa: E402
from mcp_types import ToolAnnotations  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from mcp_durable import ToolPolicy, current_call  # noqa: E402
from mcp_durable.demo.ledger import PaymentProvider  # noqa: E402
from mcp_durable.fastmcp import DurableMiddleware, make_durable  # noqa: E402
from tests.server.servers.counting import Counter  # noqa: E402


class Approval(BaseModel):
    approve: bool = False


class Receipt(BaseModel):
    email: str = ""


def task_app(
    journal: str,
    counter: str | os.PathLike[str],
    gates: str | os.PathLike[str],
    ledger: str | os.PathLike[str],
    *,
    in_doubt: str = "retry",
    lease: float = 1.0,
    auth: Any = None,
    **options: Any,
) -> tuple[FastMCP[Any], DurableMiddleware]:
    """The server on `journal`, made durable with tasks (`auth`: FastMCP's; `options`: more
    `make_durable` keywords)."""
    counts = Counter(counter)
    gate_dir = Path(gates)
    provider = PaymentProvider(ledger)
    app: FastMCP[Any] = FastMCP("tasks", auth=auth)

    @app.tool(task=True, annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=True))
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
                while not (gate_dir / order_id).exists():
                    await anyio.sleep(0.02)
            except BaseException:
                counts.hit(f"stopped {order_id}")
                raise
            return True

        await call.step("wait", wait)
        counts.hit(f"done {order_id}")
        return {"order_id": order_id, "effect_id": effect_id}

    @app.tool
    async def job(name: str) -> dict[str, Any]:
        """A task-required job (by its policy)."""
        counts.hit(f"job {name}")
        return {"job": name}

    @app.tool(task=True)
    async def note(text: str) -> str:
        """A task whose tool is not idempotent."""
        return text

    @app.tool
    def echo(text: str) -> str:
        return text

    @app.tool(task=True)
    async def approve_refund(order_id: str, amount_cents: int, ctx: Context) -> str:
        """Refund an order once its requestor approves; ask where the receipt goes."""
        call = current_call()
        quote = await call.step("quote", lambda: counts.hit(f"quote {order_id}") and f"{amount_cents} cents")
        approval = await ctx.elicit(f"Refund {quote} for {order_id}?", Approval)
        if approval.action != "accept" or not approval.data.approve:
            return f"refund of {order_id} not approved ({approval.action})"
        await call.step("pay", lambda: counts.hit(f"pay {order_id}"))
        receipt = await ctx.elicit(f"Where should the receipt for {order_id} go?", Receipt)
        email = receipt.data.email if receipt.action == "accept" else "nowhere"
        return f"refunded {quote} for {order_id}, receipt to {email}"

    policies = {
        "refund": ToolPolicy(
            key_fields=("order_id",),
            task_after=0.2,
            lease=lease,
            in_doubt=in_doubt,  # type: ignore[arg-type]
        ),
        "job": ToolPolicy(task_support="required"),
        "approve_refund": ToolPolicy(interactive=True, task_after=0.1, lease=lease, in_doubt="retry"),
    }
    durable = make_durable(app, journal=journal, policies=policies, **options)
    return app, durable


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--journal", required=True)
    parser.add_argument("--port", type=int, required=True)
    options = parser.parse_args()
    env = os.environ
    app, _ = task_app(
        options.journal,
        env["COUNTER_FILE"],
        env["TASK_GATE"],
        env["PAYMENTS_LEDGER"],
        in_doubt=env.get("TASK_IN_DOUBT", "retry"),
        lease=float(env.get("TASK_LEASE", "1.0")),
    )
    app.run(transport="http", host="127.0.0.1", port=options.port, show_banner=False)


if __name__ == "__main__":
    main()
