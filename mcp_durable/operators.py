"""Operator actions on the journal: resolving an in-doubt call.

An in-doubt call is one whose owner died inside the danger window: nobody knows whether its side
effect happened. Policies settle most of them (retry, reconcile); `refuse` and parked calls wait
for a person, who checks the downstream system and records the verdict here. The CLI
(`mcp-durable journal resolve`) and the admin tool (`journal_resolve`) both call this.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from .errors import OperatorError
from .journal.model import CallIdentity, CallRecord, CallState
from .policy import DEFAULT_RETENTION

if TYPE_CHECKING:
    from .engine import Engine

RESOLUTIONS = ("completed", "failed", "not_applied")


async def resolve(
    engine: Engine,
    identity: CallIdentity,
    resolution: str,
    *,
    payload: bytes | None = None,
    note: str = "",
    retention: float | None = DEFAULT_RETENTION,
) -> CallRecord:
    """Record an operator's verdict on an in-doubt (or released, or dead-owner pending) call.

    `resolution` is `"completed"` (the effect happened; `payload` is the result to replay),
    `"failed"` (replay `payload`, an error result, from now on) or `"not_applied"` (the effect
    did not happen: the next call with this key runs). Raises `OperatorError` when there is no
    such record, it is not in doubt, or the payload is missing or not JSON. A call still running
    (its owner alive) cannot be resolved.
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
        record = await engine.journal.get(identity)
        if record is None:
            raise OperatorError(f"no call {identity.tool}/{identity.key} for principal {identity.principal}")
        now = engine.clock()
        dead_pending = record.state == CallState.PENDING and not engine.owner_alive(record, now)
        if record.state not in (CallState.IN_DOUBT, CallState.RELEASED) and not dead_pending:
            raise OperatorError(f"call {identity.tool}/{identity.key} is {record.state.value}, not in doubt")
        expires = None if retention is None else now + retention
        if resolution == "not_applied":
            resolved = record.evolve(state=CallState.RELEASED, owner=None, lease_until=None, updated_at=now,
                                     error=f"resolved not applied by an operator{suffix}", expires_at=expires)  # fmt: skip
        else:
            state = CallState.COMPLETED if resolution == "completed" else CallState.FAILED
            resolved = record.evolve(state=state, owner=None, lease_until=None, updated_at=now, completed_at=now,
                                     result=payload, expires_at=expires,
                                     error=f"resolved {resolution} by an operator{suffix}")  # fmt: skip
        # A lost swap means the record moved meanwhile (a retry took it over, another operator):
        # re-read and judge again.
        if await engine.journal.swap(record.version, resolved):
            await engine.notify_changed(resolved)
            return resolved
