"""A proxied call run as the upstream's own MCP task, for a tool the upstream serves only as a
task (`execution.taskSupport: "required"`): a plain `tools/call` of it is refused there.

The proxy serves such a tool's tasks to its clients itself (a journaled call, server/tasks.py);
the run of one does, on the upstream (2025-11-25): a task-augmented `tools/call` with the call's
`_meta` (the scoped idempotency key in it), `tasks/get` until the upstream's task is terminal (or
asks for input), then `tasks/result`, whose answer is the call's: a result, an error result, or
the JSON-RPC error of a failed task, as the upstream gave it. A run cancelled (the proxy's task
cancelled, or its policy's timeout) asks the upstream to cancel its task before it ends.

What that keeps: the proxy journals one call per key, as for any proxied call, and runs it
upstream once per run. A proxy killed mid-run resumes the call by its in-doubt policy; an
upstream that honours keys (a `DurableServer`) answers the resent key with the task it already
has, so the effect still happens once.

Only on a session that speaks 2025-11-25 (the proxy's default upstream era, `supported`): a
2026-07-28 session claims tasks through the tasks extension, which the proxy does not declare
upstream.
"""

from __future__ import annotations

from contextlib import suppress
from typing import Any

import anyio
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Request
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from ..server.sdk_internals import send_raw_request
from .upstream import UpstreamLost, UpstreamSession

#: The statuses after which `tasks/result` answers at once (with `input_required`, it is
#: `tasks/result` that carries the upstream's questions, and it waits for the end itself).
ANSWERABLE = frozenset({"completed", "failed", "cancelled", "input_required"})
#: Bounds of the wait between two `tasks/get` (the upstream's `pollInterval` within them).
POLL_MIN_S = 0.02
POLL_MAX_S = 1.0
#: How long a cancelled run waits for the upstream to take its `tasks/cancel`.
CANCEL_WAIT_S = 5.0
_RAW = TypeAdapter(dict[str, Any])


def supported(client: Client) -> bool:
    """Whether calls can be forwarded as upstream tasks on `client`'s session (2025-11-25)."""
    return client.session.protocol_version not in MODERN_PROTOCOL_VERSIONS


async def call_tool_as_task(
    session: UpstreamSession, name: str, arguments: dict[str, Any], meta: dict[str, Any]
) -> CallToolResult:
    """Run `name` with `arguments` as the upstream's task and return its result.

    Raises an `MCPError` the upstream answered to the task-augmented call (nothing ran) or to
    `tasks/result` (the task failed with it); `UpstreamLost` when the outcome is unknown: the
    connection broke, or the upstream could not say how its task went."""
    client = await session.client()
    params: dict[str, Any] = {"name": name, "arguments": arguments, "task": {}}
    if meta:
        params["_meta"] = meta
    with session.breaks_as_lost():
        # The session would validate a `CreateTaskResult` as a `CallToolResult`: sent raw.
        created = await send_raw_request(client.session, "tools/call", params)
    task = created.get("task")
    if not isinstance(task, dict) or not isinstance(task.get("taskId"), str):
        return CallToolResult.model_validate(created, by_name=False)  # answered without a task
    task_id: str = task["taskId"]
    try:
        while task.get("status") not in ANSWERABLE:
            await anyio.sleep(_poll_interval(task))
            try:
                with session.breaks_as_lost():
                    task = await _request(client, "tasks/get", {"taskId": task_id})
            except MCPError as exc:  # created, maybe run: its outcome is not known
                raise UpstreamLost(
                    session.spec.masked(f"the upstream's task {task_id} could not be read: {exc}")
                ) from exc
        with session.breaks_as_lost():
            answered = await _request(client, "tasks/result", {"taskId": task_id})
    except anyio.get_cancelled_exc_class():
        # The run is in doubt whatever the upstream answers: the engine records it so.
        with anyio.CancelScope(shield=True), anyio.move_on_after(CANCEL_WAIT_S):
            with suppress(MCPError, UpstreamLost), session.breaks_as_lost():
                await _request(client, "tasks/cancel", {"taskId": task_id})
        raise
    return CallToolResult.model_validate(answered, by_name=False)


def _poll_interval(task: dict[str, Any]) -> float:
    interval = task.get("pollInterval")
    seconds = interval / 1000 if isinstance(interval, int | float) else POLL_MIN_S
    return min(POLL_MAX_S, max(POLL_MIN_S, seconds))


async def _request(client: Client, method: str, params: dict[str, Any]) -> dict[str, Any]:
    # mcp bounds the result type by BaseModel, but validates with any TypeAdapter: the raw answer.
    answered: dict[str, Any] = await client.session.send_request(  # type: ignore[type-var]
        Request[Any, Any](method=method, params=params), _RAW
    )
    return answered
