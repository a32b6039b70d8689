"""The `Journal` protocol every backend implements, and the in-process wake-up they share.

Backends only store and make claims atomic; the engine (`mcp_durable.engine`) decides what a
record means. A backend is done when it passes `tests/contract/`, unchanged.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ParamSpec, Protocol, TypeVar, runtime_checkable

import anyio

from ..errors import JournalError
from .model import CallIdentity, CallRecord, CallState, Fence, JournalEntry, JournalStats


@dataclass(frozen=True, slots=True, order=True)
class CallCursor:
    """Where a newest-first listing of calls stopped: the last record's `(created_at, identity)`."""

    created_at: float
    identity: CallIdentity

    @classmethod
    def after(cls, record: CallRecord) -> CallCursor:
        return cls(record.created_at, record.identity)


#: The states of the records a call may still need done for it: a PENDING record's owner may be
#: gone (the start-up sweep, the task watch) and an IN_DOUBT one waits for a decision (recovery,
#: the in-doubt listings). Every backend keeps an index of the records in these states only, so
#: a `list_calls` query of one of them never reads the records that are done (`Journal.list_calls`).
OPEN_STATES: frozenset[CallState] = frozenset({CallState.PENDING, CallState.IN_DOUBT})


def sort_key(record: CallRecord) -> tuple[float, CallIdentity]:
    """Listing order (applied reversed: newest first, ties by identity descending)."""
    return (record.created_at, record.identity)


@dataclass(frozen=True, slots=True)
class CallQuery:
    """Which calls `Journal.list_calls` returns: at most `limit` records matching every filter
    given (`principal`, `tool`, `state`; `tasks_only` keeps the records that are tasks, with
    `task_id` set), newest first by `(created_at, identity)`, strictly after `cursor`.

    `matches` and `page` are the reference semantics; SQL backends translate the same filters
    (`sql_rows.listing_clause`), the file journal prefilters on its index first.
    """

    principal: str | None = None
    tool: str | None = None
    state: CallState | None = None
    limit: int = 100
    cursor: CallCursor | None = None
    tasks_only: bool = False

    def matches(self, record: CallRecord) -> bool:
        """Whether `record` passes every filter and lies strictly after the cursor."""
        cursor = self.cursor
        return (
            (self.principal is None or record.identity.principal == self.principal)
            and (self.tool is None or record.identity.tool == self.tool)
            and (self.state is None or record.state == self.state)
            and (not self.tasks_only or record.task_id is not None)
            and (cursor is None or sort_key(record) < (cursor.created_at, cursor.identity))
        )

    def page(self, records: Iterable[CallRecord]) -> list[CallRecord]:
        """The listing of `records` this query selects: the reference for in-memory indexes."""
        selected = [r for r in records if self.matches(r)]
        selected.sort(key=sort_key, reverse=True)
        return selected[: max(0, self.limit)]


#: `list_calls()` without a query: the newest 100 calls.
RECENT_CALLS = CallQuery()


async def each_call(journal: Journal, query: CallQuery) -> AsyncIterator[CallRecord]:
    """Every record `query` selects, newest first, read `query.limit` (at least 1) at a time: each
    page starts strictly after the last record of the one before (its `CallCursor`), so a pass
    over more records than a page holds yields every one of them once, starting from
    `query.cursor`.

    Records that change while the pass goes on: one that leaves the selection before its page is
    read is not yielded; one created after the pass began (newer than its first page) is not
    either (the next pass finds it). The pass ends at the first page shorter than a page.
    """
    size = max(1, query.limit)
    cursor = query.cursor
    while True:
        page = await journal.list_calls(replace(query, limit=size, cursor=cursor))
        for record in page:
            yield record
        if len(page) < size:
            return
        cursor = CallCursor.after(page[-1])


