"""The call state machine: claim, run, persist, replay, wait, in doubt. The one place that decides.

No `mcp` import: the MCP face hands the engine a validated call and a `run` callable, and turns
what comes back (a `CallOutcome`, or a `DurableError`) into protocol results. Backends only
store records and make `claim`/`swap` atomic; every decision about what a record means is here.

One call, start to end:

    resolve key ─▶ claim ──won──▶ run tool (shielded, lease renewed) ─▶ persist ─▶ acknowledge
                     │
                     └─lost─▶ existing record:
                               other fingerprint        → key_reuse
                               COMPLETED / FAILED       → replay
                               PENDING, lease alive     → wait for it (latch on) … in_progress
                               PENDING, owner gone      → IN_DOUBT
                               IN_DOUBT                 → policy: retry | reconcile | refuse
                               RELEASED                 → take it over and run

Races are settled by `swap(expected_version, …)`: whoever loses a swap re-reads and decides
again, so two processes never both move one record forward.

Owners and leases: a PENDING record names the instance running it and a lease that instance
renews every `lease / 3` while the tool (or a reconcile hook) runs. Its owner is gone when the
lease has expired — or, on a single-writer journal, whenever the owner is not this instance
(only a previous boot can have written it). `start()` sweeps such records to IN_DOUBT, so they
show in the in-doubt list at once. A record this instance owns is alive exactly while this
instance runs it, whatever the lease says.

Policies for IN_DOUBT: `retry` takes it over (same key, same `run_id`, so completed durable
steps replay); `reconcile` takes it over, asks the hook, then completes it with the found
result or runs it — a hook that raises leaves it IN_DOUBT and the call is refused (`in_doubt`);
`refuse` answers `in_doubt`. After `max_attempts` the record is parked (refused whatever the
policy) until an operator's `resolve()`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from . import keys, observe, operators
from .errors import (
    CallCancelledError,
    ConfigError,
    DeterminismError,
    DurableError,
    InDoubtError,
    InProgressError,
    KeyReuseError,
    OutcomeUnknownError,
    TaskCancelledError,
)
from .journal.base import CallCursor, Journal
from .journal.model import CallIdentity, CallRecord, CallState
from .journal.replay import ProcessJournal, ReplayEngine
from .keys import LOCAL_PRINCIPAL as LOCAL_PRINCIPAL  # where it has always been imported from
from .leases import LeaseKeeper
from .policy import DEFAULT_RETENTION, NotApplied, ToolPolicy
from .runtimes import RunTimes
from .steps import DurableCall, bind, load_steps, unbind
from .task_runs import TaskRuns
from .tasks import RECONCILE_FAILED, is_cancelled, is_operator_cancelled

logger = logging.getLogger(__name__)


#: The instances of this process started on each journal object. On a single-writer journal the
#: only live owners are these (the writer lock keeps other processes out), so a PENDING record
#: of any other owner is a previous boot's orphan — and two engines sharing one journal object
#: in a process never mistake each other's running calls for orphans.
_LIVE_OWNERS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
FINALS_KEPT = 4096  # final records an engine keeps for repeats
FINALS_MAX_RESULT = 16 * 1024  # larger results are read from the journal on every repeat


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What running a tool produced: the opaque `value` to hand back on this first run, and the
    JSON bytes to persist and replay. `is_error` marks a deliberate error result."""

    value: Any
    payload: bytes
    is_error: bool
    final: bool = True  # False for an interim answer (more input needed): released, not persisted


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """What the engine answers a call with.

    `value` is the tool's own result object on a run (None on a replay); `payload` the stored JSON
    bytes (None for an unkeyed call, which is not journaled); `replayed` whether it came from
    the journal without this call running anything; `reconciled` whether a reconcile hook
    supplied it; `superseded` whether this call ran the tool (or its hook) but another outcome
    was recorded for the key first — its owner's lease was taken over, or an operator resolved
    it — so the answer is the recorded outcome, not this run's (`replayed` is False: it ran).
    """

    key: str | None
    value: Any
    payload: bytes | None
    replayed: bool
    first_completed_at: float | None
    reconciled: bool = False
    attempt: int = 1
    superseded: bool = False


