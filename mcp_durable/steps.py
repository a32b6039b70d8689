"""What a running durable tool sees: its key, its attempt, and journaled steps.

Inside a durable tool, `current_call()` returns the `DurableCall` of the call being run (a
context variable the engine sets; it follows sync tools onto their worker thread):

    call = current_call()
    provider.refund(order_id, amount, idempotency_key=call.key)     # pass the key downstream
    label = await call.step("buy label", buy_label, order_id)        # journaled, run once

Steps are stored as process-journal entries of the process `steps/<run_id>`; a run keeps its
`run_id` across in-doubt retries, so a re-execution replays the steps that completed and
resumes at the first unfinished one.

A step is journaled after `fn` returns, so a crash between a step's side effect and its journal
entry runs that one step again on the retry (at least once per step, never from the start):
pass `call.step_key(name)` downstream so the system there deduplicates it. Steps of one call
run one after another (their position is their identity); do not run them concurrently.

Steps are fenced: before a step runs, the run checks that its record is still its own (the
owner's fence: owner, run, attempt), and the step is journaled with `Journal.append_step`,
accepted only while that holds and only once per (run, index). An owner that lost its record
(its lease ran out and another took over, or the call was cancelled) begins no new step: the
step raises instead, and the run ends. Only a stall inside a step's own effect is left to the
downstream key.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio.from_thread

from . import observe
from .errors import CallCancelledError, DeterminismError, FencedOutError, TaskCancelledError
from .journal.base import STEP, Journal, step_process_id
from .journal.model import CallIdentity, Fence, JournalEntry, Reason
from .keys import scoped_key, step_key

STEP_ENTRY = STEP

_current: ContextVar[DurableCall | None] = ContextVar("mcp_durable_current_call", default=None)


def current_call() -> DurableCall:
    """The durable call being run. Raises `LookupError` outside a durable tool."""
    call = _current.get()
    if call is None:
        raise LookupError("current_call() is only available inside a durable tool")
    return call


def current_key() -> str | None:
    """The key of the durable call being run, or None outside one (or for an unkeyed call)."""
    call = _current.get()
    return None if call is None else call.key


@dataclass(eq=False)
class DurableCall:
    """A running durable call: identity, key, attempt, and `step()` for durable steps.

    `_done` holds the steps the journal has for this run, replayed in order before any
    step runs again; `steps_replayed` and `steps_run` count what `step()` did."""

    identity: CallIdentity
    run_id: str
    attempt: int
    _journal: Journal = field(repr=False)
    _clock: Callable[[], float] = field(repr=False)
    _done: list[JournalEntry] = field(repr=False)
    #: The owner's fence on the record (None: a call whose steps are not fenced, e.g. a reconcile hook's).
    _fence: Fence | None = field(default=None, repr=False)
    #: Set by the engine when this run must stop (its lease lost, timed out, cancelled): no new step begins.
    stopped: Reason | None = field(default=None, init=False, repr=False)
    _next: int = field(default=0, init=False, repr=False)
    steps_replayed: int = field(default=0, init=False)
    steps_run: int = field(default=0, init=False)

    @property
    def key(self) -> str:
        """The idempotency key: pass it to downstream systems (an `Idempotency-Key` header)."""
        return self.identity.key

    @property
    def scoped_key(self) -> str:
        """The key scoped by principal, for a downstream system shared by several principals:
        `keys.scoped_key(principal, key)`, so two callers' keys never deduplicate into each other
        downstream (the bare key for `local`, `principal:key` otherwise; see there)."""
        return scoped_key(self.identity.principal, self.identity.key)

    def step_key(self, name: str) -> str:
        """A downstream idempotency key for one step of this call: `scoped_key/name`
        (`keys.step_key`: separators in the name encoded, hashed when over 255 characters).
        Stable across retries of the call."""
        return step_key(self.identity.principal, self.identity.key, name)

    @property
    def process_id(self) -> str:
        return steps_process_id(self.run_id)

    async def step(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once per run: a re-execution returns the journaled result.

        The result must be JSON-serialisable (it is journaled). A step whose name differs from
        the journal's step at the same position raises `DeterminismError`.
        """
        index = self._next
        self._next += 1
        if index < len(self._done):
            recorded = self._done[index].data
            if recorded["name"] != name:
                raise DeterminismError(index, recorded["name"], name)
            self.steps_replayed += 1
            with observe.span("durable.step", step=name, index=index, replayed=True):
                return recorded["result"]
        with observe.span("durable.step", step=name, index=index, replayed=False):
            await self._check_still_owned()
            result = fn(*args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            data = {"index": index, "name": name, "result": result}
            if self._fence is None:
                await self._journal.append(self.process_id, STEP_ENTRY, data, self._clock())
            elif await self._journal.append_step(self.identity, self._fence, index, data, self._clock()) is None:
                self._stop(Reason.LOST_OWNER)  # taken over (or cancelled) while the step ran: not ours
        self.steps_run += 1
        return result

    async def _check_still_owned(self) -> None:
        """Raise unless this run still holds its record: a run that lost it (its lease ran out and
        another owner took over, an operator or requestor cancelled it) begins no new step."""
        if self.stopped is None and self._fence is not None:
            record = await self._journal.get(self.identity)
            if record is None or not record.held_by(self._fence):
                self.stopped = record.reason if record is not None and record.cancelled else Reason.LOST_OWNER
        if self.stopped is not None:
            self._stop(self.stopped)

    def _stop(self, why: Reason) -> None:
        self.stopped = self.stopped or why
        if why is Reason.OPERATOR_CANCELLED:
            raise CallCancelledError(self.identity.tool, self.identity.key)
        if why is Reason.REQUESTOR_CANCELLED:
            raise TaskCancelledError(self.identity.tool, self.identity.key)
        raise FencedOutError(self.identity.tool, self.identity.key, why.value)

    def step_sync(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`step()` for a sync tool running on its worker thread."""
        return anyio.from_thread.run(lambda: self.step(name, fn, *args, **kwargs))


steps_process_id = step_process_id


async def load_steps(journal: Journal, run_id: str) -> list[JournalEntry]:
    """The completed steps of a run, in order."""
    entries = await journal.entries(process_id=steps_process_id(run_id))
    return [e for e in entries if e.entry_type == STEP_ENTRY]


def bind(call: DurableCall | None) -> Any:
    """Make `call` current; returns the token to pass to `unbind`."""
    return _current.set(call)


def unbind(token: Any) -> None:
    _current.reset(token)
