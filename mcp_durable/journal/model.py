"""The journal's records: call records (idempotency) and process entries (position recovery).

Records are frozen, slotted dataclasses; the engine derives a new record and swaps it in. Times
are epoch seconds passed in by the engine's clock (no store reads the clock itself), so expiry
and leases are tested without sleeping.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple


class CallState(str, Enum):
    """Where a call is in its life (docs/architecture.md, "Call states")."""

    PENDING = "pending"  # claimed; the owner runs the tool and renews its lease
    COMPLETED = "completed"  # result persisted; repeats are replayed
    FAILED = "failed"  # the tool's deliberate error persisted; replayed like a result
    IN_DOUBT = "in_doubt"  # the owner died inside the window; resolved by policy or operator
    RELEASED = "released"  # not applied (exception, operator): the next call runs again

    @property
    def is_final(self) -> bool:
        return self in (CallState.COMPLETED, CallState.FAILED)


class Reason(str, Enum):
    """Why a record is RELEASED or IN_DOUBT: a typed field beside `error` (which is for people).

    The engine decides on this, never on `error`'s text. None on PENDING, COMPLETED and FAILED
    records, and on records written before the field existed whose text says nothing known
    (`legacy_reason` reads those).
    """

    # RELEASED: the key may run again, except where a cancel says it never will.
    REQUESTOR_CANCELLED = "requestor_cancelled"  # the task's requestor cancelled it (tasks/cancel)
    OPERATOR_CANCELLED = "operator_cancelled"  # an operator cancelled it (journal cancel)
    FORGOTTEN = "forgotten"  # an operator forgot it: expired at once, the key runs as a new call
    RERUN = "rerun"  # an operator asked for a re-run of a final call (new run_id)
    EXCEPTION = "exception"  # the tool raised: released so a retry runs again
    TOOL_ERROR = "tool_error"  # a deliberate error result released by policy (tool_errors="release")
    INTERIM = "interim"  # an interim (not final) answer: nothing to journal
    NOT_APPLIED = "not_applied"  # an operator or a reconcile hook found the effect did not happen
    # IN_DOUBT: nobody knows whether the effect happened.
    LOST_OWNER = "lost_owner"  # the owner died, or its lease ran out
    OUTCOME_UNKNOWN = "outcome_unknown"  # the run ended without knowing (an upstream died mid-call)
    TIMED_OUT = "timed_out"  # the run passed its policy's timeout and was stopped
    PARKED = "parked"  # max_attempts reached: only an operator moves it on
    HOOK_FAILED = "hook_failed"  # the reconcile hook could not tell

    @property
    def cancelled(self) -> bool:
        """A cancel: the call is never run again under this record."""
        return self in (Reason.REQUESTOR_CANCELLED, Reason.OPERATOR_CANCELLED)


def legacy_reason(state: CallState, error: str | None) -> Reason | None:
    """The reason of a record journaled before `reason` existed, read from its `error` text (the
    only place that reads that text: backends call it when a stored record has no reason)."""
    text = error or ""
    if state == CallState.RELEASED:
        for prefix, reason in _LEGACY_RELEASED:
            if text.startswith(prefix):
                return reason
        return Reason.EXCEPTION
    if state == CallState.IN_DOUBT:
        if text.startswith("reconcile failed"):
            return Reason.HOOK_FAILED
        if text.startswith("parked after"):
            return Reason.PARKED
        return Reason.LOST_OWNER if not text else Reason.OUTCOME_UNKNOWN
    return None


_LEGACY_RELEASED = (
    ("cancelled by the task's requestor", Reason.REQUESTOR_CANCELLED),
    ("cancelled by an operator", Reason.OPERATOR_CANCELLED),
    ("forgotten by an operator", Reason.FORGOTTEN),
    ("re-run requested by an operator", Reason.RERUN),
    ("resolved not applied by an operator", Reason.NOT_APPLIED),
    ("reconciled in the background: not applied", Reason.NOT_APPLIED),
    ("interim result", Reason.INTERIM),
    ("tool error (released by policy)", Reason.TOOL_ERROR),
)


class Fence(NamedTuple):
    """Who holds a PENDING record: its owner, in which run and attempt. An owner's writes (lease
    renewal, durable steps, its outcome) are accepted only while the stored record still has
    this fence: a stalled owner whose record was taken over, resolved or cancelled is fenced out."""

    owner: str
    run_id: str
    attempts: int


class CallIdentity(NamedTuple):
    """The identity of a durable call: `(principal, tool, key)`. Never flattened into a string.

    A named tuple rather than a frozen dataclass: it is a dict key on every step of every call
    (many lookups per call), and a tuple's hash and equality run in C where a dataclass's
    generated `__hash__` builds a tuple in Python each time. Immutable and
    ordered as before; like any tuple it also equals a plain `(principal, tool, key)`.
    """

    principal: str
    tool: str
    key: str


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One durable call as the journal holds it.

    `version` increases by one on every change; `Journal.swap` compares it, so two processes
    never both move a record forward. `result` is the persisted result as JSON bytes, exactly
    what replay sends (the MCP face stores a `CallToolResult` dump). `run_id` names one logical
    execution (kept across in-doubt retries), and scopes its durable steps.
    """

    identity: CallIdentity
    fingerprint: str
    state: CallState
    version: int
    run_id: str
    attempts: int
    created_at: float
    updated_at: float
    owner: str | None = None
    lease_until: float | None = None
    completed_at: float | None = None
    expires_at: float | None = None
    result: bytes | None = None
    error: str | None = None
    arguments: bytes | None = None  # canonical JSON of the validated arguments (for reconcile, operators)
    #: The MCP task this call is, if it was created as one: ≥128 random bits, unique per
    #: principal, looked up with `Journal.get_task(principal, task_id)`. None for a plain call.
    task_id: str | None = None
    #: Why a RELEASED or IN_DOUBT record is where it is (`Reason`); None otherwise.
    reason: Reason | None = None

    @property
    def fence(self) -> Fence | None:
        """The fence of a PENDING record's owner (None when no owner holds it)."""
        if self.state != CallState.PENDING or self.owner is None:
            return None
        return Fence(self.owner, self.run_id, self.attempts)

    @property
    def cancelled(self) -> bool:
        """Released by a cancel (the task's requestor's or an operator's): never run again under
        this record; repeats are refused `cancelled` until it expires or an operator acts."""
        return self.state is CallState.RELEASED and self.reason is not None and self.reason.cancelled

    def held_by(self, fence: Fence) -> bool:
        """Whether this record is PENDING under `fence`: its owner may still write to it."""
        return (
            self.state == CallState.PENDING
            and self.owner == fence.owner
            and self.run_id == fence.run_id
            and self.attempts == fence.attempts
        )

    def evolve(self, **changes: Any) -> CallRecord:
        """A copy with `changes` applied and the version bumped by one.

        Spelled out rather than `dataclasses.replace` (which does more per call): it runs on every change
        of every call.
        """
        if not changes.keys() <= _EVOLVABLE:
            raise TypeError(f"CallRecord.evolve() cannot change {sorted(changes.keys() - _EVOLVABLE)}")
        c, get = self, changes.get
        return CallRecord(
            get("identity", c.identity),
            get("fingerprint", c.fingerprint),
            get("state", c.state),
            c.version + 1,
            get("run_id", c.run_id),
            get("attempts", c.attempts),
            get("created_at", c.created_at),
            get("updated_at", c.updated_at),
            get("owner", c.owner),
            get("lease_until", c.lease_until),
            get("completed_at", c.completed_at),
            get("expires_at", c.expires_at),
            get("result", c.result),
            get("error", c.error),
            get("arguments", c.arguments),
            get("task_id", c.task_id),
            get("reason", c.reason),
        )

    def is_expired(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at <= now


_EVOLVABLE = frozenset(f.name for f in dataclasses.fields(CallRecord)) - {"version"}


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One entry of the process journal: `(process_id, entry_type, data, ts, seq)`.

    `seq` is assigned by the journal on append (strictly increasing across the whole journal);
    entries built by callers carry `seq=0` until then.
    """

    process_id: str
    entry_type: str
    data: dict[str, Any]
    ts: float = 0.0
    seq: int = 0


@dataclass(frozen=True, slots=True)
class JournalStats:
    """Counts a journal can give cheaply, for `journal://stats` and the CLI."""

    backend: str
    calls_by_state: dict[str, int]
    calls_by_tool: dict[str, int]
    entries: int
    size_bytes: int | None
    oldest_record_at: float | None
