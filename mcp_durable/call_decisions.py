"""What an existing record means for a call with its key, and what the engine does about it.

`CallDecisions` is a part of `Engine` (engine_state.py). A call whose claim found a record
(or whose read did) comes here (`_decide`):

    COMPLETED / FAILED       → replay (and kept for the next repeat: `_remember`)
    PENDING, owner alive     → wait for it (latch on) … in_progress
    PENDING, owner gone      → IN_DOUBT, decide again
    RELEASED                 → take it over and run (an operator's cancel: cancelled)
    IN_DOUBT                 → parked after max_attempts; else policy: retry | reconcile | refuse

Policies for IN_DOUBT: `retry` takes it over (same key, same `run_id`, so completed durable
steps replay); `reconcile` takes it over, asks the hook, then completes it with the found
result or runs it — a hook that raises leaves it IN_DOUBT and the call is refused (`in_doubt`);
`refuse` answers `in_doubt`. After `max_attempts` the record is parked (refused whatever the
policy) until an operator's `resolve()`.
"""

from __future__ import annotations

import logging
import os

import anyio
import orjson

from . import observe
from .engine_state import EngineState
from .errors import CallCancelledError, InDoubtError, InProgressError
from .journal.model import CallIdentity, CallRecord, CallState
from .outcomes import CallOutcome, Encoder, Runner
from .policy import NotApplied, ToolPolicy
from .steps import DurableCall, bind, unbind
from .tasks import RECONCILE_FAILED, is_operator_cancelled

logger = logging.getLogger("mcp_durable.engine")

FINALS_KEPT = 4096  # final records an engine keeps for repeats
FINALS_MAX_RESULT = 16 * 1024  # larger results are read from the journal on every repeat


def replayed(record: CallRecord) -> CallOutcome:
    """The answer to a repeat of a final record's key: its stored result, marked replayed."""
    return CallOutcome(record.identity.key, None, record.result, replayed=True,
                       first_completed_at=record.completed_at, attempt=record.attempts)


def superseded(record: CallRecord) -> CallOutcome:
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


class CallDecisions(EngineState):
    """The decisions half of `Engine` (see the module docstring). Not used on its own."""

    def _remember(self, record: CallRecord) -> None:
        """Keep a final record for repeats; forget an identity whose record is not final.

        The engine's replay cache (`_finals`): identity → (final record, its replay answer).
        A COMPLETED or FAILED record never changes until it expires (only PENDING, IN_DOUBT and
        RELEASED records are ever resolved or taken over, and purges drop expired records only),
        so a copy of it answers a repeat exactly as a read would; `execute` checks its expiry
        and fingerprint before answering from it. Filled when a repeat reads a final record
        (not when a call completes: most are never repeated); an entry is dropped when its
        record changes to a non-final state here (`notify_changed`: an operator's re-run),
        when it is the oldest and the cache is full (at most `FINALS_KEPT` records whose result
        is at most `FINALS_MAX_RESULT` bytes), and all of them at `aclose`. Not to be confused
        with the MCP face's cache of built results (`server/results.py`, docs/architecture.md).
        """
        if not record.state.is_final or (record.result is not None and len(record.result) > FINALS_MAX_RESULT):
            self._finals.pop(record.identity, None)
            return
        if record.identity not in self._finals and len(self._finals) >= FINALS_KEPT:
            del self._finals[next(iter(self._finals))]
        # The replay answer is kept with it: the same (immutable) outcome for every repeat.
        self._finals[record.identity] = (record, replayed(record))

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
            return replayed(record)
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
            await self._swap(record, doubted)
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
        with self.owners.holding(record.identity):  # before the swap is sent, until the outcome lands
            with observe.span("durable.claim", take_over=True):
                taken = await self.journal.swap(record.version, claimed)
            if not taken:
                return None
            await self.notify_changed(claimed)
            return await self._run(claimed, policy, run)

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
        # Own the record first, so only one process reconciles (and maybe runs) it.
        claimed = record.evolve(state=CallState.PENDING, owner=self.instance_id, lease_until=now + policy.lease,
                                updated_at=now, expires_at=None)
        with self.owners.holding(record.identity):  # before the swap is sent, until the outcome lands
            return await self._reconcile_owned(record, claimed, policy, run, encode)

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
            return superseded(done)
        return CallOutcome(identity.key, outcome.value, outcome.payload, replayed=False,
                           first_completed_at=done.completed_at, reconciled=True,
                           attempt=done.attempts)
