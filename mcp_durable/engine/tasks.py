"""MCP tasks on the engine: a task is a journaled call whose tool runs in the background.

`TaskRuns` uses the engine (`engine.tasks`); the engine's call path knows nothing of tasks
beyond a record's `task_id`:

- `submit` decides on the key's record (`decide.submit_decision`): claims it with a fresh task
  id and starts the run in the background (an asyncio task the engine owns until it closes),
  answers with the key's task (the same id), attaches a task to a plain call, or runs a
  released one again as a new task (a cancelled one stays cancelled);
- `resume` drives an in-doubt task by its tool's policy; `resume_all` (at start), `nudge` (on a
  read of a task whose owner is gone) and the task watch of a shared journal call it through
  the face's `resumer`. Both passes read the open tasks only (the journal's index of PENDING
  and IN_DOUBT records), page after page (`each_call`), so a pass sees every one of them;
- `cancel_task` releases a task that is not terminal as cancelled by its requestor, and stops
  its run here; an owner on another replica is fenced out (its renewal fails, its next step
  is refused). A task whose status is terminal (completed, failed — in doubt under `refuse`,
  parked — or cancelled) is left as it is.
- `ask`, `questions`, `answer`: a task that asks its requestor (`input_required`). A question
  and its answer are process entries of the run's step process (`steps/<run_id>`, beside its
  durable steps, purged with them): `INPUT_REQUEST` `{key, request}` when the tool asks,
  `INPUT_RESPONSE` `{key, response}` when an answer arrives (the first one of a key counts).
  The n-th question of a run has key `input-<n>` on every attempt, so a run resumed after a
  restart replays the questions that were answered (the tool gets the journaled answer, nothing
  is asked twice) and asks the first one that was not again, under the key it had.
"""

from __future__ import annotations

import dataclasses
import logging
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Protocol, Unpack

import anyio

from .. import keys
from ..errors import DeterminismError, DurableError, KeyReuseError
from ..journal import callers
from ..journal.base import CallQuery, Journal, each_call, step_process_id
from ..journal.model import CallIdentity, CallRecord, CallState, JournalEntry, Reason
from ..keys import LOCAL_PRINCIPAL
from ..policy import ToolPolicy
from ..steps import DurableCall
from ..tasks import CANCELLED_REASON, in_doubt_refused, new_task_id, task_view
from . import transitions
from .decide import Decision, TaskDecision, decide, submit_decision
from .live_owners import LiveOwners
from .outcomes import CallArguments, CallOutcome, Encoder, Runner, TaskResumer
from .runner import CallRunner

logger = logging.getLogger("mcp_durable.engine")

#: Open tasks read per `list_calls` by the task watch and `resume_all` (`TaskRuns.page`).
TASK_PAGE = 500
#: Process-entry types of a task's questions to its requestor and of their answers (`TaskRuns.ask`).
INPUT_REQUEST = "input_request"
INPUT_RESPONSE = "input_response"


def input_key(n: int) -> str:
    """The key of a run's `n`-th question (from 0): the same on every attempt of the run."""
    return f"input-{n}"