@dataclass(frozen=True, slots=True)
class CountQuery:
    """Which calls `Journal.count_calls` counts: every stored record (expired ones too, until a
    purge drops them) of `principal` (None: every principal's) whose `created_at` lies in
    `[since, until)` (None: unbounded on that side). With `bucket_s`, the records are also
    counted per bucket of `bucket_s` seconds from `since` (which it needs): bucket
    `floor((created_at - since) / bucket_s)`, in IEEE double arithmetic on every backend.

    `matches`, `bucket` and `count` are the reference semantics.
    """

    principal: str | None = None
    since: float | None = None
    until: float | None = None
    bucket_s: float | None = None

    def __post_init__(self) -> None:
        if self.bucket_s is not None and (self.since is None or not self.bucket_s > 0):
            raise ValueError("CountQuery.bucket_s needs `since` and a positive width")

    @property
    def ranged(self) -> bool:
        """Whether a time range narrows the records (else every record of the principal counts)."""
        return self.since is not None or self.until is not None

    def in_range(self, created_at: float) -> bool:
        return (self.since is None or created_at >= self.since) and (self.until is None or created_at < self.until)

    def matches(self, record: CallRecord) -> bool:
        return (self.principal is None or record.identity.principal == self.principal) and self.in_range(
            record.created_at
        )

    def bucket(self, created_at: float) -> int | None:
        """The bucket of a record created at `created_at` (None without `bucket_s`)."""
        if self.bucket_s is None or self.since is None:
            return None
        return math.floor((created_at - self.since) / self.bucket_s)

    def count(self, records: Iterable[CallRecord]) -> CallCounts:
        """The counts of `records` this query selects: the reference for every backend."""
        tally = CountTally()
        for r in records:
            if self.matches(r):
                i = r.identity
                tally.add(i.principal, i.tool, r.state.value, 1, r.created_at, self.bucket(r.created_at))
        return tally.counts()


@dataclass(frozen=True, slots=True)
class CallCounts:
    """What `Journal.count_calls` answers: record counts by state (its value), tool, principal
    and bucket (`CountQuery.bucket`; empty without `bucket_s`), each with only the keys that
    count at least one record, in key order; and the oldest `created_at` among them."""

    by_state: dict[str, int]
    by_tool: dict[str, int]
    by_principal: dict[str, int]
    by_bucket: dict[int, int]
    oldest_created_at: float | None

    @property
    def total(self) -> int:
        return sum(self.by_state.values())


class CountTally:
    """Builds a `CallCounts` from groups of records `(principal, tool, state, n, oldest, bucket)`:
    what every backend's `count_calls` adds up, from rows, counters or records."""

    __slots__ = ("_state", "_tool", "_principal", "_bucket", "_oldest")

    def __init__(self) -> None:
        self._state: Counter[str] = Counter()
        self._tool: Counter[str] = Counter()
        self._principal: Counter[str] = Counter()
        self._bucket: Counter[int] = Counter()
        self._oldest: float | None = None

    def add(
        self, principal: str, tool: str, state: str, n: int, oldest: float | None = None, bucket: int | None = None
    ) -> None:
        if n == 0:
            return
        self._state[state] += n
        self._tool[tool] += n
        self._principal[principal] += n
        if bucket is not None:
            self._bucket[bucket] += n
        if oldest is not None and (self._oldest is None or oldest < self._oldest):
            self._oldest = oldest

    def oldest(self, created_at: float | None) -> None:
        """Take `created_at` as the oldest if it is older than what was added (None: nothing)."""
        if created_at is not None and (self._oldest is None or created_at < self._oldest):
            self._oldest = created_at

    def counts(self) -> CallCounts:
        def ordered(counter: Counter[Any]) -> dict[Any, int]:
            return {k: n for k, n in sorted(counter.items()) if n > 0}

        return CallCounts(
            ordered(self._state), ordered(self._tool), ordered(self._principal), ordered(self._bucket), self._oldest
        )


#: `count_calls()` without a query: every stored record.
ALL_CALLS = CountQuery()


@dataclass(frozen=True, slots=True)
class PurgedCalls:
    """What `Journal.purge_expired_calls` dropped: each record's identity and `run_id`, and how
    many durable-step entries of those runs went with them. `held_s`, where the backend can
    tell, is how long dropping them held its writer (SQLite: the page's statements in the
    writer thread), without the wait for the writer or the commit: what a page's size changes.
    Retention sizes its pages by it (`operations/retention.py`); it is not compared."""

    calls: tuple[tuple[CallIdentity, str], ...] = ()
    step_entries: int = 0
    held_s: float | None = field(default=None, compare=False)


#: Expired records dropped per `Journal.purge_expired_calls` by `purge_all_expired` (each batch
#: one transaction on SQL).
PURGE_BATCH = 1000


