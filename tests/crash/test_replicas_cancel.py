"""Cancel a call running on another replica (Postgres): the owner stops the tool, the call is never resumed.

Two `mcp-durable serve` replicas share one Postgres journal. Replica A runs `five_steps`, held
after its second step. The operator cancels the call elsewhere, and A learns it:
- through replica B's `journal_cancel` admin tool, at A's next lease renewal (lease 1 s);
- through `mcp-durable journal cancel` from a shell, at A's next durable step (lease 30 s, so no
  renewal comes first; the gate is opened after the cancel).
Either way A's caller is answered `cancelled`, the later steps never run, and a repeat of the key
on either replica is refused.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from mcp import Client

from tests.backends.pg_cluster import scratch_schema
from tests.crash.replicas import serve_http_together
from tests.helpers import serve_command, serve_http
from tests.server.servers.counting import Counter
from tests.server.test_operator_actions import TARGET, refusal_code, runs_per_step, wait_for

pytestmark = pytest.mark.postgres


@pytest.fixture
def shared_journal() -> Iterator[str]:
    with scratch_schema() as url:
        yield url


async def held_call(url: str, job: str, results: list[Any]) -> None:
    with anyio.fail_after(60):  # a bound on a hang (a cancel the owner never learns), not a timing assertion
        async with Client(url) as client:
            results.append(await client.call_tool("five_steps", {"job": job, "hold": True}))


async def test_an_admin_on_another_replica_cancels_a_running_call_and_the_owner_stops_it_at_its_lease_renewal(
    tmp_path: Path, shared_journal: str
) -> None:
    log = Counter(tmp_path / "steps.log")
    env = {"STEPS_LOG": str(log.path), "STEPS_LEASE": "1", "MCP_DURABLE_ADMINS": "local"}
    results: list[Any] = []
    async with serve_http_together((TARGET, shared_journal, env), (TARGET, shared_journal, env)) as (a, b):
        async with anyio.create_task_group() as group:
            group.start_soon(held_call, a.url, "J-6", results)
            await wait_for(log, "charge J-6")
            async with Client(b.url) as operator:
                cancelled = await operator.call_tool(
                    "journal_cancel", {"tool": "five_steps", "key": "J-6", "note": "wrong warehouse"}
                )
        # A's call ended (cancelled) with the gate still shut: the renewal, not a step, stopped it.
        log.open_gate()
        async with Client(b.url) as client:
            again_on_b = await client.call_tool("five_steps", {"job": "J-6", "hold": True})
        async with Client(a.url) as client:
            again_on_a = await client.call_tool("five_steps", {"job": "J-6", "hold": True})
    assert not cancelled.is_error and cancelled.structured_content is not None
    assert cancelled.structured_content["state"] == "released"
    assert [refusal_code(r) for r in results] == ["cancelled"]
    assert refusal_code(again_on_b) == refusal_code(again_on_a) == "cancelled"
    assert runs_per_step(log, "J-6") == [1, 1, 0, 0, 0]


async def test_the_cli_cancels_a_call_running_on_a_replica_which_stops_at_its_next_durable_step(
    tmp_path: Path, shared_journal: str
) -> None:
    log = Counter(tmp_path / "steps.log")
    env = {"STEPS_LOG": str(log.path), "STEPS_LEASE": "30"}
    results: list[Any] = []
    async with serve_http(TARGET, journal=shared_journal, env=env) as a:
        async with anyio.create_task_group() as group:
            group.start_soon(held_call, a.url, "J-7", results)
            await wait_for(log, "charge J-7")
            command, *prefix = serve_command()
            done = await anyio.to_thread.run_sync(
                lambda: subprocess.run(
                    [
                        command,
                        *prefix,
                        "journal",
                        "--journal",
                        shared_journal,
                        "--json",
                        "cancel",
                        "five_steps",
                        "J-7",
                        "--note",
                        "duplicate order",
                    ],
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
            )
            assert done.returncode == 0, done.stderr
            log.open_gate()  # the tool goes on to its third step, which finds the call cancelled
        async with Client(a.url) as client:
            again = await client.call_tool("five_steps", {"job": "J-7", "hold": True})
    (view,) = [orjson.loads(line) for line in done.stdout.splitlines()]
    assert view["state"] == "released" and "duplicate order" in view["error"]
    assert [refusal_code(r) for r in results] == ["cancelled"]
    assert refusal_code(again) == "cancelled"
    assert runs_per_step(log, "J-7") == [1, 1, 0, 0, 0]
