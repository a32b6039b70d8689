"""Durable steps under SIGKILL: a re-execution resumes at the first unfinished step.

`mcp-durable serve tests.crash.crash_servers.steps:make_server` over stdio; each step logs to a
file when its function really runs, so the test counts executions outside the server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_durable.demo.warehouse import Warehouse
from tests.crash.crash_servers.harness import StdioServer, journal_url
from tests.crash.crash_servers.hooks import Counter, CrashPlan

TARGET = "tests.crash.crash_servers.steps:make_server"
JOURNALS = ["sqlite", "file"]


def _server(journal: str, tmp_path: Path) -> tuple[StdioServer, CrashPlan, Counter, Warehouse]:
    plan, events, warehouse = (
        CrashPlan(tmp_path / "plan.json"),
        Counter(tmp_path / "events.log"),
        Warehouse(tmp_path / "warehouse.db"),
    )
    env = {
        "CRASH_PLAN": str(plan.path),
        "CRASH_COUNTER": str(events.path),
        "WAREHOUSE_DB": str(warehouse.path),
        "CRASH_LEASE": "0.5",
    }
    return StdioServer(TARGET, journal_url(journal, tmp_path), env), plan, events, warehouse


@pytest.mark.parametrize("journal", JOURNALS)
async def test_a_ten_step_tool_killed_at_step_six_resumes_at_step_six_and_never_reruns_steps_one_to_five(
    journal: str, tmp_path: Path
) -> None:
    server, plan, events, _ = _server(journal, tmp_path)
    async with server:
        plan.arm("J", "step 6")
        assert await server.call("ten_steps", {"job": "J"}) is None, "killed inside step 6"
        assert [events.count(f"run J step {i}") for i in range(1, 11)] == [1] * 6 + [0] * 4
        await server.start()
        result = await server.call("ten_steps", {"job": "J"})
    assert result is not None and not result.is_error, result
    runs = [events.count(f"run J step {i}") for i in range(1, 11)]
    assert runs == [1, 1, 1, 1, 1, 2, 1, 1, 1, 1], "steps 1-5 replayed; step 6 (unjournaled) ran again; 7-10 once"
    assert result.structured_content == {
        "job": "J",
        "results": [i * i for i in range(1, 11)],
        "replayed": 5,
        "run": 5,
    }


@pytest.mark.parametrize("journal", JOURNALS)
@pytest.mark.parametrize(
    ("point", "expected"),
    [
        # Between steps: label bought and journaled, killed before notifying. Nothing is redone.
        ("notify:before", {"reserve": ["applied"], "label": ["applied"], "notify": ["applied"]}),
        # Inside a step's danger window: label bought, not journaled. Only that step runs again,
        # and the warehouse deduplicates it by the step's key: still one label.
        ("label:after", {"reserve": ["applied"], "label": ["applied", "deduplicated"], "notify": ["applied"]}),
    ],
)
async def test_shipping_an_order_killed_mid_way_resumes_where_it_stopped_without_a_second_reservation_or_label(
    journal: str, point: str, expected: dict[str, list[str]], tmp_path: Path
) -> None:
    server, plan, _, warehouse = _server(journal, tmp_path)
    async with server:
        plan.arm("O-1", point)
        assert await server.call("ship_order", {"order_id": "O-1"}) is None
        await server.start()
        result = await server.call("ship_order", {"order_id": "O-1"})
        again = await server.call("ship_order", {"order_id": "O-1"})
    assert result is not None and not result.is_error, result
    assert again is not None and again.structured_content == result.structured_content
    ops = warehouse.operations("O-1")
    assert {op: [o["outcome"] for o in ops if o["op"] == op] for op in expected} == expected
    assert warehouse.available("SKU-1") == 999, "one unit reserved"
