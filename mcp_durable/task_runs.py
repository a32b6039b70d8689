"""MCP tasks in the engine: a task is a journaled call whose tool runs in the background.

`TaskRuns` is a part of `Engine` (its base class), kept in its own module: the engine's call
state machine (`engine.py`) is unchanged by tasks except that a task's run is cancellable.

- `submit` claims the call with a fresh task id and starts the run in the background (an
  asyncio task the engine owns until it closes); a key that has a record answers with its task
  (the same id), attaches a task to a plain call, or runs a released one again as a new task.
- `resume` drives an in-doubt task by its tool's policy; `resume_tasks` (at start), `nudge_task`
  (on a read of a task whose owner is gone) and the task watch of a shared journal call it
  through the face's `task_resumer`.
- `cancel_task` releases the record as cancelled and cancels the run here; an owner on another
  replica learns it when its lease renewal fails (`_lease_lost`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, Unpack

import anyio

from . import keys
from .engine_state import EngineState
from .errors import DurableError, KeyReuseError
from .journal.base import CallCursor, CallQuery
from .journal.model import CallIdentity, CallRecord, CallState
from .keys import LOCAL_PRINCIPAL
from .outcomes import CallArguments, CallOutcome, Encoder, Runner, ToolOutcome
from .policy import ToolPolicy
from .steps import DurableCall
from .tasks import CANCELLED_REASON, in_doubt_refused, is_cancelled, new_task_id

logger = logging.getLogger("mcp_durable.engine")


class TaskRuns(EngineState):
    """The task half of `Engine` (see the module docstring). Not used on its own."""

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run `work` in the background until it ends or the engine closes; failures are logged."""

        async def guarded() -> None:
            try:
                await work
            except DurableError as exc:  # an answer the task's record already shows (in doubt, cancelled)
                logger.debug("background task run ended: %s", exc)
            except Exception:  # noqa: BLE001 - nobody awaits a background run: log it
                logger.exception("a background task run failed")

        task = asyncio.get_running_loop().create_task(guarded())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def resume_tasks(self) -> int:
        """Hand every in-doubt task to `task_resumer` (in the background); returns how many.

        Run at start, after the sweep: on a single-writer journal every task a previous boot was
        running is in doubt by then. Tasks whose policy refuses stay in doubt (status failed).
        """
        if self.task_resumer is None:
            return 0
        count = 0
        cursor: CallCursor | None = None
        while True:
            query = CallQuery(state=CallState.IN_DOUBT, tasks_only=True, limit=500, cursor=cursor)
            page = await self.journal.list_calls(query)
            if not page:
                return count
            cursor = CallCursor.after(page[-1])
            for record in page:
                self.spawn(self.task_resumer(record))
                count += 1

    async def _watch_tasks(self) -> None:
        """On a journal shared by replicas: resume the tasks whose owner died, without waiting for
        a client to ask about them (a dead owner's task is found once its lease has run out)."""
        while True:
            await anyio.sleep(self.task_watch_interval)
            try:
                for state in (CallState.PENDING, CallState.IN_DOUBT):
                    for record in await self.journal.list_calls(CallQuery(state=state, tasks_only=True, limit=500)):
                        self.nudge_task(record, self.task_policy(record.identity.tool))
            except DurableError as exc:  # the journal is down: look again next time
                logger.debug("task watch: %s", exc)

    def nudge_task(self, record: CallRecord, policy: ToolPolicy | None) -> None:
        """Resume a task in the background if its owner is gone (on a read of it by any replica)."""
        if self.task_resumer is None or policy is None or record.state.is_final or record.state == CallState.RELEASED:
            return
        if record.state == CallState.PENDING and self.owner_alive(record, self.clock()):
            return
        if in_doubt_refused(record, policy):
            return
        self.spawn(self.task_resumer(record))

    async def submit(self, **call: Unpack[CallArguments]) -> CallRecord:
        """Create (or find) the task for one call (the keywords of `Engine.execute`) and return its
        record at once; the tool runs in the background, once per key.

        A call whose key has a record already answers with that record's task: the same task id
        for a repeat of a task-creating call, a new id attached to a call first made without a
        task. A record released without a result (the tool raised) is run again as a new task;
        a cancelled one stays cancelled. A call with no key at all (a tool not registered
        idempotent, no caller key) gets a fresh random key: every such task is its own call.

        Raises `MissingKeyError`, `InvalidKeyError`, `KeyReuseError`, `JournalError`.
        """
        if not self._opened:
            await self.start()
        tool, policy, arguments, meta, run = call["tool"], call["policy"], call["arguments"], call["meta"], call["run"]
        canonical = call.get("canonical")
        args_json = canonical if canonical is not None else keys.canonical_json(dict(arguments))
        # The same fingerprint as `Engine.execute`'s (the policy's fingerprinted arguments): a
        # task and a plain call of one key are one call.
        fingerprint = call.get("fingerprint") or keys.policy_fingerprint(policy, arguments, canonical=args_json)
        key = keys.resolve_key(policy, tool, arguments, meta, canonical=args_json, fingerprint_hex=fingerprint)
        if key is None:
            key = f"task:{new_task_id()}"
        identity = CallIdentity(call.get("principal", LOCAL_PRINCIPAL), tool, key)
        record: CallRecord | None = await self.journal.get(identity)
        while True:
            now = self.clock()
            if record is None or record.is_expired(now):
                fresh = self._fresh(identity, fingerprint, args_json, policy, now, task_id=new_task_id())
                started = await self._start_task_run(record, fresh, policy, run)
                if started is not None:
                    return started
                record = await self.journal.get(identity)
                continue
            if record.fingerprint != fingerprint:
                raise KeyReuseError(tool, key)
            if record.state == CallState.RELEASED and not is_cancelled(record):
                # Released without a result: its task (if any) is over; run it again as a new one.
                again = record.evolve(
                    state=CallState.PENDING, owner=self.instance_id, lease_until=now + policy.lease,
                    attempts=record.attempts + 1, updated_at=now, expires_at=None, error=None,
                    task_id=new_task_id(),
                )
                started = await self._start_task_run(record, again, policy, run)
                if started is not None:
                    return started
            elif record.task_id is None:
                # A call first made without a task (or still running as one): attach a task to it.
                attached = record.evolve(task_id=new_task_id(), updated_at=now)
                if await self._swap(record, attached):
                    self.nudge_task(attached, policy)
                    return attached
            else:
                self.nudge_task(record, policy)
                return record
            record = await self.journal.get(identity)

    async def _start_task_run(
        self, current: CallRecord | None, claimed: CallRecord, policy: ToolPolicy, run: Runner
    ) -> CallRecord | None:
        """Claim (`current` None or expired) or take over `current` as `claimed`, and start its run
        in the background. None if another process got there first (re-read and decide again)."""
        identity = claimed.identity
        self.owners.hold(identity)  # before the write is sent (live_owners.py); the run lets go
        try:
            with anyio.CancelScope(shield=True):
                if current is None or current.is_expired(claimed.created_at):
                    won, _ = await self.journal.claim(claimed, claimed.created_at)
                else:
                    won = await self.journal.swap(current.version, claimed)
        except BaseException:
            self.owners.unhold(identity)
            raise
        if not won:
            self.owners.unhold(identity)
            return None
        await self.notify_changed(claimed)

        async def run_then_let_go() -> None:
            try:
                await self._run(claimed, policy, run)
            finally:
                self.owners.unhold(identity)

        self.spawn(run_then_let_go())
        return claimed

    async def resume(
        self, identity: CallIdentity, policy: ToolPolicy, run: Runner, encode: Encoder | None = None
    ) -> CallOutcome | None:
        """Drive an existing task record on: its in-doubt policy applies (retry takes it over and
        runs it, durable steps replaying; reconcile asks the hook; refuse leaves it). Returns
        None without running when it is final, cancelled, released, or a live owner runs it."""
        if not self._opened:
            await self.start()
        record = await self.journal.get(identity)
        while record is not None:
            now = self.clock()
            if record.state.is_final or record.state == CallState.RELEASED or record.is_expired(now):
                return None
            if record.state == CallState.PENDING and self.owner_alive(record, now):
                return None
            decided = await self._decide(record, policy, run, encode, anyio.current_time())
            if decided is not None:
                return decided
            record = await self.journal.get(identity)
        return None

    async def task(self, principal: str, task_id: str) -> CallRecord | None:
        """The record of task `task_id` of `principal` (another principal's: None, like an unknown id)."""
        if not self._opened:
            await self.start()
        record = await self.journal.get_task(principal, task_id)
        if record is None or record.is_expired(self.clock()):
            return None
        return record

    async def cancel_task(
        self, principal: str, task_id: str, retention: float | None
    ) -> tuple[CallRecord | None, bool]:
        """Record `cancelled` for a task that is not terminal yet, and stop its tool if it runs here
        (an owner on another replica learns it when it next renews its lease). Returns the record
        and True after the change; the unchanged record and False for a terminal task (completed,
        failed or already cancelled); None and False for an unknown task."""
        while True:
            record = await self.task(principal, task_id)
            if record is None or record.state.is_final or record.state == CallState.RELEASED:
                return record, False
            now = self.clock()
            cancelled = record.evolve(
                state=CallState.RELEASED, owner=None, lease_until=None, updated_at=now, error=CANCELLED_REASON,
                expires_at=None if retention is None else now + retention,
            )
            if await self._swap(record, cancelled):
                scope = self._task_scopes.get(record.identity)
                if scope is not None:
                    scope.cancel()
                return cancelled, True

    def _lease_lost(self, identity: CallIdentity) -> None:
        """A renewal found the record no longer ours: if it is a task we run and it was cancelled, stop it."""
        if identity in self._task_scopes:
            self.spawn(self._stop_if_cancelled(identity))

    async def _stop_if_cancelled(self, identity: CallIdentity) -> None:
        record = await self.journal.get(identity)
        scope = self._task_scopes.get(identity)
        if scope is not None and (record is None or is_cancelled(record)):
            scope.cancel()

    async def _run_cancellable(self, identity: CallIdentity, run: Runner, call: DurableCall) -> ToolOutcome | None:
        """Run a task's tool inside a cancel scope `cancel_task` can cancel; None when it did."""
        with anyio.CancelScope() as scope:
            self._task_scopes[identity] = scope
            try:
                return await run(call)
            finally:
                if self._task_scopes.get(identity) is scope:
                    del self._task_scopes[identity]
        return None  # the scope was cancelled: the task was
