"""The one runner: run a call this instance owns under its lease, then persist or release it, fenced.

Whoever wins a record (a claim, a take-over, a task's start, a reconcile that found nothing)
hands it to `Runner.run`, which:

1. binds the `DurableCall` the tool sees (`current_call()`), its durable steps fenced;
2. runs the tool in a cancel scope, under a lease hold (`leases.py`) that stops it when the
   lease is lost (taken over, or run out after a stall), the policy's `timeout` passes, or a
   cancel (an operator's, the task's requestor's) reaches this instance (`Run.stop`);
3. writes the outcome with a fenced swap: accepted only while the record is still PENDING under
   this run's fence (owner, run, attempt). A record still held whose version moved (a task id
   attached) is rebased and written; any other record means the run was fenced out, and
   nothing of it is written.

A run that was fenced out raises `Superseded`: its caller decides again as a repeat of the key
would (a final record answers it, marked `superseded`; a live one is waited for). A run that
timed out, or whose outcome is unknown, marks the call IN_DOUBT and raises `InDoubtError`. A
cancelled run raises the cancel (`cancelled`). Any other exception releases the record
(`Reason.EXCEPTION`) and propagates; nothing is ever left PENDING by a live owner.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import NoReturn, Protocol

import anyio

from .. import observe
from ..errors import (
    CallCancelledError,
    DeterminismError,
    DurableError,
    InDoubtError,
    OutcomeUnknownError,
    TaskCancelledError,
)
from ..journal.base import Journal
from ..journal.model import CallIdentity, CallRecord, Fence, Reason
from ..policy import ToolPolicy
from ..steps import DurableCall, bind, load_steps, unbind
from . import transitions
from .leases import LeaseKeeper
from .outcomes import CallOutcome, Runner, ToolOutcome
from .runtimes import RunTimes

logger = logging.getLogger("mcp_durable.engine")


class Superseded(Exception):  # noqa: N818 - a signal inside the engine, never raised to a caller
    """The run lost its record to another owner (or an operator): decide again, as a repeat would."""


class Run:
    """One run in progress here: its cancel scope and why it was stopped (None while it runs)."""

    __slots__ = ("scope", "call")

    def __init__(self, scope: anyio.CancelScope, call: DurableCall) -> None:
        self.scope = scope
        self.call = call

    @property
    def stopped(self) -> Reason | None:
        return self.call.stopped

    def stop(self, why: Reason) -> None:
        """Stop the run (once; the first reason stands): it begins no new step, its scope is cancelled."""
        if self.call.stopped is None:
            self.call.stopped = why
        self.scope.cancel()


class RunnerHost(Protocol):
    """What the runner sees of its engine (`Engine` is one)."""

    journal: Journal
    clock: Callable[[], float]
    leases: LeaseKeeper
    run_times: RunTimes
    #: The engine is closing: a task stopped by it stays PENDING, for the next start to resume.
    closing: bool

    async def notify_changed(self, record: CallRecord) -> None:
        """Tell the engine's listeners of a change; never raises."""
        ...


