"""A task that fails logs one line, not a traceback (the traceback only at DEBUG).

A failed task is an answer (`failed`, its record says why), not a crash of the server: a client
that makes failing tasks by design (a tool's deliberate protocol error, a conformance suite)
must not fill the log with a traceback per task. Each failed run logs one WARNING line naming
the tool, the task id and the error's first line; the traceback goes to DEBUG.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from mcp import Client, MCPError
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types.jsonrpc import INVALID_PARAMS

from mcp_durable import DurableServer, ToolPolicy
from tests.server.task_client import TaskHandle, TasksClient, call_for_task, create_legacy_task, poll_until_terminal

REQUIRED = ToolPolicy(task_support="required")


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[DurableServer]:
    server = DurableServer("failing-tasks", journal=f"file://{tmp_path / 'journal'}")

    @server.tool(durable=REQUIRED)
    async def reject(order_id: str) -> str:
        """Refuses every order with a protocol error: a deliberate, designed failure."""
        raise MCPError(code=INVALID_PARAMS, message=f"order {order_id} is not refundable")

    @server.tool(durable=REQUIRED)
    async def crash(order_id: str) -> str:
        """Raises an unexpected exception."""
        raise RuntimeError(f"ledger for {order_id} is corrupt\nsecond line")

    @server.tool(durable=REQUIRED)
    async def deny(order_id: str) -> str:
        """Answers with a deliberate error result (a failed task with a result): nothing to log."""
        raise ToolError(f"order {order_id} denied")

    yield server


async def quiet(server: DurableServer) -> None:
    """Until the engine's background runs (the tasks' runs, and their logging) have all ended."""
    with anyio.fail_after(10):
        while server.engine.background:
            await anyio.sleep(0.01)


async def test_each_failed_task_logs_one_warning_line_without_a_traceback(
    server: DurableServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)  # the default level of `mcp-durable serve` (--log-level warning)
    async with Client(server, extensions=[TasksClient()]) as client:
        modern = {}
        for tool in ("reject", "crash", "deny"):
            handle = await call_for_task(client, tool, {"order_id": f"{tool}-1"})
            assert isinstance(handle, TaskHandle)
            modern[tool] = handle.task_id
            await poll_until_terminal(client, handle.task_id)
    async with Client(server, mode="legacy") as legacy:
        created = await create_legacy_task(legacy, "reject", {"order_id": "reject-2"})
        legacy_id = created["task"]["taskId"]
        assert (await poll_until_terminal(legacy, legacy_id))["status"] == "failed"
        await quiet(server)
    logged = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Traceback" not in caplog.text and all(r.exc_info is None for r in caplog.records)
    lines = [r.getMessage() for r in logged]
    assert len(lines) == 3, lines  # one per failed run; the error result of `deny` is no failure
    assert all(r.levelno == logging.WARNING and "\n" not in r.getMessage() for r in logged)
    reject, crash, again = lines
    assert modern["reject"] in reject and "'reject'" in reject and "order reject-1 is not refundable" in reject
    assert modern["crash"] in crash and "'crash'" in crash and "ledger for crash-1 is corrupt second line" in crash
    assert legacy_id in again and "order reject-2 is not refundable" in again
    assert modern["deny"] not in caplog.text


async def test_the_traceback_of_a_failed_task_is_logged_at_debug(
    server: DurableServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="mcp_durable")
    async with Client(server, extensions=[TasksClient()]) as client:
        handle = await call_for_task(client, "crash", {"order_id": "crash-2"})
        await poll_until_terminal(client, handle.task_id)
        await quiet(server)
    mine = [r for r in caplog.records if r.name.startswith("mcp_durable") and handle.task_id in r.getMessage()]
    traced = [r for r in mine if r.exc_info is not None]
    assert [r.levelno for r in mine if r.exc_info is None] == [logging.WARNING]
    assert len(traced) == 1 and traced[0].levelno == logging.DEBUG
    assert "ledger for crash-2 is corrupt" in caplog.text and "Traceback" in caplog.text
