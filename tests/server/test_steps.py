"""Durable steps through a real MCP client: journaled once, replayed on re-execution, checked for order.

A step's function logs each real execution to a file; a flag file makes a step fail on the
first attempt (an unexpected exception releases the call, so the retry re-executes the tool).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from mcp_durable import DurableServer, ToolPolicy, current_call
from mcp_durable.demo.warehouse import Warehouse
from tests.crash.crash_servers.hooks import Counter
from tests.helpers import meta_of

MODES = ["legacy", "auto"]


def _server(tmp_path: Path) -> tuple[DurableServer, Counter]:
    events = Counter(tmp_path / "events.log")
    fail_once = tmp_path / "fail-once"
    names = tmp_path / "names"
    server = DurableServer("steps", journal=f"sqlite:///{tmp_path}/journal.db")

    def work(name: str) -> str:
        events.hit(name)
        if name == "charge" and fail_once.exists():
            fail_once.unlink()
            raise RuntimeError("the provider timed out")
        return f"{name}-done"

    @server.tool(durable=ToolPolicy(key_fields=("job",)))
    async def three_steps(job: str) -> dict[str, Any]:
        call = current_call()
        first = names.read_text() if names.exists() else "reserve"
        results = [await call.step(name, work, name) for name in (first, "charge", "notify")]
        return {"results": results, "replayed": call.steps_replayed, "run": call.steps_run, "attempt": call.attempt}

    @server.tool(durable=ToolPolicy(key_fields=("job",)))
    def sync_steps(job: str) -> dict[str, Any]:
        call = current_call()
        return {"results": [call.step_sync(name, work, name) for name in ("pack", "charge")]}

    fail_once.touch()
    return server, events


@pytest.mark.parametrize("mode", MODES)
async def test_a_re_execution_replays_the_completed_steps_and_resumes_at_the_first_unfinished_one(
    mode: str, tmp_path: Path
) -> None:
    server, events = _server(tmp_path)
    async with Client(server, mode=mode) as client:
        failed = await client.call_tool("three_steps", {"job": "J"})
        assert failed.is_error
        result = await client.call_tool("three_steps", {"job": "J"})
        replay = await client.call_tool("three_steps", {"job": "J"})
    assert not result.is_error, result
    assert result.structured_content == {
        "results": ["reserve-done", "charge-done", "notify-done"],
        "replayed": 1,
        "run": 2,
        "attempt": 2,
    }
    assert [events.count(n) for n in ("reserve", "charge", "notify")] == [1, 2, 1]
    assert replay.structured_content == result.structured_content and meta_of(replay)["mcp-durable/replayed"] is True


@pytest.mark.parametrize("mode", MODES)
async def test_a_step_named_differently_from_the_journal_at_the_same_position_is_a_determinism_error(
    mode: str, tmp_path: Path
) -> None:
    server, events = _server(tmp_path)
    async with Client(server, mode=mode) as client:
        assert (await client.call_tool("three_steps", {"job": "J"})).is_error  # "reserve" journaled, "charge" failed
        (tmp_path / "names").write_text("pack")  # the code changed: step 0 is now another step
        result = await client.call_tool("three_steps", {"job": "J"})
    assert result.is_error and result.structured_content is not None
    assert meta_of(result)["mcp-durable/error"]["error"] == "determinism_error"
    assert "reserve" in result.structured_content["message"] and "pack" in result.structured_content["message"]
    assert events.count("pack") == 0, "nothing ran past the mismatch"


@pytest.mark.parametrize("mode", MODES)
async def test_a_sync_tool_journals_its_steps_with_step_sync(mode: str, tmp_path: Path) -> None:
    server, events = _server(tmp_path)
    async with Client(server, mode=mode) as client:
        assert (await client.call_tool("sync_steps", {"job": "S"})).is_error
        result = await client.call_tool("sync_steps", {"job": "S"})
    assert result.structured_content == {"results": ["pack-done", "charge-done"]}
    assert [events.count("pack"), events.count("charge")] == [1, 2]


@pytest.mark.parametrize("mode", MODES)
async def test_shipping_an_order_twice_reserves_labels_and_notifies_once(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tools.shipping as shipping

    warehouse = Warehouse(tmp_path / "warehouse.db")
    monkeypatch.setattr(shipping, "warehouse", warehouse)
    server = DurableServer("shipping", journal=f"sqlite:///{tmp_path}/journal.db")
    server.add_tool(shipping.ship_order, durable=shipping.server.policies["ship_order"])
    async with Client(server, mode=mode) as client:
        first = await client.call_tool("ship_order", {"order_id": "O-9"})
        second = await client.call_tool("ship_order", {"order_id": "O-9"})
    assert not first.is_error and second.structured_content == first.structured_content
    assert [(o["op"], o["outcome"]) for o in warehouse.operations("O-9")] == [
        ("reserve", "applied"),
        ("label", "applied"),
        ("notify", "applied"),
    ]