async def purge_all_expired(journal: Journal, now: float) -> tuple[int, int]:
    """Drop every record expired at `now` with its runs' durable steps, `PURGE_BATCH` at a time;
    returns how many records and step entries went."""
    records = steps = 0
    while True:
        done = await journal.purge_expired_calls(now, PURGE_BATCH)
        records += len(done.calls)
        steps += done.step_entries
        if len(done.calls) < PURGE_BATCH:  # the last batch (`purge_expired_calls`)
            return records, steps


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What opening a journal found and did (shown by `journal://recovery`).

    `snapshot_used` names the snapshot recovery started from (None: read everything);
    `records_loaded` counts call records indexed; `entries_replayed` the log records read after
    the snapshot; `bytes_truncated` a torn or corrupt tail cut off (kept aside at `truncated_to`);
    `problems` every corruption found, with its place.
    """

    backend: str
    duration_s: float
    snapshot_used: str | None = None
    records_loaded: int = 0
    entries_replayed: int = 0
    bytes_truncated: int = 0
    truncated_to: str | None = None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Problem:
    """One damage `verify` found: the file (or table and row), the byte offset (-1 when unknown), why."""

    path: str
    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What `verify` read: `records` valid records or frames, and every `problem` with its place."""

    records: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


_P = ParamSpec("_P")
_T = TypeVar("_T")


def stored_decoder(what: str) -> Callable[[Callable[_P, _T]], Callable[_P, _T]]:
    """Decorate a backend's decoder of stored rows or frames: what does not decode as `what` (a
    value no version wrote, a missing field) raises `JournalError`, as the contract's faults do."""

    def decorate(decode: Callable[_P, _T]) -> Callable[_P, _T]:
        @functools.wraps(decode)
        def decoded(*args: _P.args, **kwargs: _P.kwargs) -> _T:
            try:
                return decode(*args, **kwargs)
            except (ValueError, TypeError, KeyError, IndexError) as exc:
                raise JournalError(f"a stored {what} cannot be read: {type(exc).__name__}: {exc}") from exc

        return decoded

    return decorate