Runner = Callable[[DurableCall | None], Awaitable[ToolOutcome]]
Encoder = Callable[[Any], ToolOutcome]
ChangeListener = Callable[[CallRecord], Awaitable[None]]
#: Resumes a task record in the background (set by the MCP face, which can run its tool).
TaskResumer = Callable[[CallRecord], Awaitable[None]]


class Engine(TaskRuns):
    """Runs durable calls against one journal (and MCP tasks: `TaskRuns`, mcp_durable/task_runs.py).

    `clock` gives wall-clock seconds for record times (inject one to test expiry and leases);
    `instance_id` names this server instance as the owner of the calls it runs.
    """

    def __init__(
        self,
        journal: Journal,
        *,
        clock: Callable[[], float] = time.time,
        instance_id: str | None = None,
        process_id: str | None = None,
    ) -> None:
        self.journal = journal
        self.clock = clock
        self.instance_id = instance_id or f"{uuid.uuid4().hex[:12]}"
        self.leases = self._lease_keeper(journal)
        #: The journal's claim answers a repeat as cheaply as a read (SQLite, Postgres): no read before it.
        self._claim_reads = bool(getattr(journal, "claim_reads", False))
        self.listeners: list[ChangeListener] = []
        #: Recent run durations per tool: the `retry_after` of an `in_progress` refusal (runtimes.py).
        self.run_times = RunTimes()
        #: Runs an in-doubt task again (the face's, which knows its tool); None resumes nothing.
        self.task_resumer: TaskResumer | None = None
        #: A tool's policy by name (the face's), for the task watch of a shared journal.
        self.task_policy: Callable[[str], ToolPolicy | None] = lambda tool: None
        #: Seconds between looks for tasks whose owner died, on a journal shared by replicas.
        self.task_watch_interval = 1.0
        #: Background runs of tasks: they outlive the request that created them, not the engine.
        self._background: set[asyncio.Task[None]] = set()
        #: The cancel scope around each task's tool running here, for `cancel_task`.
        self._task_scopes: dict[CallIdentity, anyio.CancelScope] = {}
        self._closing = False
        #: Recently seen COMPLETED / FAILED records (see `_remember`), answering repeats without a read.
        self._finals: dict[CallIdentity, tuple[CallRecord, CallOutcome]] = {}
        self._opened = False
        self._open_lock = anyio.Lock()
        self.orphans_found = 0
        #: `orphans_found` by principal: what `journal://recovery` shows each principal of its own.
        self.orphans_by_principal: Counter[str] = Counter()
        #: Identities this instance is inside a call for right now, counted: from the moment a
        #: claim or take-over is sent until the outcome is persisted (or released). A record
        #: this instance owns is alive while it is in here, whatever its lease says (a stalled
        #: heartbeat must not turn our own running call in doubt), and dead once it is not.
        #: Held before the write is sent, because a duplicate may read the committed claim
        #: before the claiming coroutine resumes; held through the persist, because the record
        #: is still PENDING until that write lands. Counted, because two of this instance's
        #: duplicates may both try to take one record over, and the loser must not drop the
        #: winner's hold.
        self._running: dict[CallIdentity, int] = {}
        #: The process this engine journals its lifecycle as (`starting → running → stopping →
        #: stopped`); None journals nothing.
        self.process_id = process_id
        self.lifecycle: ProcessJournal | None = None
        #: The lifecycle state the previous boot left (e.g. `running`: it did not stop cleanly).
        self.previous_lifecycle_state: str | None = None
        self.started_at: float | None = None
        self.start_duration_s: float | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    def use_journal(self, journal: Journal) -> None:
        """Run on `journal` instead of the one given at construction; only before `start()`.

        Everything that reads or writes the journal (calls, lease renewal, the lifecycle, the
        single-writer owner set) goes to this one: the lease keeper is rebuilt on it, so no
        part of the engine keeps the old journal. Raises `ConfigError` once started.
        """
        if self._opened:
            raise ConfigError("the journal cannot be replaced once the engine has started")
        self.journal = journal
        self.leases = self._lease_keeper(journal)
        self._claim_reads = bool(getattr(journal, "claim_reads", False))

    def _lease_keeper(self, journal: Journal) -> LeaseKeeper:
        # A lease found lost ends a task's run here (a cancel on another replica): `_lease_lost`.
        return LeaseKeeper(journal, self.instance_id, self.clock, on_lost=self._lease_lost)

    async def start(self) -> None:
        """Open the journal (once) and mark calls orphaned by a previous boot as in doubt."""
        if self._opened:
            return
        async with self._open_lock:
            if self._opened:
                return
            began = time.perf_counter()
            self.started_at = self.clock()
            await self.journal.open()
            _live_owners(self.journal).add(self.instance_id)
            self.orphans_found = await self.sweep()
            self._closing = False
            await self.resume_tasks()
            if not self.journal.single_writer and self.task_resumer is not None:
                self.spawn(self._watch_tasks())
            if self.process_id is not None:
                recovered = await ReplayEngine(self.journal).recover(self.process_id)
                self.previous_lifecycle_state = recovered.lifecycle_state
                self.lifecycle = ProcessJournal(self.journal, self.process_id, clock=self.clock, state=recovered)
                await self.lifecycle.transition("starting")
                await self.lifecycle.update_context(instance_id=self.instance_id, orphans_in_doubt=self.orphans_found)
                await self.lifecycle.transition("running")
            self.start_duration_s = time.perf_counter() - began
            self._opened = True

    async def aclose(self) -> None:
        self._finals.clear()
        if self._opened:
            # Background tasks stop with the engine; a task's record stays PENDING (see
            # `_release_after`), so the next start finds it in doubt and resumes it.
            self._closing = True
            background = list(self._background)
            for task in background:
                task.cancel()
            if background:
                await asyncio.gather(*background, return_exceptions=True)
            self._opened = False
            _live_owners(self.journal).discard(self.instance_id)
            try:
                if self.lifecycle is not None:
                    await self.lifecycle.transition("stopping")
                    await self.lifecycle.transition("stopped")
                    await self.lifecycle.checkpoint()
            finally:
                await self.journal.aclose()

    async def sweep(self) -> int:
        """Mark every PENDING call whose owner is gone as IN_DOUBT; returns how many.

        Run at start. On a single-writer journal no other process can own a PENDING record, so
        every one found then is a previous boot's orphan and is marked at once, without waiting
        for its lease. On a shared journal only records whose lease has expired are marked (a
        live owner renews its lease); the others are left to their owners.
        """
        found = 0
        cursor: CallCursor | None = None
        while True:
            page = await self.journal.list_calls(state=CallState.PENDING, limit=500, cursor=cursor)
            if not page:
                return found
            cursor = CallCursor.after(page[-1])
            for record in page:
                now = self.clock()
                if self.owner_alive(record, now):
                    continue
                doubted = record.evolve(state=CallState.IN_DOUBT, owner=None, lease_until=None, updated_at=now)
                if await self.journal.swap(record.version, doubted):
                    found += 1
                    self.orphans_by_principal[record.identity.principal] += 1
                    await self.notify_changed(doubted)

    # -- operators ----------------------------------------------------------------------------------

    async def resolve(
        self,
        identity: CallIdentity,
        resolution: str,
        *,
        payload: bytes | None = None,
        note: str = "",
        retention: float | None = DEFAULT_RETENTION,
        by: str = "",
    ) -> CallRecord:
        """An operator's verdict on an in-doubt (or released) call: see `operators.resolve`."""
        await self.start()
        return await operators.resolve(self, identity, resolution, payload=payload, note=note, retention=retention,
                                       by=by)

    async def rerun(
        self, identity: CallIdentity, *, from_step: int | None = None, by: str = "", note: str = "",
        retention: float | None = DEFAULT_RETENTION,
    ) -> CallRecord:
        """Re-run a completed or failed call under a new attempt: see `operators.rerun`."""
        await self.start()
        return await operators.rerun(self, identity, from_step=from_step, by=by, note=note, retention=retention)

    async def cancel(
        self, identity: CallIdentity, *, by: str = "", note: str = "", retention: float | None = DEFAULT_RETENTION,
    ) -> CallRecord:
        """An operator's cancel of a running (or in-doubt) call: see `operators.cancel`. A run of it
        here stops at once; an owner elsewhere stops at its next lease renewal or durable step."""
        await self.start()
        cancelled = await operators.cancel(self, identity, by=by, note=note, retention=retention)
        scope = self._task_scopes.get(identity)
        if scope is not None:
            scope.cancel()
        return cancelled

    async def forget(self, identity: CallIdentity, *, by: str = "", note: str = "") -> CallRecord:
        """Forget an in-doubt (or released) call so its key runs anew: see `operators.forget`."""
        await self.start()
        return await operators.forget(self, identity, by=by, note=note)

    async def purge_expired(self) -> int:
        """Drop records whose retention has ended; returns how many."""
        await self.start()
        return await self.journal.purge_expired(self.clock())

    async def notify_changed(self, record: CallRecord) -> None:
        """Tell the listeners (resources, notifications) of a change. Never raises: a listener's
        failure must not fail, or leave half-done, the call whose record changed."""
        if not record.state.is_final:
            self._finals.pop(record.identity, None)
        # A final record is not kept here but when a repeat reads it (`_decide`): most calls are
        # never repeated, and keeping each one made the long-lived heap grow by a record per
        # call, which is what triggers the interpreter's full (whole-heap) collections.
        for listener in self.listeners:
            try:
                await listener(record)
            except Exception:  # noqa: BLE001 - best effort, logged
                logger.exception("a journal change listener failed")

    def _remember(self, record: CallRecord) -> None:
        """Keep a final record for repeats; forget an identity whose record is not final.

        A COMPLETED or FAILED record never changes until it expires (only PENDING, IN_DOUBT and
        RELEASED records are ever resolved or taken over, and purges drop expired records only),
        so a copy of it answers a repeat exactly as a read would. Bounded: at most
        `FINALS_KEPT` records whose result is at most `FINALS_MAX_RESULT` bytes, oldest out first.
        """
        if not record.state.is_final or (record.result is not None and len(record.result) > FINALS_MAX_RESULT):
            self._finals.pop(record.identity, None)
            return
        if record.identity not in self._finals and len(self._finals) >= FINALS_KEPT:
            del self._finals[next(iter(self._finals))]
        # The replay answer is kept with it: the same (immutable) outcome for every repeat.
        self._finals[record.identity] = (record, _replay(record))

    # -- the call ---------------------------------------------------------------------------------

    async def execute(
        self,
        *,
        tool: str,
        policy: ToolPolicy,
        arguments: Mapping[str, Any],
        meta: Mapping[str, Any] | None,
        run: Runner,
        encode: Encoder | None = None,
        principal: str = LOCAL_PRINCIPAL,
        canonical: bytes | None = None,
        fingerprint: str | None = None,
    ) -> CallOutcome:
        """Run one call of `tool` under `policy`, at most once per key.

        `canonical` is `keys.canonical_json(arguments)` and `fingerprint`
        `keys.policy_fingerprint(policy, arguments)` when the caller has them already.

        Raises `MissingKeyError`, `InvalidKeyError`, `KeyReuseError`, `InProgressError`,
        `InDoubtError` (the tool did not run) and `JournalError` (nothing was acknowledged).
        An unexpected exception from `run` releases the claim and propagates.
        """
        if not self._opened:
            await self.start()
        # Serialised and hashed once: the key (when derived), the fingerprint and the record.
        args_json = canonical if canonical is not None else keys.canonical_json(dict(arguments))
        if fingerprint is None:
            fingerprint = keys.policy_fingerprint(policy, arguments, canonical=args_json)
        key = keys.resolve_key(policy, tool, arguments, meta, canonical=args_json, fingerprint_hex=fingerprint)
        if key is None:
            # No key from any source on a tool not registered idempotent: nothing to deduplicate.
            outcome = await run(None)
            return CallOutcome(None, outcome.value, None, replayed=False, first_completed_at=None)
        identity = CallIdentity(principal, tool, key)
        known = self._finals.get(identity)
        if known is not None and not known[0].is_expired(self.clock()):
            if known[0].fingerprint != fingerprint:
                raise KeyReuseError(tool, key)
            return known[1]  # a final record seen before: it cannot have changed (`_remember`)
        deadline = anyio.current_time() + policy.wait
        # Read before claiming: a repeat (the common case for a retried call) is then answered by
        # one read, without building a claim or taking a backend's write lock (SQLite's BEGIN
        # IMMEDIATE, a Postgres row lock); a first call pays one read more. The claim below stays
        # the only arbiter: a record appearing between the read and the claim is returned by it.
        # Where a claim is itself a read that writes nothing on a repeat (`claim_reads`), the
        # read is folded into the claim: one round trip for a miss and for a repeat.
        record: CallRecord | None = None if self._claim_reads else await self.journal.get(identity)
        while True:
            now = self.clock()
            if record is None or record.is_expired(now):
                fresh = self._fresh(identity, fingerprint, args_json, policy, now)
                with anyio.CancelScope(shield=True):
                    # Shielded: a claim the caller abandons half-way would leave a PENDING record
                    # whose tool never ran, later mistaken for a crash in the danger window.
                    self._hold(identity)  # before the claim is sent: see `_running`
                    try:
                        with observe.span("durable.claim"):
                            won, record = await self.journal.claim(fresh, now)
                        if won:
                            await self.notify_changed(record)
                            return await self._run(record, policy, run)
                    finally:
                        self._unhold(identity)
            assert record is not None  # claimed above, or read and not expired
            if record.fingerprint != fingerprint:
                raise KeyReuseError(tool, key)
            decided = await self._decide(record, policy, run, encode, deadline)
            if decided is not None:
                return decided
            record = await self.journal.get(identity)

    def _fresh(
        self, identity: CallIdentity, fingerprint: str, args_json: bytes, policy: ToolPolicy, now: float,
        task_id: str | None = None,
    ) -> CallRecord:
        """A new PENDING record of this instance: what a claim inserts."""
        return CallRecord(
            identity=identity, fingerprint=fingerprint, state=CallState.PENDING, version=1,
            run_id=os.urandom(16).hex(), attempts=1, created_at=now, updated_at=now,
            owner=self.instance_id, lease_until=now + policy.lease, arguments=args_json, task_id=task_id,
        )

    async def _decide(
        self,
        record: CallRecord,
        policy: ToolPolicy,
        run: Runner,
        encode: Encoder | None,
        deadline: float,
    ) -> CallOutcome | None:
        """Act on an existing record; None means "re-read and decide again"."""
        now = self.clock()
        identity = record.identity
        if record.state.is_final:
            self._remember(record)
            return _replay(record)
        if record.state == CallState.PENDING:
            if self.owner_alive(record, now):
                remaining = deadline - anyio.current_time()
                if remaining <= 0:
                    lease_left = min(policy.lease, (record.lease_until or now) - now)
                    retry_after = self.run_times.retry_after(identity.tool, now - record.updated_at, lease_left)
                    raise InProgressError(identity.tool, identity.key, retry_after)
                # Latch on: sleep until the record changes (or a lease check is due), re-read.
                lease_left = max(0.01, (record.lease_until or now) - now)
                observe.waited()
                await self.journal.wait_for_change(identity, min(remaining, lease_left))
                return None  # re-read and decide again
            doubted = record.evolve(state=CallState.IN_DOUBT, owner=None, lease_until=None, updated_at=now)
            if await self.journal.swap(record.version, doubted):
                await self.notify_changed(doubted)
            return None
        if record.state == CallState.RELEASED:
            if is_operator_cancelled(record):
                raise CallCancelledError(identity.tool, identity.key)  # never resumed
            return await self._take_over(record, policy, run)
        # IN_DOUBT
        if record.attempts >= policy.max_attempts:
            # Parked: no policy runs it again; only an operator's `resolve` moves it on. The
            # reason is written once, so operators see why in listings.
            reason = f"parked after {record.attempts} attempt(s): an operator must resolve it"
            if record.error != reason:
                await self._swap(record, record.evolve(error=reason, updated_at=now))
            raise InDoubtError(identity.tool, identity.key, record.attempts, reason)
        mode = policy.in_doubt_policy
        if mode == "refuse":
            raise InDoubtError(identity.tool, identity.key, record.attempts)
        if mode == "reconcile":
            return await self._reconcile(record, policy, run, encode)
        return await self._take_over(record, policy, run)

    def owner_alive(self, record: CallRecord, now: float) -> bool:
        """Whether the owner of a PENDING record may still be running its tool."""
        if record.owner == self.instance_id:
            # Ours: alive exactly while we are inside its call (a stalled heartbeat does not
            # make it dead): see `_running`.
            return record.identity in self._running
        lease_valid = record.lease_until is not None and record.lease_until > now
        if self.journal.single_writer:
            # One writer: a PENDING record of an owner not started in this process is a previous
            # boot's orphan, whatever its lease says.
            return lease_valid and record.owner in _live_owners(self.journal)
        return lease_valid

    def _hold(self, identity: CallIdentity) -> None:
        self._running[identity] = self._running.get(identity, 0) + 1

    def _unhold(self, identity: CallIdentity) -> None:
        left = self._running.pop(identity) - 1
        if left:
            self._running[identity] = left

    async def _swap(self, record: CallRecord, new: CallRecord) -> bool:
        if await self.journal.swap(record.version, new):
            await self.notify_changed(new)
            return True
        return False

    async def _take_over(self, record: CallRecord, policy: ToolPolicy, run: Runner) -> CallOutcome | None:
        """Claim an in-doubt or released record for this instance and run it (same key, same run)."""
        now = self.clock()
        # expires_at cleared: a released record's retention must not let a fresh claim replace
        # the run now in progress.
        # A released task is over (cancelled or failed, and must stay so): the run that takes its
        # record over is a plain call, no longer that task.
        task_id = None if record.state == CallState.RELEASED else record.task_id
        claimed = record.evolve(
            state=CallState.PENDING, owner=self.instance_id, lease_until=now + policy.lease,
            attempts=record.attempts + 1, updated_at=now, expires_at=None, task_id=task_id,
        )
        with anyio.CancelScope(shield=True):
            self._hold(record.identity)  # before the swap is sent: see `_running`
            try:
                with observe.span("durable.claim", take_over=True):
                    taken = await self.journal.swap(record.version, claimed)
                if not taken:
                    return None
                await self.notify_changed(claimed)
                return await self._run(claimed, policy, run)
            finally:
                self._unhold(record.identity)
        return None  # not reached: nothing cancels this shielded scope (mypy cannot know)

    async def reconcile_unattended(self, record: CallRecord, policy: ToolPolicy, encode: Encoder) -> CallRecord | None:
        """Reconcile an in-doubt record with no caller waiting (background recovery, `recovery.py`).

        The hook's answer completes the record, as for a call; NOT_APPLIED releases it instead of
        running the tool (there is nobody to answer, and the next call with the key runs it).
        Returns the record as it is afterwards (None if it vanished); raises `InDoubtError` when
        the hook could not tell (the record stays in doubt, with the reason in `error`).
        """
        await self._reconcile(record, policy, None, encode)
        return await self.journal.get(record.identity)

    async def _reconcile(
        self, record: CallRecord, policy: ToolPolicy, run: Runner | None, encode: Encoder | None
    ) -> CallOutcome | None:
        """Ask the downstream system whether the in-doubt effect happened, then complete or run
        (or, with no `run`, release it for the next call)."""
        assert policy.reconcile is not None and encode is not None
        now = self.clock()
        identity = record.identity
        # Own the record first, so only one process reconciles (and maybe runs) it.
        claimed = record.evolve(state=CallState.PENDING, owner=self.instance_id, lease_until=now + policy.lease,
                                updated_at=now, expires_at=None)
        with anyio.CancelScope(shield=True):
            self._hold(identity)  # before the swap is sent, until the outcome lands: see `_running`
            try:
                return await self._reconcile_owned(record, claimed, policy, run, encode)
            finally:
                self._unhold(identity)
        return None  # not reached: nothing cancels this shielded scope (mypy cannot know)

    async def _reconcile_owned(
        self, record: CallRecord, claimed: CallRecord, policy: ToolPolicy, run: Runner | None, encode: Encoder
    ) -> CallOutcome | None:
        """`_reconcile` once this instance holds the identity: own it, ask the hook, complete or run."""
        assert policy.reconcile is not None
        identity = record.identity
        if not await self._swap(record, claimed):
            return None
        arguments = orjson.loads(record.arguments) if record.arguments else {}
        # The hook sees the in-doubt call as `current_call()`, so it can look up exactly the
        # key the tool passed downstream (`scoped_key`, `step_key`).
        token = bind(DurableCall(identity, record.run_id, record.attempts, self.journal, self.clock, []))
        try:
            async with self._lease_kept(identity, policy):
                found = await policy.reconcile(identity.key, arguments)
        except Exception as exc:
            # The downstream system cannot answer: fall back to refuse (never guess).
            back = claimed.evolve(state=CallState.IN_DOUBT, owner=None, lease_until=None, updated_at=self.clock(),
                                  error=f"{RECONCILE_FAILED}: {type(exc).__name__}: {exc}"[:500])
            await self._swap(claimed, back)
            raise InDoubtError(identity.tool, identity.key, record.attempts,
                               f"the reconcile hook could not tell: {type(exc).__name__}: {exc}") from exc
        finally:
            unbind(token)
        if isinstance(found, NotApplied):
            if run is None:  # unattended: nobody to run it for; the next call with the key runs it
                await self._release(claimed, policy, "reconciled in the background: not applied")
                return None
            running = claimed.evolve(attempts=claimed.attempts + 1, updated_at=self.clock())
            if not await self._swap(claimed, running):
                return None
            return await self._run(running, policy, run)
        outcome = encode(found)
        done, ours = await self._persist(claimed, policy, outcome)
        if not ours:
            return _superseded(done)
        return CallOutcome(identity.key, outcome.value, outcome.payload, replayed=False,
                           first_completed_at=done.completed_at, reconciled=True,
                           attempt=done.attempts)

    async def _run(self, record: CallRecord, policy: ToolPolicy, run: Runner) -> CallOutcome:
        """Run the tool for a record this instance owns; persist before returning. Shielded by callers,
        who hold the identity (`_hold`) from before their claim was sent until this returns."""
        identity = record.identity
        call = DurableCall(identity, record.run_id, record.attempts, self.journal, self.clock,
                           await load_steps(self.journal, record.run_id) if record.attempts > 1 else [])
        token = bind(call)
        failure: BaseException | None = None
        began = self.clock()
        outcome: ToolOutcome | None = None
        try:
            async with self._lease_kept(identity, policy):
                try:
                    # Every run can be stopped: a task by `tasks/cancel`, any call by an operator's cancel.
                    outcome = await self._run_cancellable(identity, run, call)
                except BaseException as exc:  # noqa: BLE001 - re-raised below, unwrapped from the task group
                    failure = exc
        finally:
            unbind(token)
        if failure is None and outcome is not None and outcome.final:
            self.run_times.record(identity.tool, self.clock() - began)
        if isinstance(failure, OutcomeUnknownError):
            # The effect may have happened (e.g. the upstream died mid-call): never release it
            # for a silent re-run; leave it IN_DOUBT so the in-doubt policy decides.
            await self._doubt(record, failure.reason)
            raise InDoubtError(identity.tool, identity.key, record.attempts, failure.reason) from failure
        if failure is not None or outcome is None:
            failure = failure or _cancelled(record)
            await self._release_after(record, policy, failure)
            if isinstance(failure.__cause__, DeterminismError) and not isinstance(failure, DurableError):
                raise failure.__cause__  # the face wrapped it; it is ours to report with its code
            raise failure
        if not outcome.final or (outcome.is_error and policy.tool_errors == "release"):
            reason = "interim result" if not outcome.final else "tool error (released by policy)"
            with anyio.CancelScope(shield=True):
                await self._release(record, policy, reason)
            return CallOutcome(identity.key, outcome.value, outcome.payload, replayed=False,
                               first_completed_at=None, attempt=record.attempts)
        done, ours = await self._persist(record, policy, outcome)
        if not ours:
            return _superseded(done)  # resolved or taken over meanwhile: the journal's answer stands
        return CallOutcome(identity.key, outcome.value, outcome.payload, replayed=False,
                           first_completed_at=done.completed_at, attempt=record.attempts)

    def _lease_kept(self, identity: CallIdentity, policy: ToolPolicy) -> AbstractAsyncContextManager[None]:
        kept: AbstractAsyncContextManager[None] = self.leases.kept(identity, policy)
        return kept

    async def _persist(
        self, record: CallRecord, policy: ToolPolicy, outcome: ToolOutcome
    ) -> tuple[CallRecord, bool]:
        """Persist the outcome of a run this instance owns; returns the final record and whether
        it is ours (False: an operator resolved the call meanwhile, and their result stands)."""
        now = self.clock()
        done = record.evolve(
            state=CallState.FAILED if outcome.is_error else CallState.COMPLETED,
            owner=None, lease_until=None, completed_at=now, updated_at=now, result=outcome.payload,
            expires_at=None if policy.retention is None else now + policy.retention,
        )
        with observe.span("durable.persist", state=done.state.value):
            persisted = await self.journal.swap(record.version, done)
        if not persisted:
            current = await self.journal.get(record.identity)
            if current is not None and current.state.is_final:
                return current, False  # someone resolved it meanwhile (an operator); theirs stands
            if current is not None and is_cancelled(current):
                # Cancelled while the tool finished: a cancelled task stays cancelled.
                raise _cancelled(record)
            # Our claim was taken over (our lease was lost) but the effect happened: record it,
            # as its owner, over whatever non-final state the record is in now.
            if current is None or not await self.journal.swap(current.version, _rebase(done, current)):
                raise InDoubtError(record.identity.tool, record.identity.key, record.attempts,
                                   "the call's claim was lost while it ran")
            done = _rebase(done, current)
        await self.notify_changed(done)
        return done, True

    async def _doubt(self, record: CallRecord, reason: str) -> None:
        now = self.clock()
        doubted = record.evolve(state=CallState.IN_DOUBT, owner=None, lease_until=None, updated_at=now,
                                error=reason[:500])
        with anyio.CancelScope(shield=True):
            try:
                if await self.journal.swap(record.version, doubted):
                    await self.notify_changed(doubted)
            except Exception:  # noqa: BLE001 - the record stays PENDING; its lease expires into doubt
                logger.warning("could not mark %s in doubt", record.identity, exc_info=True)

    async def _release_after(self, record: CallRecord, policy: ToolPolicy, exc: BaseException) -> None:
        if isinstance(exc, Exception) and policy.exceptions == "persist":
            return  # the face turns persisted exceptions into results before they reach here
        if record.task_id is not None and self._closing and not isinstance(exc, Exception):
            return  # a task stopped by the engine's close stays PENDING: the next start resumes it
        reason = f"{type(exc).__name__}: {exc}"[:500]
        with anyio.CancelScope(shield=True):
            try:
                await self._release(record, policy, reason)
            except Exception:  # noqa: BLE001 - keep the original exception; the lease will expire
                pass

    async def _release(self, record: CallRecord, policy: ToolPolicy, reason: str) -> None:
        now = self.clock()
        released = record.evolve(
            state=CallState.RELEASED, owner=None, lease_until=None, updated_at=now, error=reason,
            expires_at=None if policy.retention is None else now + policy.retention,
        )
        if await self.journal.swap(record.version, released):
            await self.notify_changed(released)
            return
        # A task id attached meanwhile (`submit`) bumped the version: release what is still ours.
        current = await self.journal.get(record.identity)
        if (current is not None and current.state == CallState.PENDING and current.owner == self.instance_id
                and current.run_id == record.run_id):
            rebased = _rebase(released, current)
            if await self.journal.swap(current.version, rebased):
                await self.notify_changed(rebased)


