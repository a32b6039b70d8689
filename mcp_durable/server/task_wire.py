"""The wire shapes of MCP tasks in both generations, from a task's call record and its tool's policy.

Pure: no server, no I/O. `server/tasks.py` serves the methods; this module only says what a
task, its result and a `tasks/list` cursor look like on the wire.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

import orjson
from mcp import MCPError
from mcp_types import CallToolResult, TextContent
from mcp_types.jsonrpc import INTERNAL_ERROR, INVALID_PARAMS
from pydantic import BaseModel

from ..journal import CallCursor, CallIdentity, CallRecord, CallState
from ..policy import ToolPolicy
from ..tasks import TaskView, has_task_result, task_view
from ..views import iso
from .results import META_KEY

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
RELATED_TASK = "io.modelcontextprotocol/related-task"
META_ERROR = "mcp-durable/error"
#: What requestors are told to wait between polls (ms).
POLL_INTERVAL_MS = 500
#: One message for an unknown, expired and another principal's task id: no existence oracle.
TASK_NOT_FOUND = "Failed to retrieve task: Task not found"
#: The 2025-11-25 server capability.
LEGACY_CAPABILITY: dict[str, Any] = {"list": {}, "cancel": {}, "requests": {"tools": {"call": {}}}}


class Notification(BaseModel):
    """A notification the SDK has no model for (`ServerSession.send_notification` dumps it)."""

    method: str
    params: dict[str, Any]


def ttl_ms(policy: ToolPolicy | None) -> int | None:
    """A task's TTL: its tool's retention, in ms (None: unlimited)."""
    retention = policy.retention if policy is not None else None
    return None if retention is None else int(retention * 1000)


def stored_result(record: CallRecord) -> dict[str, Any]:
    """The task's tool result as stored (wire form), with its key in `_meta`."""
    assert record.result is not None
    result: dict[str, Any] = orjson.loads(record.result)
    result["_meta"] = {**result.get("_meta", {}), META_KEY: record.identity.key}
    return result


def failure(record: CallRecord, view: TaskView) -> tuple[str, str]:
    """(code, message) of a task that ended without a result of its tool."""
    if record.state == CallState.IN_DOUBT:
        return "in_doubt", view.message or "in doubt"
    if view.status == "cancelled":
        return "cancelled", "the task was cancelled"
    return "failed", f"the tool failed: {record.error or 'no result'}"


def legacy_task(
    record: CallRecord, policy: ToolPolicy | None, inputs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A 2025-11-25 `Task`: a tool's error result makes the task `failed`. `inputs`: its
    questions waiting for an answer (the task is then `input_required`)."""
    view = task_view(record, policy, waiting=bool(inputs))
    task: dict[str, Any] = {
        "taskId": record.task_id,
        "status": "failed" if view.is_error_result else view.status,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.updated_at),
        "ttl": ttl_ms(policy),
        "pollInterval": POLL_INTERVAL_MS,
    }
    if view.message:
        task["statusMessage"] = view.message
    return task


def modern_task(
    record: CallRecord, policy: ToolPolicy | None, *, detailed: bool, inputs: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """A 2026-07-28 `Task` (`detailed`: a `DetailedTask`, the result or error inlined, and the
    `inputRequests` of an `input_required` task). `inputs`: its questions waiting for an answer,
    by key (`{"method", "params"}` each)."""
    view = task_view(record, policy, waiting=bool(inputs))
    task: dict[str, Any] = {
        "taskId": record.task_id,
        "status": view.status,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.updated_at),
        "ttlMs": ttl_ms(policy),
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if view.message and not view.is_error_result:
        task["statusMessage"] = view.message
    if detailed and view.status == "completed":
        # ext-tasks 0.2.2 fails a completed task whose inlined result lacks `resultType`.
        task["result"] = {**stored_result(record), "resultType": "complete"}
    elif detailed and view.status == "failed":
        code, message = failure(record, view)
        task["error"] = {"code": INTERNAL_ERROR, "message": message, "data": {"error": code}}
    elif detailed and view.status == "input_required" and inputs:
        task["inputRequests"] = dict(inputs)
    return task


def legacy_payload(record: CallRecord, policy: ToolPolicy | None) -> dict[str, Any]:
    """What 2025-11-25 `tasks/result` answers for a terminal task: the call's own result (or
    error), marked with the related task. Raises `MCPError` for a cancelled task."""
    related = {RELATED_TASK: {"taskId": record.task_id}}
    if has_task_result(record):
        result = stored_result(record)
        result["_meta"] = {**result["_meta"], **related}
        return result
    code, message = failure(record, task_view(record, policy))
    if code == "cancelled":
        raise MCPError(code=INTERNAL_ERROR, message="Task was cancelled", data={"error": code})
    # No structuredContent: it would have to match the tool's output schema.
    failed = CallToolResult(content=[TextContent(type="text", text=f"{code}: {message}")], is_error=True)
    dumped = failed.model_dump(by_alias=True, mode="json", exclude_none=True)
    dumped["_meta"] = {META_KEY: record.identity.key, META_ERROR: {"error": code, "message": message}, **related}
    return dumped


def encode_cursor(record: CallRecord) -> str:
    """A `tasks/list` cursor: where the listing of the caller's tasks goes on after `record`."""
    raw = orjson.dumps([record.created_at, record.identity.tool, record.identity.key])
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_cursor(principal: str, cursor: str) -> CallCursor:
    """A `tasks/list` cursor back into a listing position (-32602 if it is not one of ours)."""
    try:
        created_at, tool, key = orjson.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        return CallCursor(float(created_at), CallIdentity(principal, str(tool), str(key)))
    except (ValueError, TypeError, UnicodeError, orjson.JSONDecodeError):
        raise MCPError(code=INVALID_PARAMS, message="Invalid cursor") from None
