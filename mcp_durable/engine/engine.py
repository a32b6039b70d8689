"""`Engine`: one call from its key to its answer, and the operators' actions. The one place that decides.

No `mcp` import: the MCP face hands the engine a validated call and a `run` callable, and turns
what comes back (a `CallOutcome`, or a `DurableError`) into protocol results. Backends only
store records and make `claim`/`swap` atomic; what a record means is decided here, in four
small modules read in this order:

- `decide.py` — what a call does about the record its key has: a pure function returning one
  of a closed set of `Decision`s;
- `transitions.py` — every change of a record, one named pure function each;
- `runner.py` — the one runner: a record this instance owns runs under its lease, fenced, and
  its outcome is persisted or released;
- this module — `execute`: read (or claim), decide, carry the decision out, until there is an
  answer; and `_act`, the same loop for an operator's verdict (`operators.judge`).

One call:

    resolve key ─▶ read ─▶ decide ─┬─ CLAIM ─▶ claim ──won──▶ runner.run ─▶ answer
                     ▲             ├─ REPLAY ─▶ the stored result
                     │             ├─ TAKE_OVER / RECONCILE ─▶ swap ─▶ runner.run
                     │             ├─ KEY_REUSE / REFUSE_* / PARK ─▶ refusal
                     └── re-read ──┴─ WAIT / MARK_IN_DOUBT / a lost swap / a run fenced out

Races are settled by `swap(expected_version, …, expected_run_id)` and by the owner's fence:
every swap expects the version and the run id of the record it read (versions start again at 1
in a record that replaces an expired or purged one, so a version alone could match a later
record than the one read); whoever loses a swap re-reads and decides again, so two processes
never both move one record forward, and an owner that lost its record writes nothing more
(`runner.py`). The start-up sweep, the task watch and closing are `lifecycle.py`; MCP tasks use
the engine from `tasks.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Unpack

import anyio
import orjson

from .. import keys, observe
from ..errors import CallCancelledError, ConfigError, InDoubtError, InProgressError, KeyReuseError, TaskCancelledError
from ..journal.base import AUDIT_ENTRY, AUDIT_PROCESS, Journal, purge_all_expired
from ..journal.model import CallIdentity, CallRecord, CallState, Reason
from ..journal.processes import ProcessJournal
from ..keys import LOCAL_PRINCIPAL
from ..policy import DEFAULT_RETENTION, NotApplied, ToolPolicy
from ..steps import STEP_ENTRY, DurableCall, bind, load_steps, steps_process_id, unbind
from . import lifecycle, operators, transitions
from .decide import Decision, decide
from .leases import LeaseKeeper
from .live_owners import LiveOwners
from .outcomes import CallArguments, CallOutcome, ChangeListener, Encoder, Runner, TaskResumer
from .runner import CallRunner, Run, Superseded
from .runtimes import RunTimes
from .tasks import TaskRuns

logger = logging.getLogger("mcp_durable.engine")

FINALS_KEPT = 4096  # final records an engine keeps for repeats
FINALS_MAX_RESULT = 16 * 1024  # larger results are read from the journal on every repeat
_NOTHING = object()


def replayed(record: CallRecord) -> CallOutcome:
    """The answer to a repeat of a final record's key: its stored result, marked replayed."""
    return CallOutcome(
        record.identity.key,
        None,
        record.result,
        replayed=True,
        first_completed_at=record.completed_at,
        attempt=record.attempts,
    )


def superseded(record: CallRecord) -> CallOutcome:
    """The recorded outcome, for a call whose own run lost the record to another (see `CallOutcome`).

    owner A ── claims ── runs … stalled past its lease …………………… runs again ─▶ fenced out ─▶ superseded
    owner B ─────────────────── takes over ── runs ── records ──┘
    """
    logger.warning(
        "call %s/%s ran here but lost its record to another owner (its lease was taken over, or an "
        "operator acted); answering with the recorded outcome",
        record.identity.tool,
        record.identity.key,
    )
    return CallOutcome(
        record.identity.key,
        None,
        record.result,
        replayed=False,
        first_completed_at=record.completed_at,
        attempt=record.attempts,
        superseded=True,
    )


Finals = dict[CallIdentity, tuple[CallRecord, CallOutcome]]
#: The replay cache of each single-writer journal object, shared by the engines of this process
#: on it (as their live owners are, `live_owners.py`).
_FINALS: weakref.WeakKeyDictionary[Any, Finals] = weakref.WeakKeyDictionary()


