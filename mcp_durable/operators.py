"""Operator actions on the journal: resolving an in-doubt call, forgetting one.

An in-doubt call is one whose owner died inside the danger window: nobody knows whether its side
effect happened. Policies settle most of them (retry, reconcile); `refuse` and parked calls wait
for a person, who checks the downstream system and records the verdict here. The CLI
(`mcp-durable journal resolve`), the admin tool (`journal_resolve`) and the console all call this.

`forget` is the other verdict: the record is dropped from the key's history (it expires at
once), so the next call with the key runs as a new call, with any arguments, its durable steps
not replayed.

`rerun` re-runs a completed or failed call under a new attempt, like a fork: the record is
released under a new `run_id`, so the next call with its key (same arguments) runs the tool
again; with `from_step=N` the durable steps before index N are copied into the new run and
replayed, and step N and after run again. Every action journals an audit entry (who, what, why)
as an entry of the process `AUDIT_PROCESS`, which the console shows on the call's page.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Literal, Protocol, get_args

import orjson

from .errors import OperatorError
from .journal.base import Journal
from .journal.model import CallIdentity, CallRecord, CallState, JournalEntry
from .policy import DEFAULT_RETENTION
from .steps import STEP_ENTRY, load_steps, steps_process_id
from .tasks import OPERATOR_CANCELLED

#: An operator's verdicts on a call in doubt (the admin tool's schema, the CLI's and the console's choices).
Resolution = Literal["completed", "failed", "not_applied"]
RESOLUTIONS: tuple[Resolution, ...] = get_args(Resolution)
#: The process whose entries are the audit trail of operator actions (one `AUDIT_ENTRY` each).
AUDIT_PROCESS = "mcp-durable/operator-actions"
AUDIT_ENTRY = "operator_action"


class Engine(Protocol):
    """What an operator action uses of the engine (`mcp_durable.engine.Engine` is one): its
    journal and clock, whether a pending record's owner is alive, and its change listeners.
    A protocol, not the class, so this module does not import the engine that calls it."""

    @property
    def journal(self) -> Journal: ...

    @property
    def clock(self) -> Callable[[], float]: ...

    def owner_alive(self, record: CallRecord, now: float) -> bool: ...

    async def notify_changed(self, record: CallRecord) -> None: ...


async def resolve(
    engine: Engine,
    identity: CallIdentity,
    resolution: str,
    *,
    payload: bytes | None = None,
    note: str = "",
    retention: float | None = DEFAULT_RETENTION,
    by: str = "",
) -> CallRecord:
    """Record an operator's verdict on an in-doubt (or released, or dead-owner pending) call.

    `resolution` is `"completed"` (the effect happened; `payload` is the result to replay),
    `"failed"` (replay `payload`, an error result, from now on) or `"not_applied"` (the effect
    did not happen: the next call with this key runs). Raises `OperatorError` when there is no
    such record, it is not in doubt, or the payload is missing or not JSON. A call still running
    (its owner alive) cannot be resolved. `by` names the operator in the audit entry.
    """
    if resolution not in RESOLUTIONS:
        raise OperatorError(f"resolution must be completed, failed or not_applied, not {resolution!r}")
    if resolution != "not_applied":
        if payload is None:
            raise OperatorError(f"resolving as {resolution} needs the result to replay")
        try:
            orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            raise OperatorError(f"the result to replay must be JSON: {exc}") from exc
    suffix = f": {note}" if note else ""
    while True:
        record, now = await _undecided(engine, identity)
        expires = None if retention is None else now + retention
        if resolution == "not_applied":
            resolved = record.evolve(state=CallState.RELEASED, owner=None, lease_until=None, updated_at=now,
                                     error=f"resolved not applied by an operator{suffix}", expires_at=expires)
        else:
            state = CallState.COMPLETED if resolution == "completed" else CallState.FAILED
            resolved = record.evolve(state=state, owner=None, lease_until=None, updated_at=now, completed_at=now,
                                     result=payload, expires_at=expires,
                                     error=f"resolved {resolution} by an operator{suffix}")
        # A lost swap means the record moved meanwhile (a retry took it over, another operator):
        # re-read and judge again.
        if await engine.journal.swap(record.version, resolved):
            await _audit(engine, record, resolved, f"resolve {resolution}", by=by, note=note)
            await engine.notify_changed(resolved)
            return resolved


async def forget(engine: Engine, identity: CallIdentity, *, by: str = "", note: str = "") -> CallRecord:
    """Forget an in-doubt (or released, or dead-owner pending) call: the key may run again.

    The record becomes RELEASED and expires now, so the next call with the key claims it as a
    new call (a new run, any arguments, no durable step replayed) and a purge drops it. Use it
    when the effect did not happen and the call should not be resumed, or when a caller must be
    free to reuse the key with other arguments. Raises `OperatorError` like `resolve`. `by` and
    `note` (who, why) are journaled in the audit entry.
    """
    suffix = f": {note}" if note else ""
    while True:
        record, now = await _undecided(engine, identity)
        forgotten = record.evolve(state=CallState.RELEASED, owner=None, lease_until=None, updated_at=now,
                                  expires_at=now, error=f"forgotten by an operator{suffix}")
        if await engine.journal.swap(record.version, forgotten):
            await _audit(engine, record, forgotten, "forget", by=by, note=note)
            await engine.notify_changed(forgotten)
            return forgotten


async def cancel(
    engine: Engine,
    identity: CallIdentity,
    *,
    by: str = "",
    note: str = "",
    retention: float | None = DEFAULT_RETENTION,
) -> CallRecord:
    """Cancel a running call (or one in doubt): it is never resumed.

    The record becomes RELEASED with `error` "cancelled by an operator…" (`tasks.is_cancelled`).
    Its owner stops the tool: at once when it runs in this process (`Engine.cancel`), else at its
    next lease renewal (the renewal finds the record no longer its own, reads why, and cancels
    the run) or its next durable step (which reads the record first), whichever comes first; the
    caller is answered `cancelled`, and so is every repeat of the key until the record expires
    (`retention`) or is forgotten. Raises `OperatorError` for no such call, or one that is not
    running or in doubt (completed, failed, released).
    """
    suffix = f": {note}" if note else ""
    while True:
        record, now = await _current(engine, identity)
        if record.state not in (CallState.PENDING, CallState.IN_DOUBT):
            raise OperatorError(f"call {identity.tool}/{identity.key} is {record.state.value}: only a running or "
                                "in-doubt call can be cancelled")
        cancelled = record.evolve(state=CallState.RELEASED, owner=None, lease_until=None, updated_at=now,
                                  expires_at=None if retention is None else now + retention,
                                  error=f"{OPERATOR_CANCELLED}{suffix}"[:500])
        if await engine.journal.swap(record.version, cancelled):
            await _audit(engine, record, cancelled, "cancel", by=by, note=note)
            await engine.notify_changed(cancelled)
            return cancelled


async def rerun(
    engine: Engine,
    identity: CallIdentity,
    *,
    from_step: int | None = None,
    by: str = "",
    note: str = "",
    retention: float | None = DEFAULT_RETENTION,
) -> CallRecord:
    """Re-run a completed or failed call under a new attempt, optionally from durable step `from_step`.

    The record becomes RELEASED under a new `run_id` (its result is dropped; the audit entry
    keeps what it was), so the next call with its key and arguments takes it over and runs the
    tool as attempt `attempts + 1`. `from_step=N` copies the first N journaled steps (indexes
    0 … N-1) into the new run, so they are replayed and steps N and after run again; None runs
    every step again. Raises `OperatorError` for no such call, a call that is not completed or
    failed, or a `from_step` beyond the steps the call journaled.
    """
    suffix = f": {note}" if note else ""
    while True:
        record, now = await _current(engine, identity)
        if not record.state.is_final:
            raise OperatorError(f"call {identity.tool}/{identity.key} is {record.state.value}: only a completed or "
                                "failed call can be re-run (resolve or forget one in doubt)")
        run_id = os.urandom(16).hex()
        if from_step is not None:
            steps = await load_steps(engine.journal, record.run_id)
            if not 0 <= from_step <= len(steps):
                raise OperatorError(f"call {identity.tool}/{identity.key} journaled {len(steps)} step(s): "
                                    f"from_step must be 0 … {len(steps)}, not {from_step}")
            for step in steps[:from_step]:
                await engine.journal.append(steps_process_id(run_id), STEP_ENTRY, step.data, now)
        released = record.evolve(state=CallState.RELEASED, run_id=run_id, owner=None, lease_until=None, result=None,
                                 completed_at=None, updated_at=now,
                                 expires_at=None if retention is None else now + retention,
                                 error=f"re-run requested by an operator"
                                       f"{'' if from_step is None else f' from step {from_step}'}{suffix}")
        if await engine.journal.swap(record.version, released):
            action = "rerun" if from_step is None else f"rerun from step {from_step}"
            await _audit(engine, record, released, action, by=by, note=note)
            await engine.notify_changed(released)
            return released


async def _current(engine: Engine, identity: CallIdentity) -> tuple[CallRecord, float]:
    """The record of `identity`, and now; `OperatorError` when there is none (or it expired: an
    expired, e.g. forgotten, record is no call any more)."""
    record = await engine.journal.get(identity)
    now = engine.clock()
    if record is None or record.is_expired(now):
        raise OperatorError(f"no call {identity.tool}/{identity.key} for principal {identity.principal}")
    return record, now


async def _undecided(engine: Engine, identity: CallIdentity) -> tuple[CallRecord, float]:
    """The record an operator may act on, and now; `OperatorError` when there is none."""
    record, now = await _current(engine, identity)
    dead_pending = record.state == CallState.PENDING and not engine.owner_alive(record, now)
    if record.state not in (CallState.IN_DOUBT, CallState.RELEASED) and not dead_pending:
        raise OperatorError(f"call {identity.tool}/{identity.key} is {record.state.value}, not in doubt")
    return record, now


async def _audit(engine: Engine, before: CallRecord, after: CallRecord, action: str, *, by: str, note: str) -> None:
    """Journal who did what to which call, and why (after the change itself is durable)."""
    i = before.identity
    data: dict[str, Any] = {"action": action, "principal": i.principal, "tool": i.tool, "key": i.key,
                            "run_id": before.run_id, "from": before.state.value, "to": after.state.value,
                            "by": by or "operator", "note": note}
    await engine.journal.append(AUDIT_PROCESS, AUDIT_ENTRY, data, after.updated_at)


async def audit_entries(journal: Journal, identity: CallIdentity) -> list[JournalEntry]:
    """The audit entries of operator actions on the call `identity`, oldest first."""
    entries = await journal.entries(process_id=AUDIT_PROCESS)
    return [e for e in entries if e.entry_type == AUDIT_ENTRY and (e.data.get("principal"), e.data.get("tool"),
            e.data.get("key")) == (identity.principal, identity.tool, identity.key)]
