"""Retention that runs itself: a server purges expired records, their durable steps and old lifecycle
entries on its schedule, compacts its file journal online, and `journal://stats` says what it reclaimed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable import CallIdentity, DurableServer, ToolPolicy, current_call
from mcp_durable.operations.retention import RetentionSchedule
from mcp_durable.steps import steps_process_id
from tests.helpers import resource_text

SCHEDULE = RetentionSchedule(interval=0.2, compact_garbage_ratio=0.3, compact_min_bytes=0)


def make(url: str, schedule: RetentionSchedule | None) -> DurableServer:
    server = DurableServer("kept", journal=url, admin_principals={"local"}, retention_schedule=schedule)

    @server.tool(durable=ToolPolicy(key_fields=("job",), retention=0.3))
    async def job(job: str) -> dict[str, Any]:
        first = await current_call().step("first", lambda: f"{job}-1")
        return {"job": job, "first": first}

    return server


async def stats(client: Client) -> dict[str, Any]:
    return dict(json.loads(resource_text(await client.read_resource("journal://stats"))))


@pytest.mark.parametrize("kind", ["file", "sqlite"])
async def test_expired_records_and_their_steps_are_purged_by_the_server_itself_and_stats_say_so(
    kind: str, tmp_path: Path
) -> None:
    url = f"file://{tmp_path}/journal" if kind == "file" else f"sqlite:///{tmp_path}/journal.db"
    server = make(url, SCHEDULE)
    async with Client(server) as client:
        runs = []
        for i in range(20):
            await client.call_tool("job", {"job": f"J-{i}"})
            record = await server.journal.get(CallIdentity("local", "job", f"J-{i}"))
            assert record is not None
            runs.append(record.run_id)
        assert await server.journal.entries(process_id=steps_process_id(runs[0]))
        with anyio.fail_after(60):  # a bound on a hang, never a timing assertion
            while (await stats(client))["maintenance"]["retention"]["records_purged"] < 20:
                await anyio.sleep(0.1)  # the report counts a pass once it has finished
        for run_id in runs:
            assert await server.journal.entries(process_id=steps_process_id(run_id)) == []
        body = await stats(client)
        assert body["calls"] == 0
        kept = body["maintenance"]["retention"]
        assert kept["records_purged"] >= 20 and kept["entries_dropped"] >= 20 and kept["last_at"], kept
        if kind == "file":
            with anyio.fail_after(60):
                while not (await stats(client))["maintenance"]["retention"]["compactions"]:
                    await anyio.sleep(0.1)
            assert (await stats(client))["maintenance"]["retention"]["bytes_reclaimed"] > 0
        again = await client.call_tool("job", {"job": "J-0"})  # the key runs anew after its record expired
        assert not again.is_error and (again.meta or {}).get("mcp-durable/replayed") is None
        lifecycle = [e for e in await server.journal.entries(process_id=server.engine.process_id or "")]
        assert lifecycle[0].entry_type == "checkpoint"  # older lifecycle entries were folded and dropped


async def test_retention_off_keeps_every_record_and_says_so(tmp_path: Path) -> None:
    server = make(f"sqlite:///{tmp_path}/journal.db", None)
    async with Client(server) as client:
        await client.call_tool("job", {"job": "J-1"})
        await anyio.sleep(0.5)  # past the record's retention: nothing purges it by itself
        body = await stats(client)
    assert body["calls"] == 1 and body["maintenance"]["retention"] is None


async def test_a_pass_reads_only_expired_records_and_drops_their_steps_with_them(tmp_path: Path) -> None:
    """A retention pass finds expired records through the journal's index of expiries and drops
    their steps with them: it never reads a record that has not expired. Here one such record's
    row no longer decodes (a state no release wrote): the pass does not meet it."""
    import sqlite3

    from mcp_durable.engine import Engine
    from mcp_durable.journal import CallRecord, CallState, create_journal
    from mcp_durable.journal.base import STEP
    from mcp_durable.operations.retention import retention_pass

    now = 1_700_000_000.0
    url = f"sqlite:///{tmp_path}/journal.db"
    journal = create_journal(url)
    await journal.open()
    for n, expires in enumerate((now - 5, now - 1, now + 3600, None)):
        record = CallRecord(CallIdentity("local", "job", f"J-{n}"), "f", CallState.COMPLETED, 1, f"r{n}", 1, now, now)
        await journal.claim(record.evolve(expires_at=expires), now - 10)
        await journal.append(steps_process_id(f"r{n}"), STEP, {"index": 0, "name": "first", "result": n}, now)
    await journal.aclose()
    with sqlite3.connect(tmp_path / "journal.db") as conn:
        conn.execute("UPDATE calls SET state = 'mangled' WHERE key = 'J-3'")
    engine = Engine(create_journal(url), clock=lambda: now)
    try:
        done = await retention_pass(engine, RetentionSchedule(compact_garbage_ratio=None, lifecycle=False))
        assert (done.records_purged, done.step_entries_dropped) == (2, 2)
        for n in (0, 1):
            assert await engine.journal.entries(process_id=steps_process_id(f"r{n}")) == []
        assert len(await engine.journal.entries(process_id=steps_process_id("r2"))) == 1
        nothing = await retention_pass(engine, RetentionSchedule(compact_garbage_ratio=None, lifecycle=False))
        assert (nothing.records_purged, nothing.step_entries_dropped) == (0, 0)
    finally:
        await engine.aclose()
