"""Every change of a call record, as one named pure function: a record in, its successor out.

The engine (calls, tasks, start-up sweep) and the operators' verdicts (`operators.judge`) move
records only through these, so each transition of the state table in docs/architecture.md is
spelled once. None does I/O or reads the clock: `now` is passed in. Each returns a record whose
version is one more than its input's (`CallRecord.evolve`), ready for `Journal.swap`.

    (none) ──claimed──▶ PENDING ──finished──▶ COMPLETED | FAILED
                          │ │ └──released(reason)──▶ RELEASED      (exception, interim, cancel, …)
                          │ └──doubted(reason)────▶ IN_DOUBT       (lost owner, timeout, outcome unknown)
      RELEASED | IN_DOUBT ──taken_over──▶ PENDING (attempts + 1, same run: durable steps replay)
      IN_DOUBT ──owned_to_reconcile──▶ PENDING (same attempt; the hook decides)
      IN_DOUBT ──parked──▶ IN_DOUBT (reason PARKED: only an operator moves it on)
"""

from __future__ import annotations

import dataclasses
import os

from ..journal.model import CallIdentity, CallRecord, CallState, Reason


def new_run_id() -> str:
    """A new run: 128 random bits, hex."""
    return os.urandom(16).hex()


def expiry(now: float, retention: float | None) -> float | None:
    """When a record kept for `retention` seconds from `now` expires (None: never)."""
    return None if retention is None else now + retention


def claimed(
    identity: CallIdentity,
    fingerprint: str,
    arguments: bytes,
    owner: str,
    now: float,
    lease: float,
    task_id: str | None = None,
) -> CallRecord:
    """A new PENDING record of `owner`, attempt 1 of a new run: what a claim inserts."""
    return CallRecord(
        identity=identity,
        fingerprint=fingerprint,
        state=CallState.PENDING,
        version=1,
        run_id=new_run_id(),
        attempts=1,
        created_at=now,
        updated_at=now,
        owner=owner,
        lease_until=now + lease,
        arguments=arguments,
        task_id=task_id,
    )


def taken_over(record: CallRecord, owner: str, now: float, lease: float, task_id: str | None) -> CallRecord:
    """A RELEASED or IN_DOUBT record run again by `owner` as the next attempt of the same run.

    `expires_at` is cleared (a released record's retention must not let a fresh claim replace the
    run now in progress); `task_id` is the task the new attempt is (None: a plain call); a result
    the released record kept (an error result released by policy) goes: the new attempt has none."""
    return record.evolve(
        state=CallState.PENDING,
        owner=owner,
        lease_until=now + lease,
        attempts=record.attempts + 1,
        updated_at=now,
        expires_at=None,
        task_id=task_id,
        reason=None,
        result=None,
    )


def owned_to_reconcile(record: CallRecord, owner: str, now: float, lease: float) -> CallRecord:
    """An IN_DOUBT record owned by `owner` while its reconcile hook asks the downstream system
    (same attempt: nothing runs unless the hook says the effect did not happen)."""
    return record.evolve(
        state=CallState.PENDING, owner=owner, lease_until=now + lease, updated_at=now, expires_at=None, reason=None
    )


def next_attempt(record: CallRecord, now: float) -> CallRecord:
    """A record its owner goes on to run as the next attempt (a reconcile hook found nothing)."""
    return record.evolve(attempts=record.attempts + 1, updated_at=now)


def finished(record: CallRecord, payload: bytes, is_error: bool, now: float, retention: float | None) -> CallRecord:
    """A run's persisted outcome: COMPLETED, or FAILED for a deliberate error result."""
    return record.evolve(
        state=CallState.FAILED if is_error else CallState.COMPLETED,
        owner=None,
        lease_until=None,
        completed_at=now,
        updated_at=now,
        result=payload,
        expires_at=expiry(now, retention),
        reason=None,
    )


def released(
    record: CallRecord,
    reason: Reason,
    now: float,
    expires_at: float | None,
    error: str,
    result: bytes | None = None,
) -> CallRecord:
    """A record let go for `reason`: the next call with its key runs again, unless the reason is a
    cancel (`Reason.cancelled`). It keeps no result, but for an error result released by policy
    (`Reason.TOOL_ERROR`, `result`): not the key's outcome, only its task's (`tasks.task_view`)."""
    return record.evolve(
        state=CallState.RELEASED,
        owner=None,
        lease_until=None,
        updated_at=now,
        expires_at=expires_at,
        reason=reason,
        error=error[:500],
        result=result if reason is Reason.TOOL_ERROR else None,
    )


def rerun_requested(record: CallRecord, now: float, expires_at: float | None, error: str) -> CallRecord:
    """A final record an operator re-runs: RELEASED under a new run, its result dropped (the
    audit entry keeps what it was), so the next call with its key runs as the next attempt."""
    return record.evolve(
        state=CallState.RELEASED,
        run_id=new_run_id(),
        owner=None,
        lease_until=None,
        result=None,
        completed_at=None,
        updated_at=now,
        expires_at=expires_at,
        reason=Reason.RERUN,
        error=error[:500],
    )


def doubted(record: CallRecord, reason: Reason, now: float, error: str | None = None) -> CallRecord:
    """A record whose outcome nobody knows (its owner died, its run timed out, …): IN_DOUBT."""
    return record.evolve(
        state=CallState.IN_DOUBT,
        owner=None,
        lease_until=None,
        updated_at=now,
        reason=reason,
        error=None if error is None else error[:500],
    )


def parked(record: CallRecord, now: float) -> CallRecord:
    """An IN_DOUBT record past its `max_attempts`: no policy runs it again, only an operator."""
    return record.evolve(
        reason=Reason.PARKED,
        updated_at=now,
        error=f"parked after {record.attempts} attempt(s): an operator must resolve it",
    )


def resolved(
    record: CallRecord, state: CallState, payload: bytes, now: float, expires_at: float | None, error: str
) -> CallRecord:
    """A record an operator resolved as COMPLETED or FAILED with `payload`, the result to replay."""
    return record.evolve(
        state=state,
        owner=None,
        lease_until=None,
        updated_at=now,
        completed_at=now,
        result=payload,
        expires_at=expires_at,
        error=error[:500],
        reason=None,
    )


def rebased(record: CallRecord, current: CallRecord) -> CallRecord:
    """`record`'s content as the successor of `current`, a record the same owner still holds
    (`current.held_by(fence)`) whose version moved meanwhile: a task id attached by `submit`."""
    return dataclasses.replace(record, version=current.version + 1, task_id=current.task_id or record.task_id)