@runtime_checkable
class Journal(Protocol):
    """A durable store of call records and process entries.

    The contract is stated on each method; `tests/contract/` checks it on every backend. Across
    every method:

    - Durability: when a writing method returns, its change is on stable storage (fsync or a
      database commit), unless the journal was opened with relaxed durability for tests.
    - Stores never read the clock: every time is passed in.
    - Faults: every failure of the storage (an OS error, a driver error, a lost or unreadable
      file, a row or frame that does not decode as a record) raises `JournalError`, never the
      underlying exception (which is its `__cause__`): callers answer it as
      `journal_unavailable`. Only the memory journal, with no storage, has none.
    """

    url: str
    #: What the last `open()` found; None until opened (backends without recovery work report zeros).
    recovery: RecoveryReport | None
    #: True when only one process may write (file journal): PENDING records of a previous boot
    #: are known to be orphaned at open, without waiting for their lease.
    single_writer: bool

    async def open(self) -> None:
        """Open (creating or migrating the storage if needed) and set `recovery`; before any
        other method. `JournalError` when the storage cannot be opened."""
        ...

    async def aclose(self) -> None:
        """Release the storage (files, locks, connections). Everything written is already
        durable; closing adds nothing to the journal's content."""
        ...

    async def claim(self, record: CallRecord, now: float) -> tuple[bool, CallRecord]:
        """Insert `record` if no record has its identity, or if the stored one has expired
        (`expires_at <= now`): `(True, record)`. Otherwise change nothing: `(False, stored)`.

        Atomic across every process sharing the journal: of N concurrent claims of one
        identity, exactly one wins."""
        ...

    async def get(self, identity: CallIdentity) -> CallRecord | None:
        """The stored record of `identity` (expired or not: the caller decides), or None."""
        ...

    async def find_calls(self, tool: str, key: str) -> list[CallRecord]:
        """The stored records of `(tool, key)` of every principal (expired or not), newest first
        (`sort_key` reversed, as `list_calls` orders them). Found through an index: the cost
        grows with the principals that hold a record of `tool`, not with the records."""
        ...

    async def get_task(self, principal: str, task_id: str) -> CallRecord | None:
        """The record whose `task_id` is `task_id` and whose principal is `principal`, or None
        (another principal's task is None, like an unknown id)."""
        ...

    async def swap(self, expected_version: int, record: CallRecord, expected_run_id: str | None = None) -> bool:
        """Replace the stored record of `record.identity` with `record`, only if the stored
        version is `expected_version` and, when `expected_run_id` is given, its `run_id` is that
        one; return whether it did (False for a missing record).

        `record.version` is stored as given (the engine bumps it). Atomic like `claim`: of two
        swaps from one version, at most one succeeds.

        Versions start again at 1 when a claim replaces an expired record or follows a purged
        one, so a version alone names a record only within one lineage: a writer that read a
        record long ago (a stalled owner) could otherwise land on a later lineage's record that
        reached the same version. The run id names the lineage (every claim draws a new one,
        and within a lineage the version moves on every swap), so the engine passes the run id
        of the record it read with every swap."""
        ...

    async def renew(self, identity: CallIdentity, fence: Fence, lease_until: float) -> bool:
        """Set `lease_until` of the record of `identity` if it is PENDING under `fence` (the same
        owner, `run_id` and `attempts`: `CallRecord.held_by`); return whether it did. Any other
        record (missing, another owner's or another attempt's, or in any other state) is left
        unchanged and the answer is False. The version does not change, so the owner's pending
        `swap` still applies."""
        ...

    async def append_step(
        self, identity: CallIdentity, fence: Fence, index: int, data: dict[str, Any], ts: float
    ) -> JournalEntry | None:
        """Append durable step `index` of run `fence.run_id`: an entry of process
        `steps/<run_id>` (`step_process_id`) of type `STEP`, whose `data` carries `"index":
        index`. Written only while the record of `identity` is PENDING under `fence` and no step
        `index` of that run is stored; returns the new entry (with its `seq`). Otherwise writes
        nothing and returns None: a stale owner is fenced out, and a run's step log never holds
        two entries for one index (first writer wins).

        Atomic like `claim` across every process sharing the journal: the fence check and the
        insert are one step, so no write of a fenced-out owner lands after its successor's
        take-over. Step entries written by `append` (an operator's re-run copies them) count for
        the uniqueness too."""
        ...

    async def wait_for_change(self, identity: CallIdentity, timeout: float) -> None:
        """Return when the record of `identity` may have changed, or after `timeout` seconds.
        Spurious wake-ups are allowed: callers re-read."""
        ...

    async def list_calls(self, query: CallQuery = RECENT_CALLS) -> list[CallRecord]:
        """The records `query` selects: at most `query.limit`, matching every filter it gives,
        newest first by `(created_at, identity)`, strictly after its cursor. `CallQuery.page` is
        the reference implementation.

        A query whose `state` is one of `OPEN_STATES` (PENDING, IN_DOUBT) is answered through an
        index of the records in those states only: its cost grows with those records (with
        `tasks_only`, with the open tasks), never with the records that are done, and a journal
        without any such record reads none. `each_call` pages through every one of them."""
        ...

    async def purge_expired(self, now: float) -> int:
        """Drop every record with `expires_at <= now`; return how many. Process entries stay."""
        ...

    async def purge_expired_calls(self, now: float, limit: int = 1000) -> PurgedCalls:
        """Drop records with `expires_at <= now` (the earliest expiries first) together with the
        durable-step entries of their runs (`steps/<run_id>`, dropped as `purge_entries` drops
        entries), and say what went: the `limit` earliest expired records, or every expired
        one when fewer have expired, so that fewer than `limit` dropped means none expired at
        `now` is left (on Postgres, but those another transaction holds at that moment, which
        it skips). More than `limit` only where the backend drops every record expired at a
        time at once (the memory journal drops all expired at `now`; the file journal, whose
        one frame stands for every record expired at the page's last expiry, drops those that
        tie with it too). Callers repeat while a call drops `limit` or more.

        Found through an index of expiries: the cost grows with what is dropped, not with the
        journal. On SQLite and Postgres the records and their steps go in one transaction."""
        ...

    async def count_calls(self, query: CountQuery = ALL_CALLS) -> CallCounts:
        """The counts of the records `query` selects (`CountQuery.count` is the reference): by
        state, tool, principal and time bucket, with the oldest `created_at` among them. A
        query with a principal never counts another principal's record.

        Answered from what the journal maintains, not by reading records: without a time range
        its cost does not grow with the number of records (kept counts, and an index for the
        oldest); with one, it grows with the records created in that range only."""
        ...

    async def stats(self) -> JournalStats:
        """Counts by state and tool, entries, size and the oldest record's time: the counts
        `count_calls()` gives (and a kept count of entries), so no record is read."""
        ...

    async def append(self, process_id: str, entry_type: str, data: dict[str, Any], ts: float) -> JournalEntry:
        """Append a process entry and return it with its `seq`: strictly increasing across the
        journal (every process), never reused."""
        ...

    async def entries(
        self, *, process_id: str | None = None, after: int = 0, limit: int | None = None
    ) -> list[JournalEntry]:
        """Entries with `seq > after` (of `process_id` only, if given), in `seq` order, at most
        `limit`."""
        ...

    async def audit_entries(self, identity: CallIdentity) -> list[JournalEntry]:
        """The entries of type `AUDIT_ENTRY` of process `AUDIT_PROCESS` whose data names the call
        `identity` (its `principal`, `tool` and `key`), in `seq` order (dropped ones never).
        Found through an index of the audit process by call: the cost grows with that call's
        entries, not with the audit process."""
        ...

    async def last_checkpoint(self, process_id: str) -> JournalEntry | None:
        """The latest entry of type `CHECKPOINT` of `process_id`, or None."""
        ...

    async def purge_entries(self, process_ids: Collection[str], *, before_seq: int | None = None) -> int:
        """Drop the entries of `process_ids` (only those with `seq < before_seq` when given); return how many.

        Retention uses it for the durable steps of expired records and the lifecycle entries a
        checkpoint holds. Later reads never return them; the space comes back as the backend
        reuses it (the file journal: at its next compaction).
        """
        ...


