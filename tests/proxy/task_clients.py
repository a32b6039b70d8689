"""Clients of the proxy's MCP tasks in both protocol eras, for tests/proxy/test_tasks*.py.

    async with tasks_client(url, "legacy", token="tokA") as client:     # streamable HTTP
        task_id = await create_task(client, "legacy", "charge", {...}, key="c-1")
        result = await task_result(client, "legacy", task_id)           # the tool's CallToolResult, as a dict

`legacy` is 2025-11-25 (the client opts in with `params.task`; `tasks/result` blocks until the task
ends); `modern` is 2026-07-28 (the client declares the tasks extension, the server answers with a
task; `tasks/get` inlines the result once the task has ended). tests/server/task_client.py holds
the wire work; this module only picks the era's way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.server.task_client import (
    TaskHandle,
    TasksClient,
    call_for_task,
    create_legacy_task,
    poll_until_terminal,
    request,
)

#: The protocol eras a task is tested in, by the name the tests parametrize with.
ERAS = ("legacy", "modern")
#: What serves the tasks the other SDKs' task clients meet (test_tasks_ext_tasks.py,
#: test_tasks_typescript.py): `mcp-durable proxy` in front of the plain upstream, and the same
#: tools on a durable FastMCP server in process (tests/fastmcp/clients_app.py).
TARGETS = ("proxy", "fastmcp")


@dataclass(frozen=True)
class ServedUrl:
    """A served target's MCP URL, and what its server wrote to stderr so far (for messages)."""

    url: str
    stderr: Callable[[], str]


def client_kwargs(era: str) -> dict[str, Any]:
    """`Client(...)` keyword arguments for `era`: its mode, and the tasks extension on 2026-07-28."""
    return {"mode": "legacy"} if era == "legacy" else {"mode": "auto", "extensions": [TasksClient()]}


@asynccontextmanager
async def tasks_client(url: str, era: str, token: str | None = None) -> AsyncIterator[Client]:
    """A client of `url` over streamable HTTP in `era`, as the bearer `token`'s principal if given."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0)) as http:
        async with Client(streamable_http_client(url, http_client=http), **client_kwargs(era)) as client:
            yield client


async def create_task(client: Client, era: str, tool: str, arguments: dict[str, Any], key: str | None = None) -> str:
    """Create a task of `tool` (a repeat of `key` gets the key's task) and return its id; asserts
    the server answered with a task, not a plain result."""
    if era == "legacy":
        created = await create_legacy_task(client, tool, arguments, key=key)
        task_id: str = created["task"]["taskId"]
        return task_id
    handle = await call_for_task(client, tool, arguments, key)
    assert isinstance(handle, TaskHandle), f"a plain result, not a task: {handle!r}"
    return handle.task_id


async def task_result(client: Client, era: str, task_id: str) -> dict[str, Any]:
    """The result of task `task_id` once it has ended: `tasks/result` (2025-11-25), or the result
    `tasks/get` inlines (2026-07-28); a task that ended without one is an assertion error."""
    if era == "legacy":
        return await request(client, "tasks/result", {"taskId": task_id})
    task = await poll_until_terminal(client, task_id, timeout=60)
    assert "result" in task, f"task {task_id} ended without a result: {task}"
    result: dict[str, Any] = task["result"]
    return result
