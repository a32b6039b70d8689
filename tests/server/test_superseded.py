"""An owner paused past its lease, whose call another server took over, reports what happened.

Two servers share one SQLite journal; the second reads the clock 1,000 s ahead, so the first
owner's lease has run out for it (a pause, as seen by another replica). The paused owner is
fenced out: whether it finishes before or after the server that took the call over, its outcome
is refused, and it answers with the one recorded by the new owner (one answer per key), marked
`mcp-durable/superseded: true` and not `mcp-durable/replayed` (it did run). Before fencing, a
paused owner that finished first recorded its own outcome over its successor's attempt; before
that, the loser was marked `replayed: true`, as if it had not run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy
from tests.helpers import meta_of

LEASE = 5.0


class Gates:
    """Each server's tool waits at its own gate; `runs` records who ran, in order."""

    def __init__(self) -> None:
        self.open = {"A": anyio.Event(), "B": anyio.Event()}
        self.runs: list[str] = []

    async def wait_for_runs(self, count: int) -> None:
        with anyio.fail_after(30):
            while len(self.runs) < count:
                await anyio.sleep(0.01)


def _server(name: str, url: str, gates: Gates, clock: Any) -> DurableServer:
    server = DurableServer(f"paused-{name}", journal=url, clock=clock)

    @server.tool(durable=ToolPolicy(key="derived", lease=LEASE, in_doubt="retry"))
    async def work(job: str) -> dict[str, Any]:
        gates.runs.append(name)
        await gates.open[name].wait()
        return {"job": job, "ran_on": name}

    return server


@pytest.mark.parametrize("mode", ["legacy", "auto"])
@pytest.mark.parametrize("first_to_record", ["taker", "paused owner"])
async def test_the_run_that_lost_the_record_is_marked_superseded_not_replayed(
    tmp_path: Path, mode: str, first_to_record: str
) -> None:
    url = f"sqlite:///{tmp_path}/journal.db"
    gates = Gates()
    paused = _server("A", url, gates, time.time)
    taker = _server("B", url, gates, lambda: time.time() + 1000.0)  # A's lease has run out for B
    answers: dict[str, Any] = {}
    async with Client(paused, mode=mode) as a, Client(taker, mode=mode) as b:

        async def call(name: str, client: Any) -> None:
            answers[name] = await client.call_tool("work", {"job": "j-1"})

        async with anyio.create_task_group() as group:
            group.start_soon(call, "A", a)
            await gates.wait_for_runs(1)  # A owns the call and is "paused" at its gate
            group.start_soon(call, "B", b)
            await gates.wait_for_runs(2)  # B found A's lease expired, took the call over, runs it
            first, second = ("B", "A") if first_to_record == "taker" else ("A", "B")
            gates.open[first].set()
            if first == "A":
                # The paused owner's outcome is refused: it waits for the new owner, like a repeat.
                await anyio.sleep(0.3)
                assert "A" not in answers
            gates.open[second].set()
            with anyio.fail_after(30):
                while len(answers) < 2:
                    await anyio.sleep(0.01)
    assert gates.runs == ["A", "B"]
    recorded, lost = answers["B"], answers["A"]
    assert recorded.structured_content == {"job": "j-1", "ran_on": "B"}
    assert "mcp-durable/replayed" not in recorded.meta and "mcp-durable/superseded" not in recorded.meta
    # The run that lost ran the tool: not a replay. It answers with the recorded outcome.
    assert lost.meta.get("mcp-durable/replayed") is not True
    assert lost.meta["mcp-durable/superseded"] is True
    assert lost.structured_content == recorded.structured_content and not lost.is_error
    # A later repeat is an ordinary replay of the recorded outcome.
    async with Client(taker, mode=mode) as b:
        again = await b.call_tool("work", {"job": "j-1"})
    assert meta_of(again)["mcp-durable/replayed"] is True and again.structured_content == recorded.structured_content
