"""MCP tasks as journaled calls: ids, and a task's status derived from its call record. Pure.

A task is not a second store beside the journal: it IS a call record with a `task_id`. Its
status is read off the record's state and `reason` (`journal.model.Reason`), so it survives
whatever the record survives (restarts, other replicas) and can never disagree with it:

| record                                        | task status                                   |
|-----------------------------------------------|-----------------------------------------------|
| PENDING                                       | working                                       |
| COMPLETED                                     | completed                                     |
| FAILED (the tool's deliberate error)          | completed with an error result (see below)    |
| IN_DOUBT, policy retry / reconcile            | working (it is resumed)                       |
| IN_DOUBT, policy refuse, reason PARKED or     | failed (`in_doubt`)                           |
|   HOOK_FAILED, or its tool gone               |                                               |
| RELEASED, reason REQUESTOR/OPERATOR_CANCELLED | cancelled                                     |
| RELEASED, reason TOOL_ERROR, its result kept  | completed with an error result (see below)    |
| RELEASED otherwise (exception, operator)      | failed                                        |

A tool's error result released by policy (`tool_errors="release"`) is kept with the record: not as
the key's outcome (the next call with the key runs again, and a retry of a task-creating call is a
new task), but as the result of the task the call was (`has_task_result`).

A task whose status is terminal (completed, failed, cancelled) is never changed by a cancel.

A `working` task whose tool waits for an answer of its requestor (a journaled question without
an answer, `engine/tasks.py`) is `input_required`: `task_view(..., waiting=True)`.

The two protocol generations disagree on a tool's `isError` result: 2025-11-25 calls the task
`failed`, 2026-07-28 `completed` (with `result.isError`). `TaskView.is_error_result` carries
the difference; the MCP face picks the word.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Literal

from .journal.model import CallRecord, CallState, Reason
from .policy import ToolPolicy

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]

#: The `error` text (for people) of a record released by `tasks/cancel`.
CANCELLED_REASON = "cancelled by the task's requestor"


def new_task_id() -> str:
    """An unguessable task id: 192 random bits, URL-safe (32 characters)."""
    return secrets.token_urlsafe(24)


@dataclass(frozen=True, slots=True)
class TaskView:
    """A task as the journal shows it: its status, why, and whether its result is an error result."""

    status: TaskStatus
    message: str | None
    is_error_result: bool = False  # a FAILED record: the tool's own isError result

    @property
    def terminal(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


def task_view(record: CallRecord, policy: ToolPolicy | None, *, waiting: bool = False) -> TaskView:
    """The status of the task `record` is. `policy` is its tool's (None: the tool is gone).
    `waiting`: the task has questions to its requestor without an answer; a task that would be
    `working` is then `input_required` (one resumed after a restart too: its question stands)."""
    view = _task_view(record, policy)
    if waiting and view.status == "working":
        return TaskView("input_required", "waiting for input from the requestor")
    return view


def _task_view(record: CallRecord, policy: ToolPolicy | None) -> TaskView:
    state = record.state
    if state == CallState.PENDING:
        return TaskView("working", None)
    if state == CallState.COMPLETED:
        return TaskView("completed", None)
    if state == CallState.FAILED or error_result_kept(record):
        return TaskView("completed", "the tool returned an error result", is_error_result=True)
    if state == CallState.IN_DOUBT:
        if in_doubt_refused(record, policy):
            return TaskView("failed", "in_doubt: the server stopped inside this call; an operator must resolve it")
        return TaskView("working", "resuming after the server that ran it stopped")
    if record.cancelled:
        return TaskView("cancelled", "cancelled")
    return TaskView("failed", record.error or "the call was released without a result")


def error_result_kept(record: CallRecord) -> bool:
    """Whether `record` was released with its tool's error result kept (`tool_errors="release"`):
    the result of its task, though the key runs again on its next call."""
    return record.state == CallState.RELEASED and record.reason is Reason.TOOL_ERROR and record.result is not None


def has_task_result(record: CallRecord) -> bool:
    """Whether `record` holds its tool's result: final, or an error result released by policy."""
    return record.state.is_final or error_result_kept(record)


def in_doubt_refused(record: CallRecord, policy: ToolPolicy | None) -> bool:
    """Whether an in-doubt call will not be run again by its policy: refuse, parked (its
    attempts spent), its reconcile hook could not tell, or its tool is gone."""
    if record.state != CallState.IN_DOUBT:
        return False
    if policy is None or record.attempts >= policy.max_attempts:
        return True
    return record.reason in (Reason.PARKED, Reason.HOOK_FAILED) or policy.in_doubt_policy == "refuse"
