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
    """Where a call is in its life (DESIGN.md §2)."""

    PENDING = "pending"  # claimed; the owner runs the tool and renews its lease
    COMPLETED = "completed"  # result persisted; repeats are replayed
    FAILED = "failed"  # the tool's deliberate error persisted; replayed like a result
    IN_DOUBT = "in_doubt"  # the owner died inside the window; resolved by policy or operator
    RELEASED = "released"  # not applied (exception, operator): the next call runs again

    @property
    def is_final(self) -> bool:
        return self in (CallState.COMPLETED, CallState.FAILED)


class CallIdentity(NamedTuple):
    """The identity of a durable call: `(principal, tool, key)`. Never flattened into a string.

    A named tuple rather than a frozen dataclass: it is a dict key on every step of every call
    (~15 lookups per miss), and a tuple's hash and equality run in C where a dataclass's
    generated `__hash__` builds a tuple in Python each time (4x slower, timed). Immutable and
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

    def evolve(self, **changes: Any) -> CallRecord:
        """A copy with `changes` applied and the version bumped by one.

        Spelled out rather than `dataclasses.replace` (twice as slow): it runs on every change
        of every call.
        """
        if not changes.keys() <= _EVOLVABLE:
            raise TypeError(f"CallRecord.evolve() cannot change {sorted(changes.keys() - _EVOLVABLE)}")
        c, get = self, changes.get
        return CallRecord(
            get("identity", c.identity), get("fingerprint", c.fingerprint), get("state", c.state), c.version + 1,
            get("run_id", c.run_id), get("attempts", c.attempts), get("created_at", c.created_at),
            get("updated_at", c.updated_at), get("owner", c.owner), get("lease_until", c.lease_until),
            get("completed_at", c.completed_at), get("expires_at", c.expires_at), get("result", c.result),
            get("error", c.error), get("arguments", c.arguments), get("task_id", c.task_id),
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
