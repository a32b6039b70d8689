"""Operator actions on a call record, as pure functions: a record and a verdict in, the new record out.

An in-doubt call is one whose owner died inside the danger window: nobody knows whether its side
effect happened. Policies settle most of them (retry, reconcile); `refuse` and parked calls wait
for a person, who checks the downstream system and records the verdict. The CLI (`mcp-durable
journal resolve|forget|cancel|rerun`), the admin tools and the console all act through the
engine (`Engine.resolve`, `forget`, `cancel`, `rerun`), whose one compare-and-swap loop reads
the record, asks `judge` here for its successor, swaps it in (re-reading and judging again when
the record moved meanwhile) and journals the audit entry `audit_entry` describes. No I/O here
except `audit_entries`, the read of that trail.

The verdicts:

- `Resolve`: the effect happened (`completed`, its result to replay), failed (`failed`, an error
  result to replay), or did not (`not_applied`: released, the next call with the key runs).
- `Forget`: the record is dropped from the key's history (it expires at once), so the next call
  with the key runs as a new call, with any arguments, its durable steps not replayed.
- `Cancel`: a running or in-doubt call is released as cancelled and never resumed.
- `Rerun`: a completed or failed call is released under a new `run_id`, like a fork, so the next
  call with its key (same arguments) runs the tool again; with `from_step=N` the durable steps
  before index N are copied into the new run (by the engine, `steps_kept`) and replayed.

Every action journals an audit entry (who, what, why) as an entry of the process
`AUDIT_PROCESS`, which the console shows on the call's page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import orjson

from ..errors import CallNotFoundError, OperatorError
from ..journal.base import Journal
from ..journal.model import CallIdentity, CallRecord, CallState, JournalEntry, Reason
from ..policy import DEFAULT_RETENTION
from . import transitions
from .transitions import expiry

#: An operator's verdicts on a call in doubt (the admin tool's schema, the CLI's and the console's choices).
Resolution = Literal["completed", "failed", "not_applied"]
RESOLUTIONS: tuple[Resolution, ...] = get_args(Resolution)
#: How the `error` text (for people) of a record an operator cancelled begins.
OPERATOR_CANCELLED = "cancelled by an operator"


@dataclass(frozen=True, slots=True, kw_only=True)
class Verdict:
    """What an operator decided, and `by` whom (the audit entry) with what `note` (why)."""

    note: str = ""
    by: str = ""

    @property
    def action(self) -> str:
        """The action as the audit entry names it."""
        raise NotImplementedError

    def suffix(self) -> str:
        return f": {self.note}" if self.note else ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolve(Verdict):
    """The verdict on a call in doubt: `resolution` with `payload`, the result to replay (none for
    `not_applied`). Raises `OperatorError` for an unknown resolution or a missing or non-JSON payload."""

    resolution: str
    payload: bytes | None = None
    retention: float | None = DEFAULT_RETENTION

    def __post_init__(self) -> None:
        if self.resolution not in RESOLUTIONS:
            raise OperatorError(f"resolution must be completed, failed or not_applied, not {self.resolution!r}")
        if self.resolution != "not_applied":
            if self.payload is None:
                raise OperatorError(f"resolving as {self.resolution} needs the result to replay")
            try:
                orjson.loads(self.payload)
            except orjson.JSONDecodeError as exc:
                raise OperatorError(f"the result to replay must be JSON: {exc}") from exc

    @property
    def action(self) -> str:
        return f"resolve {self.resolution}"


@dataclass(frozen=True, slots=True, kw_only=True)
class Forget(Verdict):
    """Forget a call in doubt: the key may run again, as a new call."""

    @property
    def action(self) -> str:
        return "forget"


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel(Verdict):
    """Cancel a running (or in-doubt) call: it is never resumed; repeats answer `cancelled` until
    the record expires (`retention`) or is forgotten."""

    retention: float | None = DEFAULT_RETENTION

    @property
    def action(self) -> str:
        return "cancel"


@dataclass(frozen=True, slots=True, kw_only=True)
class Rerun(Verdict):
    """Re-run a completed or failed call as a new attempt under a new `run_id`, its durable steps
    before `from_step` replayed (None: every step runs again)."""

    from_step: int | None = None
    retention: float | None = DEFAULT_RETENTION

    @property
    def action(self) -> str:
        return "rerun" if self.from_step is None else f"rerun from step {self.from_step}"


def judge(
    record: CallRecord | None, identity: CallIdentity, verdict: Verdict, now: float, *, owner_alive: bool
) -> CallRecord:
    """The successor of `record` (the current record of `identity`, None if there is none) under
    `verdict`, at `now`; `owner_alive` tells whether a PENDING record's owner may still run it.

    Raises `OperatorError` when the verdict does not apply: `CallNotFoundError` for no such call
    (or it expired: an expired, e.g. forgotten, record is no call any more); `Resolve` and `Forget` of a call not
    in doubt (in doubt: IN_DOUBT, RELEASED, or PENDING with its owner gone; a call still
    running cannot be resolved); `Cancel` of one neither running nor in doubt; `Rerun` of one
    not completed or failed. A `Rerun`'s record has a new random `run_id`.
    """
    if record is None or record.is_expired(now):
        raise CallNotFoundError(identity.tool, identity.key)
    state = record.state
    suffix = verdict.suffix()
    if isinstance(verdict, Cancel):
        if state not in (CallState.PENDING, CallState.IN_DOUBT):
            raise OperatorError(
                f"call {identity.tool}/{identity.key} is {state.value}: only a running or "
                "in-doubt call can be cancelled"
            )
        return transitions.released(
            record, Reason.OPERATOR_CANCELLED, now, expiry(now, verdict.retention), f"{OPERATOR_CANCELLED}{suffix}"
        )
    if isinstance(verdict, Rerun):
        if not state.is_final:
            raise OperatorError(
                f"call {identity.tool}/{identity.key} is {state.value}: only a completed or "
                "failed call can be re-run (resolve or forget one in doubt)"
            )
        since = "" if verdict.from_step is None else f" from step {verdict.from_step}"
        # A new run each time it is judged: a swap lost to another change must not leave the
        # steps the engine copied for this attempt in the run the next attempt copies into.
        return transitions.rerun_requested(
            record, now, expiry(now, verdict.retention), f"re-run requested by an operator{since}{suffix}"
        )
    dead_pending = state == CallState.PENDING and not owner_alive
    if state not in (CallState.IN_DOUBT, CallState.RELEASED) and not dead_pending:
        raise OperatorError(f"call {identity.tool}/{identity.key} is {state.value}, not in doubt")
    if isinstance(verdict, Forget):
        return transitions.released(record, Reason.FORGOTTEN, now, now, f"forgotten by an operator{suffix}")
    assert isinstance(verdict, Resolve)
    expires = expiry(now, verdict.retention)
    if verdict.resolution == "not_applied":
        return transitions.released(
            record, Reason.NOT_APPLIED, now, expires, f"resolved not applied by an operator{suffix}"
        )
    final = CallState.COMPLETED if verdict.resolution == "completed" else CallState.FAILED
    assert verdict.payload is not None  # checked by Resolve
    return transitions.resolved(
        record, final, verdict.payload, now, expires, f"resolved {verdict.resolution} by an operator{suffix}"
    )


def steps_kept(record: CallRecord, from_step: int, steps: Sequence[JournalEntry]) -> Sequence[JournalEntry]:
    """The durable steps (`steps`, those `record`'s run journaled) a re-run from `from_step` replays:
    the first `from_step`. Raises `OperatorError` for a `from_step` beyond them."""
    if not 0 <= from_step <= len(steps):
        raise OperatorError(
            f"call {record.identity.tool}/{record.identity.key} journaled {len(steps)} step(s): "
            f"from_step must be 0 … {len(steps)}, not {from_step}"
        )
    return steps[:from_step]


def audit_entry(before: CallRecord, after: CallRecord, verdict: Verdict) -> dict[str, Any]:
    """The data of the audit entry (`AUDIT_ENTRY` of `AUDIT_PROCESS`) for `verdict` moving `before` to `after`."""
    i = before.identity
    return {
        "action": verdict.action,
        "principal": i.principal,
        "tool": i.tool,
        "key": i.key,
        "run_id": before.run_id,
        "from": before.state.value,
        "to": after.state.value,
        "by": verdict.by or "operator",
        "note": verdict.note,
    }


async def audit_entries(journal: Journal, identity: CallIdentity) -> list[JournalEntry]:
    """The audit entries of operator actions on the call `identity`, oldest first (the journal
    finds them through its index of audit entries by call)."""
    return await journal.audit_entries(identity)
