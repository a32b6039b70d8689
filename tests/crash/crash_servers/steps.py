"""Crash-test target for durable steps: a 10-step tool, and tools/shipping.py with crash points.

Serve it with `mcp-durable serve tests.crash.crash_servers.steps:make_server --journal URL`.
`$CRASH_COUNTER` logs `run <job> step <i>` each time a step's function really runs;
`$CRASH_PLAN` (`hooks.CrashPlan`) kills the process at `step <i>` of a job (inside the step,
after it has run, before it is journaled), or — for `ship_order` — at `<op>:before` / `<op>:after`
around a warehouse operation. `$WAREHOUSE_DB` is the warehouse.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import tools.shipping as shipping  # noqa: E402
from mcp_durable import DurableServer, ToolPolicy, current_call  # noqa: E402
from mcp_durable.demo.warehouse import Warehouse  # noqa: E402
from tests.crash.crash_servers.hooks import ENV_COUNTER, ENV_PLAN, Counter, CrashPlan  # noqa: E402


class CrashingWarehouse(Warehouse):
    """The real warehouse, with crash points around each operation (keyed by order id)."""

    def __init__(self, path: str | None, plan: CrashPlan) -> None:
        super().__init__(path)
        self.plan = plan

    def _once(self, op: str, order_id: str, key: str, make: Any) -> str:
        self.plan.fire(order_id, f"{op}:before")
        value = super()._once(op, order_id, key, make)
        self.plan.fire(order_id, f"{op}:after")
        return value


def make_server(journal: str | None = None) -> DurableServer:
    env = os.environ
    events = Counter(env.get(ENV_COUNTER))
    plan = CrashPlan(env.get(ENV_PLAN))
    shipping.warehouse = CrashingWarehouse(env.get("WAREHOUSE_DB"), plan)
    server = DurableServer("steps", journal=journal)
    retry = ToolPolicy(key_fields=("job",), in_doubt="retry", lease=float(env.get("CRASH_LEASE", "0.5")))

    @server.tool(durable=retry)
    async def ten_steps(job: str) -> dict[str, Any]:
        """Ten journaled steps; each logs that it ran."""
        call = current_call()

        def work(i: int) -> int:
            events.hit(f"run {job} step {i}")
            plan.fire(job, f"step {i}")  # crash inside the step: it ran, it is not journaled
            return i * i

        results = [await call.step(f"step {i}", work, i) for i in range(1, 11)]
        return {"job": job, "results": results, "replayed": call.steps_replayed, "run": call.steps_run}

    # The real tool and policy, with the short test lease (a shared journal waits out a dead owner's lease).
    ship = dataclasses.replace(shipping.server.policies["ship_order"], lease=retry.lease)
    server.add_tool(shipping.ship_order, durable=ship)
    return server