class CallRunner:
    """Runs owned records for one engine (see the module docstring)."""

    def __init__(self, engine: RunnerHost) -> None:
        self.engine = engine
        #: The runs in progress here, by identity: what `Engine.cancel` and `cancel_task` stop.
        self.runs: dict[CallIdentity, Run] = {}

    async def run(self, record: CallRecord, policy: ToolPolicy, run: Runner) -> CallOutcome:
        """Run the tool for `record`, a PENDING record this instance owns, and write its outcome.

        Callers hold the identity (`LiveOwners.holding`) from before their claim was sent until
        this returns, shielded. Raises `Superseded`, `InDoubtError`, the cancel, or the tool's
        exception (see the module docstring)."""
        engine = self.engine
        identity = record.identity
        fence = record.fence
        assert fence is not None
        steps = await load_steps(engine.journal, record.run_id) if record.attempts > 1 else []
        call = DurableCall(identity, record.run_id, record.attempts, engine.journal, engine.clock, steps, fence)
        failure: BaseException | None = None
        outcome: ToolOutcome | None = None
        began = engine.clock()
        token = bind(call)
        try:
            with anyio.CancelScope() as scope:
                active = Run(scope, call)
                self.runs[identity] = active
                try:
                    async with engine.leases.kept(identity, fence, policy, active.stop, record.lease_until or began):
                        outcome = await run(call)
                finally:
                    if self.runs.get(identity) is active:
                        del self.runs[identity]
        except BaseException as exc:  # noqa: BLE001 - answered below, re-raised where it is the answer
            failure = exc
        finally:
            unbind(token)
        stopped = call.stopped
        if stopped is not None and (outcome is None or failure is not None or outcome.is_error):
            # Stopped before it had a result of its own (an error result may be the stop itself,
            # turned into a result by the face). A result that came anyway is written, fenced.
            await self.stopped(record, fence, policy, stopped, failure)
        if outcome is None or failure is not None:
            await self._failed(record, fence, policy, failure)
        assert outcome is not None
        if outcome.final:
            engine.run_times.record(identity.tool, engine.clock() - began)
        released_error = outcome.is_error and not outcome.from_exception and policy.tool_errors == "release"
        if not outcome.final or released_error:
            reason = Reason.INTERIM if not outcome.final else Reason.TOOL_ERROR
            text = "interim result" if not outcome.final else "tool error (released by policy)"
            # A released error result is kept with the record (not as the key's outcome: the next
            # call runs again), so that a task of the call has its result (SEP-2663: `completed`,
            # `isError`); an interim answer is nobody's result.
            kept = outcome.payload if released_error else None
            with anyio.CancelScope(shield=True):
                await self.release(record, fence, policy, reason, text, kept)
            return CallOutcome(
                identity.key,
                outcome.value,
                outcome.payload,
                replayed=False,
                first_completed_at=None,
                attempt=record.attempts,
            )
        done = await self.persist(record, fence, policy, outcome)
        return CallOutcome(
            identity.key,
            outcome.value,
            outcome.payload,
            replayed=False,
            first_completed_at=done.completed_at,
            attempt=record.attempts,
        )

    async def stopped(
        self, record: CallRecord, fence: Fence, policy: ToolPolicy, why: Reason, failure: BaseException | None
    ) -> NoReturn:
        """Answer a run that was stopped (`Run.stop`): cancelled, timed out, or its record lost."""
        identity = record.identity
        if why is Reason.OPERATOR_CANCELLED:
            raise CallCancelledError(identity.tool, identity.key) from failure
        if why is Reason.REQUESTOR_CANCELLED:
            raise TaskCancelledError(identity.tool, identity.key) from failure
        if why is Reason.TIMED_OUT:
            text = f"the run passed its timeout of {policy.timeout} s and was stopped; its outcome is unknown"
            await self.doubt(record, fence, Reason.TIMED_OUT, text)
            raise InDoubtError(identity.tool, identity.key, record.attempts, text) from failure
        # The lease was lost: another owner has the record, or its lease ran out here (a stall, a
        # journal out of reach). Whatever the run did is not written; if the record is still
        # ours (nobody took it yet), its outcome is unknown.
        with anyio.CancelScope(shield=True):
            try:
                current = await self.engine.journal.get(identity)
            except DurableError:
                current = None
            if current is not None and current.cancelled:
                self._raise_cancelled(current)
            if current is not None and current.held_by(fence):
                await self.doubt(record, fence, Reason.LOST_OWNER, "the run's lease ran out before it finished")
        raise Superseded from failure

    async def _failed(
        self, record: CallRecord, fence: Fence, policy: ToolPolicy, failure: BaseException | None
    ) -> NoReturn:
        """A run that raised (or returned nothing): leave it in doubt if its outcome is unknown,
        else release it, then raise what the caller is answered with."""
        identity = record.identity
        if isinstance(failure, OutcomeUnknownError):
            # The effect may have happened (e.g. the upstream died mid-call): never release it
            # for a silent re-run; the in-doubt policy decides.
            await self.doubt(record, fence, Reason.OUTCOME_UNKNOWN, failure.reason)
            raise InDoubtError(identity.tool, identity.key, record.attempts, failure.reason) from failure
        if failure is None:
            failure = CallCancelledError(identity.tool, identity.key)
        if not (record.task_id is not None and self.engine.closing and not isinstance(failure, Exception)):
            # (A task stopped by the engine's close stays PENDING: the next start resumes it.)
            with anyio.CancelScope(shield=True):
                try:
                    await self.release(record, fence, policy, Reason.EXCEPTION, f"{type(failure).__name__}: {failure}")
                except Exception:  # noqa: BLE001 - keep the original exception; the lease will expire
                    logger.warning("could not release %s", identity, exc_info=True)
        if isinstance(failure.__cause__, DeterminismError) and not isinstance(failure, DurableError):
            raise failure.__cause__  # the face wrapped it; it is ours to report with its code
        raise failure

    def _raise_cancelled(self, record: CallRecord) -> NoReturn:
        identity = record.identity
        if record.reason is Reason.REQUESTOR_CANCELLED:
            raise TaskCancelledError(identity.tool, identity.key)
        raise CallCancelledError(identity.tool, identity.key)

    # -- fenced writes ---------------------------------------------------------------------------

    async def write(self, record: CallRecord, fence: Fence, new: CallRecord) -> CallRecord | None:
        """Swap `new` in for `record` while the record is still held under `fence`: the record as
        written, or None when the run was fenced out (nothing written). A version that moved
        while the record stayed ours (a task id attached) is rebased onto."""
        journal = self.engine.journal
        expected = record.version
        # The run id too: a later record of the key (after this one expired) may reach the same
        # version. A record still held under `fence` is of `fence.run_id`.
        while not await journal.swap(expected, new, fence.run_id):
            current = await journal.get(record.identity)
            if current is None or not current.held_by(fence):
                return None
            new = transitions.rebased(new, current)
            expected = current.version
        await self.engine.notify_changed(new)
        return new

    async def persist(self, record: CallRecord, fence: Fence, policy: ToolPolicy, outcome: ToolOutcome) -> CallRecord:
        """Persist the outcome of a run that holds `record`; the final record. Raises `Superseded`
        (or the cancel) when the run was fenced out: another outcome stands."""
        now = self.engine.clock()
        done = transitions.finished(record, outcome.payload, outcome.is_error, now, policy.retention)
        with observe.span("durable.persist", state=done.state.value):
            written = await self.write(record, fence, done)
        if written is None:
            current = await self.engine.journal.get(record.identity)
            if current is not None and current.cancelled:
                self._raise_cancelled(current)
            raise Superseded
        return written

    async def release(
        self,
        record: CallRecord,
        fence: Fence,
        policy: ToolPolicy,
        reason: Reason,
        text: str,
        result: bytes | None = None,
    ) -> bool:
        """Release a record the run holds (the next call with its key runs); False when fenced out.
        `result`: the error result released by policy (`Reason.TOOL_ERROR`), kept for the call's task."""
        now = self.engine.clock()
        expires = transitions.expiry(now, policy.retention)
        released = transitions.released(record, reason, now, expires, text, result)
        return await self.write(record, fence, released) is not None

    async def doubt(self, record: CallRecord, fence: Fence, reason: Reason, text: str) -> None:
        """Mark a record the run holds IN_DOUBT (its outcome unknown); nothing when fenced out. A
        journal error leaves it PENDING: its lease then runs out into doubt."""
        doubted = transitions.doubted(record, reason, self.engine.clock(), text)
        with anyio.CancelScope(shield=True):
            try:
                await self.write(record, fence, doubted)
            except Exception:  # noqa: BLE001 - the record stays PENDING; its lease expires into doubt
                logger.warning("could not mark %s in doubt", record.identity, exc_info=True)
