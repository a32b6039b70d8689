"""The Python client's side of MCP tasks, for tests (the SDK 2.3 client has no tasks API).

- 2026-07-28: `TasksClient` is a real `ClientExtension`: it declares `io.modelcontextprotocol/tasks`
  and claims `resultType: "task"` on `tools/call`; `client.session.call_tool(...,
  allow_claimed=True)` then returns a `TaskHandle`, and `Client.call_tool` resolves it by
  polling `tasks/get` until the task is terminal.
- 2025-11-25: `request()` sends `tasks/*` through the session (the SDK does not validate methods it
  does not know). A task-augmented `tools/call` answers `{"task": …}`, which the session would
  validate as a `CallToolResult`, so `create_legacy_task()` sends it on the session's dispatcher.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import anyio
import pytest
from mcp import Client, MCPError
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp_types import CallToolResult, Request, Result
from pydantic import ConfigDict, TypeAdapter

from mcp_durable import KEY_META
from mcp_durable.server.tasks import TASKS_EXTENSION
from tests.helpers import key_meta

_ANY = TypeAdapter(dict[str, Any])


class TaskHandle(Result):
    """A 2026-07-28 `CreateTaskResult` (flat: the task's fields beside `resultType: "task"`)."""

    model_config = ConfigDict(extra="allow")

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    ttl_ms: int | None = None
    poll_interval_ms: int | None = None


async def request(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send `method` with `params` and return the raw result (raises `MCPError` on an error)."""
    # mcp bounds the result type by BaseModel, but validates with any TypeAdapter: these tests want the raw dict.
    result: dict[str, Any] = await client.session.send_request(  # type: ignore[type-var]
        Request[Any, Any](method=method, params=params), _ANY
    )
    return result


async def poll_until_terminal(client: Client, task_id: str, *, timeout: float = 30.0) -> dict[str, Any]:
    """`tasks/get` until the task is completed, failed or cancelled; the last answer."""
    with anyio.fail_after(timeout):
        while True:
            task = await request(client, "tasks/get", {"taskId": task_id})
            if task["status"] in ("completed", "failed", "cancelled"):
                return task
            await anyio.sleep(min(0.05, (task.get("pollIntervalMs") or task.get("pollInterval") or 50) / 1000))


async def _resolve(handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
    task_id = handle.task_id
    with anyio.fail_after(30):
        while True:
            task: dict[str, Any] = await ctx.session.send_request(  # type: ignore[type-var]  # as in `request`
                Request[Any, Any](method="tasks/get", params={"taskId": task_id}), _ANY
            )
            if task["status"] == "completed":
                return CallToolResult.model_validate(task["result"], by_name=False)
            if task["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"task {task_id} ended {task['status']}: {task.get('error')}")
            await anyio.sleep(0.05)


class TasksClient(ClientExtension):
    """The Python client's 2026-07-28 tasks extension (declares it, resolves task results)."""

    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return (ResultClaim(result_type="task", model=TaskHandle, resolve=_resolve),)


async def call_for_task(client: Client, name: str, arguments: dict[str, Any], key: str | None = None) -> Any:
    """A 2026-07-28 `tools/call` that may answer with a task: a `TaskHandle` or a `CallToolResult`."""
    meta = key_meta(key) if key is not None else None
    return await client.session.call_tool(name, arguments, meta=meta, allow_claimed=True)


async def create_legacy_task(
    client: Client, name: str, arguments: dict[str, Any], *, key: str | None = None, ttl: int | None = None
) -> dict[str, Any]:
    """A 2025-11-25 task-augmented `tools/call`; returns the `CreateTaskResult` (`{"task": …}`)."""
    params: dict[str, Any] = {"name": name, "arguments": arguments, "task": {} if ttl is None else {"ttl": ttl}}
    if key is not None:
        params["_meta"] = {KEY_META: key}
    dispatcher = client.session._dispatcher  # the session would validate the answer as a CallToolResult
    result: dict[str, Any] = await dispatcher.send_raw_request("tools/call", params, None)
    return result


async def wait_for_question(client: Client, task_id: str, key: str) -> dict[str, Any]:
    """2026-07-28 `tasks/get` until the task is `input_required` with question `key`; that answer."""
    with anyio.fail_after(30):  # a bound on a hang, not a timing assertion
        while True:
            task = await request(client, "tasks/get", {"taskId": task_id})
            assert task["status"] in ("working", "input_required"), task
            if task["status"] == "input_required" and key in task.get("inputRequests", {}):
                return task
            await anyio.sleep(0.05)


async def refused(client: Client, method: str, params: dict[str, Any]) -> MCPError:
    """The `MCPError` `method` with `params` is refused with (fails if it is answered)."""
    with pytest.raises(MCPError) as raised:
        await request(client, method, params)
    return raised.value


def accept(**content: Any) -> dict[str, Any]:
    """An input response accepting with `content`."""
    return {"action": "accept", "content": content}
