"""A test target: `five_steps(job)`, a durable tool of five durable steps that log each real execution.

`mcp-durable serve tests/server/servers/five_steps.py:make_server` (the log is `$STEPS_LOG`, the
lease `$STEPS_LEASE` seconds; admins from `$MCP_DURABLE_ADMINS`, tokens from `$MCP_DURABLE_TOKENS`),
or `make_server(journal, log)`. With `hold=true` the tool waits after its second step until the
gate file beside the log exists.
Each step's result carries a fresh id, so a step that ran again can never pass for a replay.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path
from typing import Any

import anyio

# Served by path, this file's folder is on sys.path but the repository root is not.
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mcp_durable import DurableServer, ToolPolicy, current_call  # noqa: E402
from tests.server.servers.counting import Counter  # noqa: E402

STEPS = ("reserve", "charge", "pack", "ship", "notify")


def make_server(
    journal: str | None = None, log: str | None = None, *, lease: float | None = None, admins: tuple[str, ...] = ()
) -> DurableServer:
    events = Counter(log or os.environ["STEPS_LOG"])
    lease = lease if lease is not None else float(os.environ.get("STEPS_LEASE", "30"))
    server = DurableServer("five", journal=journal, admin_principals=admins)
    gate = events.gate

    def work(name: str, job: str) -> str:
        events.hit(f"{name} {job}")
        return f"{name}-{uuid.uuid4().hex[:8]}"

    @server.tool(durable=ToolPolicy(key_fields=("job",), lease=lease))
    async def five_steps(job: str, hold: bool = False) -> dict[str, Any]:
        call = current_call()
        results = []
        for name in STEPS:
            results.append(await call.step(name, work, name, job))
            while hold and name == "charge" and not gate.exists():
                await anyio.sleep(0.05)  # held between steps until the test opens the gate
        return {"steps": results, "attempt": call.attempt, "replayed": call.steps_replayed, "ran": call.steps_run}

    return server
