"""Tasks are bound to the principal that created them: over streamable HTTP with two bearer tokens,
another principal's `tasks/get`, `tasks/result`, `tasks/cancel` get exactly the unknown-id error,
and `tasks/list` never shows them (both generations)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client

from mcp_durable.server.tasks import TASK_NOT_FOUND
from tests.helpers import ServedHttp, serve_http
from tests.server.servers.counting import Counter
from tests.server.task_client import TasksClient, call_for_task, create_legacy_task, poll_until_terminal, request

TASKS = "tests/server/servers/tasks.py:make_server"
TOKENS = "tokA=alice,tokB=bob"


@asynccontextmanager
async def _client_as(url: str, token: str, mode: str) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"}
    extensions = [TasksClient()] if mode == "auto" else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        transport = streamable_http_client(url, http_client=http)
        async with Client(transport, mode=mode, extensions=extensions) as client:
            yield client


@asynccontextmanager
async def _server(tmp_path: Path) -> AsyncIterator[ServedHttp]:
    (tmp_path / "gates").mkdir(exist_ok=True)
    env = {
        "COUNTER_FILE": str(tmp_path / "counter"),
        "TASK_GATE": str(tmp_path / "gates"),
        "PAYMENTS_LEDGER": str(tmp_path / "ledger.db"),
        "MCP_DURABLE_TOKENS": TOKENS,
    }
    async with serve_http(TASKS, journal=f"file://{tmp_path / 'journal'}", env=env) as served:
        yield served


async def _refused(client: Client, method: str, task_id: str) -> MCPError:
    with pytest.raises(MCPError) as refused:
        await request(client, method, {"taskId": task_id})
    return refused.value


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_another_principal_never_sees_a_task(mode: str, tmp_path: Path) -> None:
    args = {"order_id": "O-1", "amount_cents": 100}
    async with _server(tmp_path) as served:
        async with _client_as(served.url, "tokA", mode) as alice:
            if mode == "legacy":
                task_id = (await create_legacy_task(alice, "refund", args))["task"]["taskId"]
            else:
                task_id = (await call_for_task(alice, "refund", args)).task_id
        async with _client_as(served.url, "tokB", mode) as bob:
            unknown = await _refused(bob, "tasks/get", "not-a-task-id")
            errors: dict[str, Any] = {
                "tasks/get": await _refused(bob, "tasks/get", task_id),
                "tasks/cancel": await _refused(bob, "tasks/cancel", task_id),
            }
            if mode == "legacy":
                errors["tasks/result"] = await _refused(bob, "tasks/result", task_id)
                bob_tasks = (await request(bob, "tasks/list", {}))["tasks"]
                # Bob's own task with the same key is his, not Alice's.
                bobs = (await create_legacy_task(bob, "refund", args))["task"]["taskId"]
                assert [t["taskId"] for t in (await request(bob, "tasks/list", {}))["tasks"]] == [bobs]
            else:
                bob_tasks = []
                bobs = (await call_for_task(bob, "refund", args)).task_id
        (tmp_path / "gates" / "O-1").touch()
        async with _client_as(served.url, "tokA", mode) as alice:
            mine = await poll_until_terminal(alice, task_id)  # not cancelled by Bob's attempt
            alice_tasks = (await request(alice, "tasks/list", {}))["tasks"] if mode == "legacy" else []
    assert bobs != task_id
    for method, error in errors.items():
        assert (error.error.code, error.error.message) == (unknown.error.code, unknown.error.message), method
        assert error.error.message == TASK_NOT_FOUND and error.error.data is None, method
    assert bob_tasks == []
    assert mine["status"] == "completed"
    if mode == "legacy":
        assert [t["taskId"] for t in alice_tasks] == [task_id]
    # Once per principal (the key is scoped by principal), never for the other's request.
    assert Counter(tmp_path / "counter").count("pay O-1") == 2
