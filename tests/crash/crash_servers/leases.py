"""Crash-test target for leases: `long_task(job)` sleeps `$TASK_SECONDS`, logging who ran it and when.

Serve it with `mcp-durable serve tests.crash.crash_servers.leases:make_server --journal URL`.
`$CRASH_LEASE` is the lease (seconds), `$CRASH_WAIT` how long a duplicate waits before
`in_progress`, `$CRASH_COUNTER` the event log: `start <job> <instance> <epoch>` when the tool
starts, `end <job> <instance>` when it ends. The duration comes from the environment, not the
arguments, so two servers can run the same call (same key, same arguments) for different times.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mcp_durable import DurableServer, ToolPolicy  # noqa: E402
from tests.crash.crash_servers.hooks import ENV_COUNTER, Counter  # noqa: E402


def make_server(journal: str | None = None) -> DurableServer:
    env = os.environ
    events = Counter(env.get(ENV_COUNTER))
    seconds = float(env.get("TASK_SECONDS", "1"))
    policy = ToolPolicy(
        key_fields=("job",),
        in_doubt="retry",
        lease=float(env.get("CRASH_LEASE", "0.6")),
        wait=float(env.get("CRASH_WAIT", "0.2")),
    )
    server = DurableServer("leases", journal=journal)

    @server.tool(durable=policy)
    async def long_task(job: str) -> dict[str, Any]:
        """Work for `$TASK_SECONDS` seconds."""
        instance = server.engine.instance_id
        started = time.time()
        events.hit(f"start {job} {instance} {started!r}")
        await anyio.sleep(seconds)
        events.hit(f"end {job} {instance}")
        return {"job": job, "instance": instance, "started": started}

    return server