def _cancelled(record: CallRecord) -> DurableError:
    """The error a stopped run answers with: its task was cancelled, or an operator cancelled it."""
    if record.task_id is not None:
        return TaskCancelledError(record.identity.tool, record.identity.key)
    return CallCancelledError(record.identity.tool, record.identity.key)


def _live_owners(journal: Journal) -> set[str]:
    try:
        return _LIVE_OWNERS.setdefault(journal, set())
    except TypeError:  # a journal object that cannot be weakly referenced: no sharing known
        return set()


def _rebase(record: CallRecord, current: CallRecord) -> CallRecord:
    """`record`'s content as the successor of `current` (for a swap against `current`)."""
    # A task id attached meanwhile (`submit` on a call first made without a task) stays.
    return dataclasses.replace(record, version=current.version + 1, task_id=current.task_id or record.task_id)


def _superseded(record: CallRecord) -> CallOutcome:
    """The recorded outcome, for a run whose own outcome lost the record to another (see `CallOutcome`).

        owner A ── claims ── runs … paused past its lease …………………… finishes ── swap fails ─▶ superseded
        owner B ─────────────────── takes over ── runs ── records ──┘
    """
    logger.warning(
        "call %s/%s ran here but another outcome was recorded first (the lease was taken over or an "
        "operator resolved it); answering with the recorded one", record.identity.tool, record.identity.key,
    )
    return CallOutcome(record.identity.key, None, record.result, replayed=False,
                       first_completed_at=record.completed_at, attempt=record.attempts,
                       superseded=True)


def _replay(record: CallRecord) -> CallOutcome:
    return CallOutcome(record.identity.key, None, record.result, replayed=True,
                       first_completed_at=record.completed_at, attempt=record.attempts)
