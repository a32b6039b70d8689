"""A server's background jobs (retention, recovery) run while any connection is served, whichever
connection leaves first, and stop with the last one.

In-memory (and stdio) connections each enter the server's lifespan in their own task. Two
in-memory clients are opened (tests/server/connections.py): the first one closes, and retention
must still purge a record whose short retention has run out; then the last one closes, and no
retention pass runs any more.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from mcp_durable import CallIdentity, DurableServer, ToolPolicy
from mcp_durable.operations.retention import RetentionSchedule
from tests.server.connections import two_connections

INTERVAL = 0.05
#: The retention of the tool's records: several passes go by before one expires.
RETENTION = 0.3


def make(tmp_path: Path) -> DurableServer:
    server = DurableServer(
        "background",
        journal=f"sqlite:///{tmp_path}/journal.db",
        retention_schedule=RetentionSchedule(interval=INTERVAL, compact_garbage_ratio=None),
    )

    @server.tool(durable=ToolPolicy(key_fields=("job",), retention=RETENTION))
    def job(job: str) -> dict[str, Any]:
        return {"job": job}

    return server


async def purged(server: DurableServer, key: str) -> None:
    """Until the record of `job(key)` is gone from the journal (a retention pass removed it)."""
    with anyio.fail_after(10):  # a bound on a hang: without a retention pass it never goes
        while await server.journal.get(CallIdentity("local", "job", key)) is not None:
            await anyio.sleep(INTERVAL)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_retention_keeps_running_after_the_first_connection_leaves_and_stops_with_the_last(
    tmp_path: Path, mode: str
) -> None:
    server = make(tmp_path)
    retention = server.retention
    assert retention is not None
    async with two_connections(server, mode) as (first, last):
        await first.close()
        done = await last.client.call_tool("job", {"job": "J-1"})  # made after the first left
        assert not done.is_error
        await purged(server, "J-1")  # before the fix: no pass ran once the first connection left
        await last.close()
        passes = retention.report.passes
        await anyio.sleep(10 * INTERVAL)  # room for passes that should no longer run
        assert retention.report.passes == passes