def _inputs(entries: Iterable[JournalEntry]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(questions, answers) of a run's entries, by key: a key's latest question (a resumed run
    that asks it differently asks anew) and its first answer (a second answer is ignored)."""
    asked: dict[str, dict[str, Any]] = {}
    answered: dict[str, dict[str, Any]] = {}
    for entry in entries:
        key = entry.data.get("key")
        if not isinstance(key, str):
            continue
        if entry.entry_type == INPUT_REQUEST:
            asked[key] = entry.data["request"]
        elif entry.entry_type == INPUT_RESPONSE and key not in answered:
            answered[key] = entry.data["response"]
    return asked, answered


class TaskHost(Protocol):
    """What tasks use of their engine (`Engine` is one)."""

    journal: Journal
    clock: Callable[[], float]
    instance_id: str
    owners: LiveOwners
    runner: CallRunner
    opened: bool

    async def start(self) -> None:
        """Open the journal once (`Engine.start`)."""
        ...

    async def swap(self, record: CallRecord, new: CallRecord) -> bool:
        """Swap `new` in for `record` and tell the listeners; False if it moved meanwhile."""
        ...

    async def notify_changed(self, record: CallRecord) -> None:
        """Tell the listeners of a change; never raises."""
        ...

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run `work` in the background until it ends or the engine closes."""
        ...

    def owner_alive(self, record: CallRecord, now: float) -> bool:
        """Whether a PENDING record's owner may still be running it."""
        ...

    def stop_run(self, identity: CallIdentity, why: Reason) -> None:
        """Stop the run of `identity` in progress here, if any."""
        ...

    async def carry_out(
        self,
        decision: Decision,
        record: CallRecord,
        policy: ToolPolicy,
        run: Runner | None,
        encode: Encoder | None,
        deadline: float,
    ) -> CallOutcome | None:
        """Carry out the engine's `decision` on `record` (`Engine.carry_out`)."""
        ...


class TaskRuns:
    """The tasks of one engine (see the module docstring)."""

    def __init__(self, engine: TaskHost) -> None:
        self.engine = engine
        #: Runs an in-doubt task again (the face's, which knows its tool); None resumes nothing.
        self.resumer: TaskResumer | None = None
        #: A tool's policy by name (the face's), for the task watch of a shared journal.
        self.policy_of: Callable[[str], ToolPolicy | None] = lambda tool: None
        #: Seconds between looks for tasks whose owner died, on a journal shared by replicas.
        self.watch_interval = 1.0
        #: Records read per `list_calls` by a look (`watch_once`) and by `resume_all`.
        self.page = TASK_PAGE
        #: Seconds a question waits between reads of the journal for its answer: an answer given
        #: on this server wakes it at once, one given on another replica is read this late.
        self.input_poll = 1.0
        #: Questions each run has asked so far (their keys are numbered per run, `input_key`).
        self._asked: weakref.WeakKeyDictionary[DurableCall, int] = weakref.WeakKeyDictionary()
        #: The questions waiting here for their answer, by (run id, key): `answer` wakes them.
        self._waiting: dict[tuple[str, str], anyio.Event] = {}

    async def resume_all(self) -> int:
        """Hand every in-doubt task to `resumer` (in the background); returns how many.

        Run at start, after the sweep: on a single-writer journal every task a previous boot was
        running is in doubt by then. Tasks whose policy refuses stay in doubt (status failed).
        """
        if self.resumer is None:
            return 0
        count = 0
        query = CallQuery(state=CallState.IN_DOUBT, tasks_only=True, limit=self.page)
        async for record in each_call(self.engine.journal, query):
            self.engine.spawn(_logging_failure(record, self.resumer(record)))
            count += 1
        return count

    async def watch(self) -> None:
        """On a journal shared by replicas: resume the tasks whose owner died, without waiting for
        a client to ask about them (a dead owner's task is found once its lease has run out).
        One look (`watch_once`) every `watch_interval` seconds."""
        while True:
            await anyio.sleep(self.watch_interval)
            try:
                await self.watch_once()
            except DurableError as exc:  # the journal is down: look again next time
                logger.debug("task watch: %s", exc)

    async def watch_once(self) -> int:
        """One look of the task watch: every PENDING task, then every IN_DOUBT one, read `page` at
        a time through the journal's index of open records, is nudged (`nudge`: resumed in the
        background if its owner is gone and its policy runs it again). Returns how many tasks
        were looked at; with no open task, the journal reads no record."""
        looked = 0
        for state in (CallState.PENDING, CallState.IN_DOUBT):
            query = CallQuery(state=state, tasks_only=True, limit=self.page)
            async for record in each_call(self.engine.journal, query):
                self.nudge(record, self.policy_of(record.identity.tool))
                looked += 1
        return looked

    def nudge(self, record: CallRecord, policy: ToolPolicy | None) -> None:
        """Resume a task in the background if its owner is gone (on a read of it by any replica)."""
        if self.resumer is None or policy is None or record.state.is_final or record.state == CallState.RELEASED:
            return
        if record.state == CallState.PENDING and self.engine.owner_alive(record, self.engine.clock()):
            return
        if in_doubt_refused(record, policy):
            return
        self.engine.spawn(_logging_failure(record, self.resumer(record)))

    async def submit(self, **call: Unpack[CallArguments]) -> CallRecord:
        """Create (or find) the task for one call (the keywords of `Engine.execute`) and return its
        record at once; the tool runs in the background, once per key.

        A call whose key has a record already answers with that record's task: the same task id
        for a repeat of a task-creating call, a new id attached to a call first made without a
        task. A record released without a result (the tool raised) is run again as a new task;
        a cancelled one stays cancelled. A call with no key at all (no caller key, no key argument,
        fields or function, and not `key="derived"`) gets a fresh random key: every such task is
        its own call.

        Raises `MissingKeyError`, `InvalidKeyError`, `KeyReuseError`, `JournalError`.
        """
        engine = self.engine
        if not engine.opened:
            await engine.start()
        tool, policy, arguments, meta, run = call["tool"], call["policy"], call["arguments"], call["meta"], call["run"]
        canonical = call.get("canonical")
        args_json = canonical if canonical is not None else keys.canonical_json(dict(arguments))
        # The same fingerprint as `Engine.execute`'s: a task and a plain call of one key are one call.
        fingerprint = call.get("fingerprint") or keys.policy_fingerprint(policy, arguments, canonical=args_json)
        key = keys.resolve_key(policy, tool, arguments, meta, canonical=args_json, fingerprint_hex=fingerprint)
        if key is None:
            key = f"task:{new_task_id()}"
        identity = CallIdentity(call.get("principal", LOCAL_PRINCIPAL), tool, key)
        record: CallRecord | None = await engine.journal.get(identity)
        while True:
            now = engine.clock()
            decision = submit_decision(record, fingerprint, now)
            if decision is TaskDecision.KEY_REUSE:
                raise KeyReuseError(tool, key)
            if decision is TaskDecision.CLAIM:
                fresh = transitions.claimed(
                    identity, fingerprint, args_json, engine.instance_id, now, policy.lease, task_id=new_task_id()
                )
                started = await self._start(record, fresh, policy, run)
                if started is not None:
                    return started
            elif decision is TaskDecision.RESTART:
                assert record is not None
                again = transitions.taken_over(record, engine.instance_id, now, policy.lease, task_id=new_task_id())
                started = await self._start(record, dataclasses.replace(again, error=None), policy, run)
                if started is not None:
                    return started
            elif decision is TaskDecision.ATTACH:
                assert record is not None
                attached = record.evolve(task_id=new_task_id(), updated_at=now)
                if await engine.swap(record, attached):
                    self.nudge(attached, policy)
                    return attached
            else:
                assert record is not None
                self.nudge(record, policy)
                return record
            record = await engine.journal.get(identity)

    async def _start(
        self, current: CallRecord | None, claimed: CallRecord, policy: ToolPolicy, run: Runner
    ) -> CallRecord | None:
        """Claim (`current` None or expired) or take over `current` as `claimed`, and start its run
        in the background. None if another process got there first (re-read and decide again)."""
        engine = self.engine
        identity = claimed.identity
        engine.owners.hold(identity)  # before the write is sent (live_owners.py); the run lets go
        try:
            with anyio.CancelScope(shield=True):
                if current is None or current.is_expired(claimed.created_at):
                    won, _ = await engine.journal.claim(claimed, claimed.created_at)
                else:
                    won = await engine.journal.swap(current.version, claimed, current.run_id)
        except BaseException:
            engine.owners.unhold(identity)
            raise
        if not won:
            engine.owners.unhold(identity)
            return None
        await engine.notify_changed(claimed)

        async def run_then_let_go() -> None:
            try:
                await engine.runner.run(claimed, policy, run)
            finally:
                engine.owners.unhold(identity)

        engine.spawn(_logging_failure(claimed, run_then_let_go()))
        callers.handed_off()  # the run's task is inside the call now, and leaves it; this one is not
        return claimed

    async def resume(
        self, identity: CallIdentity, policy: ToolPolicy, run: Runner, encode: Encoder | None = None
    ) -> CallOutcome | None:
        """Drive an existing task record on: its in-doubt policy applies (retry takes it over and
        runs it, durable steps replaying; reconcile asks the hook; refuse leaves it). Returns
        None without running when it is final, cancelled, released, or a live owner runs it."""
        engine = self.engine
        if not engine.opened:
            await engine.start()
        record = await engine.journal.get(identity)
        while record is not None:
            now = engine.clock()
            if record.state.is_final or record.state == CallState.RELEASED or record.is_expired(now):
                return None
            if record.state == CallState.PENDING and engine.owner_alive(record, now):
                return None
            # The record's own fingerprint: a resumed task is never a key reuse of itself.
            decision = decide(record, record.fingerprint, policy, now, engine.owners.alive)
            decided = await engine.carry_out(decision, record, policy, run, encode, anyio.current_time())
            if decided is not None:
                return decided
            record = await engine.journal.get(identity)
        return None

    async def task(self, principal: str, task_id: str) -> CallRecord | None:
        """The record of task `task_id` of `principal` (another principal's: None, like an unknown id)."""
        engine = self.engine
        if not engine.opened:
            await engine.start()
        record = await engine.journal.get_task(principal, task_id)
        if record is None or record.is_expired(engine.clock()):
            return None
        return record

    async def cancel_task(
        self, principal: str, task_id: str, retention: float | None
    ) -> tuple[CallRecord | None, bool]:
        """Record `cancelled` for a task that is not terminal yet, and stop its tool if it runs here
        (an owner on another replica is fenced out). Returns the record and True after the
        change; the unchanged record and False for a terminal task (completed, failed — in
        doubt under `refuse`, parked, its hook failed — or cancelled); None and False for an
        unknown task."""
        engine = self.engine
        while True:
            record = await self.task(principal, task_id)
            if record is None or task_view(record, self.policy_of(record.identity.tool)).terminal:
                return record, False
            now = engine.clock()
            cancelled = transitions.released(
                record, Reason.REQUESTOR_CANCELLED, now, transitions.expiry(now, retention), CANCELLED_REASON
            )
            if await engine.swap(record, cancelled):
                engine.stop_run(record.identity, Reason.REQUESTOR_CANCELLED)
                return cancelled, True

    # -- a task that asks its requestor (input_required) -----------------------------------------

    async def ask(self, call: DurableCall, request: Mapping[str, Any]) -> dict[str, Any]:
        """Ask the task's requestor `request` (`{"method", "params"}`: an `elicitation/create`,
        `sampling/createMessage` or `roots/list` request) and return its answer (the result's
        JSON), waiting for it as long as the run lasts.

        The question is journaled before anyone can see it, the answer when it arrives
        (`answer`); a run that asks a question answered on an earlier attempt gets that answer at
        once. A question asked again differently after it was answered raises
        `DeterminismError`, as a step does. Raises `FencedOutError` (or a cancel's error) when
        the run no longer holds its record: a stale owner asks nothing.
        """
        n = self._asked.get(call, 0)
        self._asked[call] = n + 1
        key = input_key(n)
        journal = self.engine.journal
        process = step_process_id(call.run_id)
        entries = await journal.entries(process_id=process)
        asked, answered = _inputs(entries)
        wanted = dict(request)
        if key in answered:
            if asked.get(key) != wanted:
                raise DeterminismError(n, str(asked.get(key, {}).get("method")), str(wanted.get("method")))
            return answered[key]
        if asked.get(key) != wanted:
            await call._check_still_owned()  # the owner's fence, as a step checks it
            await journal.append(process, INPUT_REQUEST, {"key": key, "request": wanted}, self.engine.clock())
        seen = entries[-1].seq if entries else 0
        waiter = (call.run_id, key)
        try:
            while True:
                event = self._waiting.setdefault(waiter, anyio.Event())
                with anyio.move_on_after(self.input_poll):
                    await event.wait()
                if event.is_set():
                    self._waiting.pop(waiter, None)
                fresh = await journal.entries(process_id=process, after=seen)
                if fresh:
                    seen = fresh[-1].seq
                    _, answered = _inputs(fresh)
                    if key in answered:
                        return answered[key]
        finally:
            self._waiting.pop(waiter, None)

    async def questions(self, record: CallRecord) -> dict[str, dict[str, Any]]:
        """The questions of the task `record` still waiting for an answer, by key, in the order
        they were asked (`{"method", "params"}` each); empty for a task that is terminal."""
        if record.state.is_final or record.state == CallState.RELEASED:
            return {}
        entries = await self.engine.journal.entries(process_id=step_process_id(record.run_id))
        asked, answered = _inputs(entries)
        return {key: request for key, request in asked.items() if key not in answered}

    async def answer(self, record: CallRecord, responses: Mapping[str, dict[str, Any]]) -> list[str]:
        """Journal the answers among `responses` to questions of task `record` still waiting for
        one (others are ignored) and wake the run that waits for them here; returns their keys."""
        waiting = await self.questions(record)
        keys = [key for key in responses if key in waiting]
        process = step_process_id(record.run_id)
        for key in keys:
            await self.engine.journal.append(
                process, INPUT_RESPONSE, {"key": key, "response": responses[key]}, self.engine.clock()
            )
            event = self._waiting.get((record.run_id, key))
            if event is not None:
                event.set()
        return keys


async def _logging_failure(record: CallRecord, run: Awaitable[Any]) -> None:
    """Await a task's background `run`; a run that raised is logged in one line.

    A failed run is an answer, not a crash of the server: its task is `failed` and its record says
    why (the tool raised, deliberately — a protocol error — or not). The log gets one WARNING line
    per failed task (its tool, task id and the error's first line), the traceback only at DEBUG
    (`--log-level debug`): a client that makes failing tasks by design must not fill the log with them. A
    `DurableError` (in doubt, cancelled: what the record shows already) goes on to `spawn`."""
    try:
        await run
    except DurableError:
        raise
    except Exception as exc:  # noqa: BLE001 - nobody awaits a background run: its failure is logged here
        tool, task_id = record.identity.tool, record.task_id
        logger.warning("task %s of tool %r failed: %s", task_id, tool, _one_line(exc))
        logger.debug("task %s of tool %r failed: the traceback", task_id, tool, exc_info=exc)


def _one_line(exc: BaseException) -> str:
    """`Type: message` of `exc` (and of its direct cause, e.g. what an SDK wrapper wraps), on one
    line and bounded: a log line, not a report."""
    parts = [exc] if exc.__cause__ is None else [exc, exc.__cause__]
    text = " <- ".join(f"{type(e).__name__}: {e}".strip() for e in parts)
    line = " ".join(text.split())
    return line if len(line) <= 300 else line[:299] + "…"
