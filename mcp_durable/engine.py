"""The call state machine: claim, run, persist, replay, wait, in doubt. The one place that decides.

No `mcp` import: the MCP face hands the engine a validated call and a `run` callable, and turns
what comes back (a `CallOutcome`, or a `DurableError`) into protocol results. Backends only
store records and make `claim`/`swap` atomic; every decision about what a record means is here.

One call, start to end:

    resolve key ─▶ claim ──won──▶ run tool (shielded, lease renewed) ─▶ persist ─▶ acknowledge
                     │
                     └─lost─▶ existing record: what it means is `call_decisions.py`
                               other fingerprint        → key_reuse
                               COMPLETED / FAILED       → replay
                               PENDING, lease alive     → wait for it (latch on) … in_progress
                               PENDING, owner gone      → IN_DOUBT
                               IN_DOUBT                 → policy: retry | reconcile | refuse
                               RELEASED                 → take it over and run

Races are settled by `swap(expected_version, …)`: whoever loses a swap re-reads and decides
again, so two processes never both move one record forward. Operator actions (`resolve`,
`forget`, `cancel`, `rerun`) follow the same rule, in one loop here (`_act`) around the pure
verdicts of `operators.py`.

Owners and leases: a PENDING record names the instance running it and a lease that instance
renews every `lease / 3` while the tool (or a reconcile hook) runs. Whether its owner is alive
is `live_owners.py`; `start()` sweeps the records of dead owners to IN_DOUBT, so they show in
the in-doubt list at once (`engine_lifecycle.py`).

`Engine` is assembled from parts, each in its own module (see `engine_state.py`): this one is
the call itself and the operator actions; the lifecycle, the decisions on an existing record,
and MCP tasks are its base classes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio

from . import keys, observe, operators
from .call_decisions import FINALS_KEPT as FINALS_KEPT
from .call_decisions import FINALS_MAX_RESULT as FINALS_MAX_RESULT
from .call_decisions import CallDecisions, superseded
from .engine_lifecycle import Lifecycle
from .errors import (
    CallCancelledError,
    DeterminismError,
    DurableError,
    InDoubtError,
    KeyReuseError,
    OutcomeUnknownError,
    TaskCancelledError,
)
from .journal.base import Journal
from .journal.model import CallIdentity, CallRecord, CallState
from .journal.replay import ProcessJournal
from .keys import LOCAL_PRINCIPAL as LOCAL_PRINCIPAL  # where it has always been imported from
from .outcomes import CallOutcome as CallOutcome
from .outcomes import ChangeListener as ChangeListener
from .outcomes import Encoder as Encoder
from .outcomes import Runner as Runner
from .outcomes import TaskResumer as TaskResumer
from .outcomes import ToolOutcome as ToolOutcome
from .policy import DEFAULT_RETENTION, ToolPolicy
from .runtimes import RunTimes
from .steps import STEP_ENTRY, DurableCall, bind, load_steps, steps_process_id, unbind
from .task_runs import TaskRuns
from .tasks import is_cancelled

logger = logging.getLogger(__name__)


class Engine(Lifecycle, CallDecisions, TaskRuns):
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
        self.clock = clock
        self.instance_id = instance_id or f"{uuid.uuid4().hex[:12]}"
        self._use(journal)  # the journal, the owners' view and the lease keeper on it
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
        #: The process this engine journals its lifecycle as (`starting → running → stopping →
        #: stopped`); None journals nothing.
        self.process_id = process_id
        self.lifecycle: ProcessJournal | None = None
        #: The lifecycle state the previous boot left (e.g. `running`: it did not stop cleanly).
        self.previous_lifecycle_state: str | None = None
        self.started_at: float | None = None
        self.start_duration_s: float | None = None

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
        """Record an operator's verdict on an in-doubt (or released, or dead-owner pending) call.

        `resolution` is `"completed"` (the effect happened; `payload` is the result to replay),
        `"failed"` (replay `payload`, an error result, from now on) or `"not_applied"` (the
        effect did not happen: the next call with this key runs). Raises `OperatorError` when
        there is no such record, it is not in doubt, or the payload is missing or not JSON. A
        call still running (its owner alive) cannot be resolved. `by` names the operator in the
        audit entry.
        """
        verdict = operators.Resolve(resolution=resolution, payload=payload, retention=retention, note=note, by=by)
        return await self._act(identity, verdict)

    async def forget(self, identity: CallIdentity, *, by: str = "", note: str = "") -> CallRecord:
        """Forget an in-doubt (or released, or dead-owner pending) call: the key may run again.

        The record becomes RELEASED and expires now, so the next call with the key claims it as
        a new call (a new run, any arguments, no durable step replayed) and a purge drops it.
        Raises `OperatorError` like `resolve`.
        """
        return await self._act(identity, operators.Forget(note=note, by=by))

    async def cancel(
        self, identity: CallIdentity, *, by: str = "", note: str = "", retention: float | None = DEFAULT_RETENTION,
    ) -> CallRecord:
        """Cancel a running (or in-doubt) call: it is never resumed.

        The record becomes RELEASED with `error` "cancelled by an operator…" (`tasks.is_cancelled`).
        A run of it here stops at once; an owner elsewhere stops at its next lease renewal (the
        renewal finds the record no longer its own, reads why, and cancels the run) or its next
        durable step (which reads the record first). The caller is answered `cancelled`, and so
        is every repeat of the key until the record expires (`retention`) or is forgotten.
        Raises `OperatorError` for no such call, or one that is not running or in doubt.
        """
        cancelled = await self._act(identity, operators.Cancel(retention=retention, note=note, by=by))
        scope = self._task_scopes.get(identity)
        if scope is not None:
            scope.cancel()
        return cancelled

    async def rerun(
        self, identity: CallIdentity, *, from_step: int | None = None, by: str = "", note: str = "",
        retention: float | None = DEFAULT_RETENTION,
    ) -> CallRecord:
        """Re-run a completed or failed call under a new attempt, optionally from durable step `from_step`.

        The record becomes RELEASED under a new `run_id` (its result is dropped; the audit entry
        keeps what it was), so the next call with its key and arguments takes it over and runs
        the tool as attempt `attempts + 1`. `from_step=N` copies the first N journaled steps
        (indexes 0 … N-1) into the new run, so they are replayed and steps N and after run
        again; None runs every step again. Raises `OperatorError` for no such call, a call that
        is not completed or failed, or a `from_step` beyond the steps the call journaled.
        """
        return await self._act(identity, operators.Rerun(from_step=from_step, retention=retention, note=note, by=by))

    async def _act(self, identity: CallIdentity, verdict: operators.Verdict) -> CallRecord:
        """Apply an operator's verdict: read the record, judge it (`operators.judge`), swap the new
        one in, journal the audit entry (after the change itself is durable), tell the listeners.
        A lost swap means the record moved meanwhile (a retry took it over, another operator):
        re-read and judge again."""
        await self.start()
        while True:
            record = await self.journal.get(identity)
            now = self.clock()
            alive = record is not None and record.state == CallState.PENDING and self.owner_alive(record, now)
            after = operators.judge(record, identity, verdict, now, owner_alive=alive)
            assert record is not None  # judged: there is one
            if isinstance(verdict, operators.Rerun) and verdict.from_step is not None:
                steps = await load_steps(self.journal, record.run_id)
                for step in operators.steps_kept(record, verdict.from_step, steps):
                    await self.journal.append(steps_process_id(after.run_id), STEP_ENTRY, step.data, now)
            if await self.journal.swap(record.version, after):
                data = operators.audit_entry(record, after, verdict)
                await self.journal.append(operators.AUDIT_PROCESS, operators.AUDIT_ENTRY, data, after.updated_at)
                await self.notify_changed(after)
                return after

    async def purge_expired(self) -> int:
        """Drop records whose retention has ended; returns how many."""
        await self.start()
        return await self.journal.purge_expired(self.clock())

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

        The keywords are `outcomes.CallArguments` (what `submit` takes as `**call`), spelled out
        here because this is every call's path: no dict is built to pass them. `canonical` is
        `keys.canonical_json(arguments)` and `fingerprint` `keys.policy_fingerprint(policy,
        arguments)` when the caller has them already.

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
                with self.owners.holding(identity):  # shielded, held from before the claim is sent
                    with observe.span("durable.claim"):
                        won, record = await self.journal.claim(fresh, now)
                    if won:
                        await self.notify_changed(record)
                        return await self._run(record, policy, run)
            assert record is not None  # claimed above, or read and not expired
            if record.fingerprint != fingerprint:
                raise KeyReuseError(tool, key)
            decided = await self._decide(record, policy, run, encode, deadline)
            if decided is not None:
                return decided
            record = await self.journal.get(identity)

    async def _run(self, record: CallRecord, policy: ToolPolicy, run: Runner) -> CallOutcome:
        """Run the tool for a record this instance owns; persist before returning. Shielded by callers,
        who hold the identity (`LiveOwners.holding`) from before their claim was sent until this returns."""
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
            return superseded(done)  # resolved or taken over meanwhile: the journal's answer stands
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


def _rebase(record: CallRecord, current: CallRecord) -> CallRecord:
    """`record`'s content as the successor of `current` (for a swap against `current`)."""
    # A task id attached meanwhile (`submit` on a call first made without a task) stays.
    return dataclasses.replace(record, version=current.version + 1, task_id=current.task_id or record.task_id)