def finals_of(journal: Journal) -> Finals | None:
    """The replay cache of `journal` (None where other processes write it: no cache)."""
    if not journal.single_writer:
        return None
    try:
        return _FINALS.setdefault(journal, {})
    except TypeError:  # a journal object that cannot be weakly referenced: a cache of its own
        return {}


def cancelled_error(record: CallRecord) -> CallCancelledError | TaskCancelledError:
    """The refusal of a cancelled record: the task's requestor's cancel, or an operator's."""
    identity = record.identity
    if record.reason is Reason.REQUESTOR_CANCELLED:
        return TaskCancelledError(identity.tool, identity.key)
    return CallCancelledError(identity.tool, identity.key)


class Engine:
    """Runs durable calls against one journal (and MCP tasks: `self.tasks`, engine/tasks.py).

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
        #: Hear of every record change (resources, notifications, telemetry): `notify_changed`.
        self.listeners: list[ChangeListener] = []
        #: What the face answers a replayed outcome with, made once per record kept in the replay
        #: cache (`CallOutcome.rendered`); None: nothing made (the face renders every answer).
        self.render_replay: Callable[[CallOutcome], Any] | None = None
        #: Recent run durations per tool: the `retry_after` of an `in_progress` refusal (runtimes.py).
        self.run_times = RunTimes()
        self.runner = CallRunner(self)
        self.tasks = TaskRuns(self)
        #: Background runs (tasks, resumptions): they outlive the request that made them, not the engine.
        self.background: set[asyncio.Task[None]] = set()
        self.closing = False
        self.opened = False
        self.open_lock = anyio.Lock()
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

    # -- the journal and the lifecycle (lifecycle.py) ---------------------------------------------

    def use_journal(self, journal: Journal) -> None:
        """Run on `journal` instead of the one given at construction; only before `start()`.

        Everything that reads or writes the journal (calls, lease renewal, the lifecycle, the
        single-writer owner set) goes to this one. Raises `ConfigError` once started."""
        if self.opened:
            raise ConfigError("the journal cannot be replaced once the engine has started")
        self._use(journal)

    def _use(self, journal: Journal) -> None:
        self.journal = journal
        #: Recently seen COMPLETED / FAILED records and their replay answers (`_remember`), shared
        #: by the engines of this process on `journal`; None on a journal other processes write.
        self._finals = finals_of(journal)
        #: On a journal other processes write: the replay answers made of the final records
        #: repeats read, each kept with the record it was made of and used only for a record
        #: read equal to it (`_remember`). Not a cache of reads: every repeat still reads.
        self._answers: Finals = {}
        #: Whose PENDING records are alive, this instance's running calls counted (live_owners.py).
        self.owners = LiveOwners(journal, self.instance_id)
        self.leases = LeaseKeeper(journal, self.instance_id, self.clock)
        #: The journal's claim answers a repeat as cheaply as a read (SQLite, Postgres): no read before it.
        self._claim_reads = bool(getattr(journal, "claim_reads", False))

    async def start(self) -> None:
        """Open the journal (once; safe to race) and mark calls orphaned by a previous boot in doubt."""
        if not self.opened:
            await lifecycle.start(self)

    async def aclose(self) -> None:
        """Stop the background runs, journal `stopping → stopped` and close the journal."""
        if self._finals is not None:
            self._finals.clear()
        self._answers.clear()
        await lifecycle.close(self)

    async def sweep(self) -> int:
        """Mark every PENDING call whose owner is gone IN_DOUBT; returns how many (`lifecycle.sweep`)."""
        return await lifecycle.sweep(self)

    def spawn(self, work: Awaitable[Any]) -> None:
        """Run `work` in the background until it ends or the engine closes; failures are logged."""
        lifecycle.spawn(self, work)

    # -- record changes ---------------------------------------------------------------------------

    def owner_alive(self, record: CallRecord, now: float) -> bool:
        """Whether the owner of a PENDING record may still be running its tool (`LiveOwners.alive`)."""
        return self.owners.alive(record, now)

    async def notify_changed(self, record: CallRecord) -> None:
        """Tell the listeners (resources, notifications) of a change. Never raises: a listener's
        failure must not fail, or leave half-done, the call whose record changed."""
        if not record.state.is_final and self._finals is not None:
            self._finals.pop(record.identity, None)
        # A final record is not kept here but when a repeat reads it (`_remember`): most calls
        # are never repeated, and keeping each one made the long-lived heap grow by a record
        # per call, which is what triggers the interpreter's full (whole-heap) collections.
        for listener in self.listeners:
            try:
                # A synchronous listener (ours are) costs no coroutine: two changes per call.
                pending = listener(record)
                if pending is not None:
                    await pending
            except Exception:  # noqa: BLE001 - best effort, logged
                logger.exception("a journal change listener failed")

    async def swap(self, record: CallRecord, new: CallRecord) -> bool:
        """Swap `record` for `new` and tell the listeners; False (nothing changed) if it moved meanwhile."""
        if await self.journal.swap(record.version, new, record.run_id):
            await self.notify_changed(new)
            return True
        return False

    def _remember(self, record: CallRecord) -> CallOutcome:
        """Keep a final record for repeats (the engine's replay cache, `_finals`).

        A COMPLETED or FAILED record changes only by an operator's re-run (to RELEASED) or its
        expiry (purges drop expired records only, and an owner's late write is fenced out), so
        a copy of it answers a repeat exactly as a read would — as long as every change of it
        is seen here. That holds on a single-writer journal: its one writer is this process, and
        every engine of the process on that journal object shares one cache, dropping an entry
        whenever it changes a record to a non-final state (`notify_changed`). On a journal other
        processes write (SQLite shared, Postgres), a replica cannot see another's re-run, so
        there is no cache and every repeat reads the journal (one claim that writes nothing,
        `claim_reads`); what is kept there (`_answers`) is only the answer made of a record, used
        again for a record read that is equal to it field by field (the same result, version,
        completion), so a re-run, a purge and a new claim of the key all miss it. `execute`
        checks the expiry and fingerprint of a cached record first.
        Filled when a repeat reads a final record (most calls are never repeated); bounded to
        `FINALS_KEPT` records whose result is at most `FINALS_MAX_RESULT` bytes, oldest out
        first. The face's answer is made once and kept with it (`render_replay`). Returns the
        replay answer of `record`.
        """
        finals = self._finals
        if finals is None:
            finals = self._answers
            known = finals.get(record.identity)
            if known is not None and known[0] == record:
                return known[1]  # the answer made of this very record
        outcome = replayed(record)
        if record.result is not None and len(record.result) > FINALS_MAX_RESULT:
            finals.pop(record.identity, None)
            return outcome
        if record.identity not in finals and len(finals) >= FINALS_KEPT:
            del finals[next(iter(finals))]
        if self.render_replay is not None:
            outcome = dataclasses.replace(outcome, rendered=self.render_replay(outcome))
        # The replay answer is kept with it: the same (immutable) outcome for every repeat.
        finals[record.identity] = (record, outcome)
        return outcome

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
        `InDoubtError` (the tool did not run, or its outcome is unknown), `CallCancelledError` /
        `TaskCancelledError` (cancelled: the tool does not run again) and `JournalError`
        (nothing was acknowledged). An unexpected exception from `run` releases the claim and
        propagates.
        """
        if not self.opened:
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
        known = None if self._finals is None else self._finals.get(identity)
        if known is not None and not known[0].is_expired(self.clock()):
            if known[0].fingerprint != fingerprint:
                raise KeyReuseError(tool, key)
            return known[1]  # a final record seen before: it cannot have changed (`_remember`)
        deadline = anyio.current_time() + policy.wait
        # Read before claiming: a repeat (the common case for a retried call) is then answered by
        # one read, without building a claim or taking a backend's write lock; a first call pays
        # one read more. The claim stays the only arbiter: a record appearing between the read
        # and the claim is returned by it. Where a claim is itself a read that writes nothing on
        # a repeat (`claim_reads`), the read is folded into the claim.
        record: CallRecord | None = None if self._claim_reads else await self.journal.get(identity)
        lost_own_run = False  # this call ran the tool and lost the record: its answer is `superseded`
        while True:
            now = self.clock()
            # (A first call of a `claim_reads` journal has read nothing: nothing to decide on.)
            decision = Decision.CLAIM if record is None else decide(record, fingerprint, policy, now, self.owners.alive)
            try:
                if decision is Decision.CLAIM:
                    fresh = transitions.claimed(identity, fingerprint, args_json, self.instance_id, now, policy.lease)
                    with self.owners.holding(identity):  # shielded, held from before the claim is sent
                        with observe.span("durable.claim"):
                            won, record = await self.journal.claim(fresh, now)
                        if won:
                            await self.notify_changed(record)
                            return await self.runner.run(record, policy, run)
                    continue  # lost: decide on the record the claim found
                assert record is not None
                answer = await self.carry_out(decision, record, policy, run, encode, deadline, lost_own_run)
            except Superseded:
                lost_own_run, answer = True, None
            if answer is not None:
                return answer
            record = await self.journal.get(identity)

    async def carry_out(
        self,
        decision: Decision,
        record: CallRecord,
        policy: ToolPolicy,
        run: Runner | None,
        encode: Encoder | None,
        deadline: float,
        lost_own_run: bool = False,
    ) -> CallOutcome | None:
        """Carry out `decision` (not CLAIM) on `record`; None means "re-read and decide again".
        `run` None (a task resumed with nobody to answer) never runs the tool for a reconcile."""
        identity = record.identity
        if decision is Decision.REPLAY:
            if lost_own_run:
                return superseded(record)
            return self._remember(record)
        if decision is Decision.WAIT:
            await self._wait(record, policy, deadline)
            return None
        if decision is Decision.MARK_IN_DOUBT:
            await self.swap(record, transitions.doubted(record, Reason.LOST_OWNER, self.clock()))
            return None
        if decision is Decision.TAKE_OVER:
            assert run is not None
            return await self._take_over(record, policy, run)
        if decision is Decision.RECONCILE:
            return await self._reconcile(record, policy, run, encode)
        if decision is Decision.KEY_REUSE:
            raise KeyReuseError(identity.tool, identity.key)
        if decision is Decision.REFUSE_CANCELLED:
            raise cancelled_error(record)
        if decision is Decision.PARK:
            # Parked: no policy runs it again; only an operator's `resolve` moves it on. The
            # reason is written once, so operators see why in listings.
            if record.reason is not Reason.PARKED:
                await self.swap(record, transitions.parked(record, self.clock()))
            raise InDoubtError(
                identity.tool,
                identity.key,
                record.attempts,
                f"parked after {record.attempts} attempt(s): an operator must resolve it",
            )
        assert decision is Decision.REFUSE_IN_DOUBT
        raise InDoubtError(identity.tool, identity.key, record.attempts)

    async def _wait(self, record: CallRecord, policy: ToolPolicy, deadline: float) -> None:
        """Latch on to a live owner's PENDING record: sleep until it changes (or a lease check is
        due); past the call's `wait`, refuse `in_progress` with a `retry_after`."""
        now = self.clock()
        remaining = deadline - anyio.current_time()
        if remaining <= 0:
            lease_left = min(policy.lease, (record.lease_until or now) - now)
            retry_after = self.run_times.retry_after(record.identity.tool, now - record.updated_at, lease_left)
            raise InProgressError(record.identity.tool, record.identity.key, retry_after)
        lease_left = max(0.01, (record.lease_until or now) - now)
        observe.waited()
        await self.journal.wait_for_change(record.identity, min(remaining, lease_left))

    async def _take_over(self, record: CallRecord, policy: ToolPolicy, run: Runner) -> CallOutcome | None:
        """Run a RELEASED or IN_DOUBT record here as its next attempt (same key, same run)."""
        # A released task is over (failed, and must stay so): the run that takes its record over
        # is a plain call, no longer that task.
        task_id = None if record.state is CallState.RELEASED else record.task_id
        claimed = transitions.taken_over(record, self.instance_id, self.clock(), policy.lease, task_id)
        with self.owners.holding(record.identity):  # before the swap is sent, until the outcome lands
            with observe.span("durable.claim", take_over=True):
                taken = await self.journal.swap(record.version, claimed, record.run_id)
            if not taken:
                return None
            await self.notify_changed(claimed)
            return await self.runner.run(claimed, policy, run)

    # -- reconcile ----------------------------------------------------------------------------------

    async def reconcile_unattended(self, record: CallRecord, policy: ToolPolicy, encode: Encoder) -> CallRecord | None:
        """Reconcile an in-doubt record with no caller waiting (background recovery, `recovery.py`).

        The hook's answer completes the record, as for a call; NOT_APPLIED releases it instead of
        running the tool (there is nobody to answer, and the next call with the key runs it).
        Returns the record as it is afterwards (None if it vanished); raises `InDoubtError` when
        the hook could not tell (the record stays in doubt, with the reason `hook_failed`).
        """
        try:
            await self._reconcile(record, policy, None, encode)
        except Superseded:
            pass  # another owner has it now
        return await self.journal.get(record.identity)

    async def _reconcile(
        self, record: CallRecord, policy: ToolPolicy, run: Runner | None, encode: Encoder | None
    ) -> CallOutcome | None:
        """Own an in-doubt record, ask its reconcile hook whether the effect happened, then
        complete it with the found result or run it (with no `run`: release it for the next call)."""
        assert policy.reconcile is not None and encode is not None
        owned = transitions.owned_to_reconcile(record, self.instance_id, self.clock(), policy.lease)
        with self.owners.holding(record.identity):  # before the swap is sent, until the outcome lands
            if not await self.swap(record, owned):
                return None
            found = await self._ask_hook(owned, policy)
            fence = owned.fence
            assert fence is not None
            if isinstance(found, NotApplied):
                if run is None:  # unattended: nobody to run it for; the next call with the key runs it
                    await self.runner.release(
                        owned, fence, policy, Reason.NOT_APPLIED, "reconciled in the background: not applied"
                    )
                    return None
                running = await self.runner.write(owned, fence, transitions.next_attempt(owned, self.clock()))
                if running is None:
                    raise Superseded
                return await self.runner.run(running, policy, run)
            outcome = encode(found)
            done = await self.runner.persist(owned, fence, policy, outcome)
            return CallOutcome(
                owned.identity.key,
                outcome.value,
                outcome.payload,
                replayed=False,
                first_completed_at=done.completed_at,
                reconciled=True,
                attempt=done.attempts,
            )

    async def _ask_hook(self, owned: CallRecord, policy: ToolPolicy) -> Any:
        """Run the reconcile hook of a record this instance owns, under its lease. A hook that
        raises puts the record back IN_DOUBT (`hook_failed`: never guess) and raises `InDoubtError`."""
        assert policy.reconcile is not None
        identity, fence = owned.identity, owned.fence
        assert fence is not None
        arguments = orjson.loads(owned.arguments) if owned.arguments else {}
        # The hook sees the in-doubt call as `current_call()`, so it can look up exactly the
        # key the tool passed downstream (`scoped_key`, `step_key`).
        call = DurableCall(identity, owned.run_id, owned.attempts, self.journal, self.clock, [])
        found: Any = _NOTHING
        token = bind(call)
        try:
            with anyio.CancelScope() as scope:
                stopper = Run(scope, call)
                async with self.leases.kept(identity, fence, policy, stopper.stop, owned.lease_until or 0.0):
                    found = await policy.reconcile(identity.key, arguments)
        except Exception as exc:
            if call.stopped is None:
                text = f"the reconcile hook could not tell: {type(exc).__name__}: {exc}"
                back = transitions.doubted(owned, Reason.HOOK_FAILED, self.clock(), f"reconcile failed: {text}")
                await self.runner.write(owned, fence, back)
                raise InDoubtError(identity.tool, identity.key, owned.attempts, text) from exc
        finally:
            unbind(token)
        if call.stopped is not None or found is _NOTHING:
            await self.runner.stopped(owned, fence, policy, call.stopped or Reason.LOST_OWNER, None)
        return found

    # -- tasks (tasks.py): the face's entry points ---------------------------------------------

    async def submit(self, **call: Unpack[CallArguments]) -> CallRecord:
        """Create (or find) the task for one call and return its record at once (`TaskRuns.submit`)."""
        return await self.tasks.submit(**call)

    async def resume(
        self, identity: CallIdentity, policy: ToolPolicy, run: Runner, encode: Encoder | None = None
    ) -> CallOutcome | None:
        """Drive an existing task record on by its in-doubt policy (`TaskRuns.resume`)."""
        return await self.tasks.resume(identity, policy, run, encode)

    async def task(self, principal: str, task_id: str) -> CallRecord | None:
        """The record of task `task_id` of `principal` (`TaskRuns.task`)."""
        return await self.tasks.task(principal, task_id)

    async def cancel_task(
        self, principal: str, task_id: str, retention: float | None
    ) -> tuple[CallRecord | None, bool]:
        """Cancel a task that is not terminal (`TaskRuns.cancel_task`)."""
        return await self.tasks.cancel_task(principal, task_id, retention)

    def nudge_task(self, record: CallRecord, policy: ToolPolicy | None) -> None:
        """Resume a task in the background if its owner is gone (`TaskRuns.nudge`)."""
        self.tasks.nudge(record, policy)

    @property
    def task_resumer(self) -> TaskResumer | None:
        """Runs an in-doubt task again (the face's, which knows its tool); None resumes nothing."""
        return self.tasks.resumer

    @task_resumer.setter
    def task_resumer(self, resumer: TaskResumer | None) -> None:
        self.tasks.resumer = resumer

    @property
    def task_policy(self) -> Callable[[str], ToolPolicy | None]:
        """A tool's policy by name (the face's), for the task watch of a shared journal."""
        return self.tasks.policy_of

    @task_policy.setter
    def task_policy(self, policy_of: Callable[[str], ToolPolicy | None]) -> None:
        self.tasks.policy_of = policy_of

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

        The record becomes RELEASED (`forgotten`) and expires now, so the next call with the key
        claims it as a new call (a new run, any arguments, no durable step replayed) and a purge
        drops it. Raises `OperatorError` like `resolve`.
        """
        return await self._act(identity, operators.Forget(note=note, by=by))

    async def cancel(
        self,
        identity: CallIdentity,
        *,
        by: str = "",
        note: str = "",
        retention: float | None = DEFAULT_RETENTION,
    ) -> CallRecord:
        """Cancel a running (or in-doubt) call: it is never resumed.

        The record becomes RELEASED (`operator_cancelled`). A run of it here stops at once; an
        owner elsewhere is fenced out: its next lease renewal fails and stops its run, and it
        begins no new durable step. The caller is answered `cancelled`, and so is every repeat
        of the key until the record expires (`retention`) or is forgotten. Raises
        `OperatorError` for no such call, or one that is not running or in doubt.
        """
        return await self._act(identity, operators.Cancel(retention=retention, note=note, by=by))

    async def rerun(
        self,
        identity: CallIdentity,
        *,
        from_step: int | None = None,
        by: str = "",
        note: str = "",
        retention: float | None = DEFAULT_RETENTION,
    ) -> CallRecord:
        """Re-run a completed or failed call under a new attempt, optionally from durable step `from_step`.

        The record becomes RELEASED (`rerun`) under a new `run_id` (its result is dropped; the
        audit entry keeps what it was), so the next call with its key and arguments takes it
        over and runs the tool as attempt `attempts + 1`. `from_step=N` copies the first N
        journaled steps (indexes 0 … N-1) into the new run, so they are replayed and steps N
        and after run again; None runs every step again. Raises `OperatorError` for no such
        call, a call that is not completed or failed, or a `from_step` beyond its steps.
        """
        return await self._act(identity, operators.Rerun(from_step=from_step, retention=retention, note=note, by=by))

    async def _act(self, identity: CallIdentity, verdict: operators.Verdict) -> CallRecord:
        """Apply an operator's verdict: read the record, judge it (`operators.judge`), swap the new
        one in, journal the audit entry (after the change itself is durable), tell the listeners,
        and stop a run of it here. A lost swap means the record moved meanwhile (a retry took it
        over, another operator): re-read and judge again."""
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
            if await self.journal.swap(record.version, after, record.run_id):
                data = operators.audit_entry(record, after, verdict)
                await self.journal.append(AUDIT_PROCESS, AUDIT_ENTRY, data, after.updated_at)
                await self.notify_changed(after)
                if after.cancelled:
                    self.stop_run(identity, after.reason or Reason.OPERATOR_CANCELLED)
                return after

    def stop_run(self, identity: CallIdentity, why: Reason) -> None:
        """Stop the run of `identity` in progress here, if any (a cancel reached this instance)."""
        running = self.runner.runs.get(identity)
        if running is not None:
            running.stop(why)

    async def purge_expired(self) -> int:
        """Drop records whose retention has ended, with the durable-step entries of their runs (a
        run of an expired record never resumes); returns how many records."""
        await self.start()
        purged, _ = await purge_all_expired(self.journal, self.clock())
        return purged
