"""Errors: a tool's deliberate `ToolError` is a result (persisted, replayed); an unexpected
exception is not (the claim is released and the retry runs the tool again)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import body_bytes, connect, first_text, key_meta
from tests.server.conftest import CountingSetup
from tests.server.servers.counting import Counter


@pytest.mark.parametrize("transport", ["memory-legacy", "memory-auto", "http-auto"])
async def test_a_tool_error_is_persisted_and_replayed_without_running_the_tool_again(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        first = await client.call_tool("tool_error", {"text": "a"}, meta=key_meta("e-1"))
        second = await client.call_tool("tool_error", {"text": "a"}, meta=key_meta("e-1"))
    assert counter.count("tool_error") == 1
    assert first.is_error and second.is_error
    assert "declined 'a' (execution 1)" in first_text(first)
    assert body_bytes(second) == body_bytes(first)
    assert first.meta is not None and first.meta["mcp-durable/key"] == "e-1"
    assert second.meta is not None and second.meta["mcp-durable/replayed"] is True


@pytest.mark.parametrize("transport", ["memory-legacy", "memory-auto", "stdio-auto"])
async def test_an_unexpected_exception_lets_the_retry_run_the_tool_again(
    transport: str, tmp_path: Path, counting_setup: CountingSetup
) -> None:
    counter = Counter(tmp_path / "counter")
    async with connect(transport, **counting_setup(transport)) as client:
        crashed = await client.call_tool("flaky", {"text": "a"}, meta=key_meta("f-1"))
        retried = await client.call_tool("flaky", {"text": "a"}, meta=key_meta("f-1"))
        replayed = await client.call_tool("flaky", {"text": "a"}, meta=key_meta("f-1"))
    assert counter.count("flaky") == 2
    assert crashed.is_error
    assert "crashed" not in first_text(crashed)  # an unexpected exception's message is withheld
    assert not retried.is_error
    assert retried.structured_content is not None and retried.structured_content["execution"] == 2
    assert retried.meta is not None and "mcp-durable/replayed" not in retried.meta
    assert body_bytes(replayed) == body_bytes(retried)
    assert replayed.meta is not None and replayed.meta["mcp-durable/replayed"] is True


async def test_an_exception_kept_under_persist_is_not_released_by_tool_errors_release(tmp_path: Path) -> None:
    """`exceptions="persist"` keeps a crash's result; `tool_errors="release"` releases only a
    tool's deliberate error result, never the one standing for a kept exception."""
    from mcp.server.mcpserver.exceptions import ToolError

    from mcp_durable import DurableServer, ToolPolicy

    server = DurableServer("errors", journal=f"file://{tmp_path / 'journal'}")
    runs: list[str] = []

    @server.tool(durable=ToolPolicy(key_fields=("order_id",), exceptions="persist", tool_errors="release"))
    def settle(order_id: str, declined: bool = False) -> str:
        runs.append(order_id)
        if declined:
            raise ToolError(f"declined {order_id}")
        raise RuntimeError(f"provider crashed on {order_id}")

    try:
        crashed = [await server.call_tool("settle", {"order_id": "o-1"}) for _ in range(2)]
        declined = [await server.call_tool("settle", {"order_id": "o-2", "declined": True}) for _ in range(2)]
    finally:
        await server.aclose()
    assert runs == ["o-1", "o-2", "o-2"]  # the kept crash replayed; the deliberate error released
    assert all(getattr(result, "is_error", False) for result in crashed + declined)
    assert getattr(crashed[1], "meta", {}).get("mcp-durable/replayed") is True