class MaintenanceReport(Protocol):
    """What a maintenance operation did, as a JSON object (the CLI prints it)."""

    def as_dict(self) -> dict[str, Any]: ...


@runtime_checkable
class Maintainable(Protocol):
    """Maintenance beyond the `Journal` contract, for backends whose storage needs it (the file
    journal). `mcp-durable journal compact` checks for it with `isinstance`; a journal without
    it is compacted by `Journal.purge_expired` alone (a database reclaims space itself)."""

    async def compact(self, now: float) -> MaintenanceReport:
        """Purge what expired at `now` and rewrite the storage without dead data. Crash-safe:
        a crash at any point leaves a journal that opens with every live record."""
        ...

    async def snapshot(self) -> str | None:
        """Write a snapshot that speeds up the next open; its name, or None when none was due."""
        ...


CHECKPOINT = "checkpoint"
#: The process whose entries are the audit trail of operator actions (one `AUDIT_ENTRY` each,
#: its data naming the call: `principal`, `tool`, `key`); backends index them by that call
#: (`Journal.audit_entries`).
AUDIT_PROCESS = "mcp-durable/operator-actions"
AUDIT_ENTRY = "operator_action"


def audited_call(process_id: str, entry_type: str, data: Any) -> CallIdentity | None:
    """The call an audit entry names (what `audit_entries` finds it by), or None for any other entry."""
    if process_id != AUDIT_PROCESS or entry_type != AUDIT_ENTRY or not isinstance(data, dict):
        return None
    principal, tool, key = data.get("principal"), data.get("tool"), data.get("key")
    if isinstance(principal, str) and isinstance(tool, str) and isinstance(key, str):
        return CallIdentity(principal, tool, key)
    return None


#: The entry type of a durable step (`append_step`); its process is `step_process_id(run_id)`.
STEP = "step"


def step_process_id(run_id: str) -> str:
    """The process whose entries are the durable steps of run `run_id`."""
    return f"steps/{run_id}"


class ChangeSignals:
    """In-process wake-ups for `wait_for_change`: one event per watched identity.

    Every backend uses it for waiters in the same process; backends shared by several
    processes add their own cross-process signal (polling for SQLite, LISTEN/NOTIFY for
    Postgres) on top.
    """

    def __init__(self) -> None:
        self._events: dict[CallIdentity, anyio.Event] = {}

    def notify(self, identity: CallIdentity) -> None:
        event = self._events.pop(identity, None)
        if event is not None:
            event.set()

    def notify_all(self) -> None:
        events, self._events = self._events, {}
        for event in events.values():
            event.set()

    async def wait(self, identity: CallIdentity, timeout: float) -> None:
        event = self._events.get(identity)
        if event is None:
            event = self._events[identity] = anyio.Event()
        with anyio.move_on_after(timeout):
            await event.wait()
