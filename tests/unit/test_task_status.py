"""A task's status is derived from its call record (mcp_durable/tasks.py): the table, row by row.

Its typed `reason` decides, never the `error` text (which is for people): a record whose text
reads like a cancel but whose reason says otherwise is not cancelled."""

from __future__ import annotations

import pytest

from mcp_durable import ToolPolicy
from mcp_durable.journal import CallIdentity, CallRecord, CallState, Reason
from mcp_durable.tasks import CANCELLED_REASON, new_task_id, task_view


def record(
    state: CallState, *, error: str | None = None, attempts: int = 1, reason: Reason | None = None
) -> CallRecord:
    return CallRecord(
        identity=CallIdentity("local", "t", "k"),
        fingerprint="f",
        state=state,
        version=1,
        run_id="r",
        attempts=attempts,
        created_at=1.0,
        updated_at=1.0,
        error=error,
        task_id="task",
        reason=reason,
    )


RETRY, REFUSE = ToolPolicy(in_doubt="retry"), ToolPolicy(in_doubt="refuse")


@pytest.mark.parametrize(
    ("row", "policy", "status", "is_error_result"),
    [
        (record(CallState.PENDING), RETRY, "working", False),
        (record(CallState.COMPLETED), RETRY, "completed", False),
        (record(CallState.FAILED), RETRY, "completed", True),
        (record(CallState.IN_DOUBT), RETRY, "working", False),
        (record(CallState.IN_DOUBT), REFUSE, "failed", False),
        (record(CallState.IN_DOUBT, attempts=5), RETRY, "failed", False),  # parked
        (
            record(CallState.IN_DOUBT, error="reconcile failed: OSError: down", reason=Reason.HOOK_FAILED),
            RETRY,
            "failed",
            False,
        ),
        (record(CallState.IN_DOUBT, reason=Reason.PARKED), RETRY, "failed", False),
        (record(CallState.IN_DOUBT, reason=Reason.TIMED_OUT), RETRY, "working", False),
        (record(CallState.IN_DOUBT), None, "failed", False),  # its tool is gone
        (
            record(CallState.RELEASED, error=CANCELLED_REASON, reason=Reason.REQUESTOR_CANCELLED),
            RETRY,
            "cancelled",
            False,
        ),
        (record(CallState.RELEASED, reason=Reason.OPERATOR_CANCELLED), RETRY, "cancelled", False),
        (record(CallState.RELEASED, error=CANCELLED_REASON, reason=Reason.EXCEPTION), RETRY, "failed", False),
        (record(CallState.RELEASED, error="ValueError: boom"), RETRY, "failed", False),
    ],
)
def test_a_tasks_status_follows_its_record(
    row: CallRecord, policy: ToolPolicy | None, status: str, is_error_result: bool
) -> None:
    view = task_view(row, policy)
    assert (view.status, view.is_error_result) == (status, is_error_result)
    assert view.terminal == (status in ("completed", "failed", "cancelled"))


def test_task_ids_are_unguessable_and_unique() -> None:
    ids = {new_task_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(len(i) == 32 for i in ids)  # 24 random bytes, URL-safe base64: 192 bits
